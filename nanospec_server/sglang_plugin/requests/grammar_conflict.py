"""A 400, not a 500, when a request's grammar ends before its own min_new_tokens.

With a grammar (`regex`, `json_schema`, `ebnf`) and `min_new_tokens` (`min_tokens` on the
OpenAI routes), the grammar can reach its end, where it allows only EOS, while
min_new_tokens still forbids EOS. Every token is then masked, the sampler picks one the
grammar refuses, and SGLang 0.5.23 aborts the request with a 500 "Grammar accept_token
failed" (found by the API fuzzer: `ebnf: root ::= "a" | "b"` with `min_tokens: 3`). The
request asked for the impossible, so its client gets a 400 that says which fields clash.

Why a refused token means exactly that while min_new_tokens is pending: any token the
grammar allows besides EOS keeps a finite logit and would be picked, so the sampler leaves
the grammar only when the grammar allows nothing but the EOS that min_new_tokens masks.
Aborts with any other cause keep SGLang's status.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from nanospec_server import seams


def _sampled(args: tuple, kwargs: dict) -> tuple[Any, list[int]]:
    """The request and the tokens of either grammar step's call."""
    req = kwargs["req"] if "req" in kwargs else args[0]
    tokens = kwargs.get("next_token_id", kwargs.get("tokens", args[1] if len(args) > 1 else []))
    return req, [tokens] if isinstance(tokens, int) else list(tokens)


def min_new_tokens_pending(req: Any, tokens: list[int]) -> bool:
    """Whether min_new_tokens still forbade EOS when the first of `tokens` was sampled.
    (`output_ids` may or may not hold `tokens` yet; counting them out errs towards
    "pending", which only matters for a request that has a min_new_tokens at all.)"""
    minimum = getattr(req.sampling_params, "min_new_tokens", 0) or 0
    return minimum > max(0, len(req.output_ids) - len(tokens))


def grammar_ends_early_message(minimum: int) -> str:
    return (
        f"min_new_tokens: the request's grammar ends before {minimum} tokens, so no "
        "token can follow (lower min_new_tokens / min_tokens or widen the grammar)"
    )


def grammar_conflict_hook(original, processor, *args, **kwargs):
    """AROUND hook on both grammar steps: re-file SGLang's 500 abort as the client's 400."""
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    req, tokens = _sampled(args, kwargs)
    before = req.to_finish
    result = original(processor, *args, **kwargs)
    abort = req.to_finish
    if (
        abort is not before
        and isinstance(abort, FINISH_ABORT)
        and abort.status_code == HTTPStatus.INTERNAL_SERVER_ERROR
        and min_new_tokens_pending(req, tokens)
    ):
        req.to_finish = FINISH_ABORT(
            grammar_ends_early_message(req.sampling_params.min_new_tokens),
            HTTPStatus.BAD_REQUEST,
            "BadRequestError",
        )
    return result


def register_hooks() -> None:
    # The two places SGLang advances a request's grammar over sampled tokens.
    for step in (seams.GRAMMAR_PREFILL, seams.GRAMMAR_ACCEPT):
        seams.hook(step, grammar_conflict_hook)
