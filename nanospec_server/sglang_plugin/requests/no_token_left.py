"""A request whose constraints leave no token to sample ends alone, with a message.

Grammar, `min_new_tokens` (which masks EOS and the stop ids), logit bias and penalties
can together mask every token of a row (`unsamplable_rows.py`). SGLang's torch sampler then
raises inside the scheduler and the whole server stops; greedy decoding picks a token the
grammar refuses. Here the step goes on instead: such rows get a harmless distribution
before anything samples them, and their requests finish with an abort that says why, so
the rest of the batch is untouched.

Where rows are sampled, and so guarded:

* `Sampler.forward`: plain decoding and every prefill. Its rows are the running batch's
  requests in order; the batch comes from the scheduler call around it (`run_batch`, or
  `launch_batch_sample_if_needed` for the delayed sampling of grammar batches).
* `eagle_sample`: EAGLE verify. Its rows are [request, draft node]; penalties, bias and the
  grammar mask are applied inside it, the grammar mask last, so the guard rides on that
  mask's `apply`. A request ends only when a row it accepted from was unsamplable: rows
  past a rejected draft token are never used.

Installed on CPU servers (`scheduler_hooks.py`), where SGLang samples with torch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from http import HTTPStatus
from typing import Any

import torch
from torch import Tensor

from nanospec_server import seams
from nanospec_server.sglang_plugin.requests.grammar_conflict import (
    grammar_ends_early_message,
    min_new_tokens_pending,
)
from nanospec_server.sglang_plugin.requests.unsamplable_rows import (
    make_samplable,
    unsamplable_rows,
)

logger = logging.getLogger(__name__)

GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf")

# The requests behind the rows the sampler is about to see, set around the scheduler calls
# that sample (the scheduler samples on one thread).
_sampled_reqs: list[Any] | None = None


def constraint_fields(params: Any) -> list[str]:
    """The request's sampling fields that remove or push down tokens."""
    fields = [name for name in GRAMMAR_FIELDS if getattr(params, name, None)]
    if getattr(params, "min_new_tokens", 0):
        fields.append("min_new_tokens")
    if getattr(params, "stop_token_ids", None):
        fields.append("stop_token_ids")
    if getattr(params, "logit_bias", None):
        fields.append("logit_bias")
    for name, neutral in (
        ("frequency_penalty", 0.0),
        ("presence_penalty", 0.0),
        ("repetition_penalty", 1.0),
    ):
        if getattr(params, name, neutral) != neutral:
            fields.append(name)
    return fields


def end_request(req: Any) -> None:
    """Finish `req` with an abort that says why no token could follow."""
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    if req.finished() or isinstance(req.to_finish, FINISH_ABORT):
        return
    params = req.sampling_params
    fields = constraint_fields(params)
    position = len(req.output_ids)
    if req.grammar is not None and min_new_tokens_pending(req, []):
        message = grammar_ends_early_message(params.min_new_tokens)
    elif fields:
        message = (
            f"sampling_params: no token is left to sample at output position {position}: "
            f"{', '.join(fields)} together mask every token"
        )
    else:
        req.to_finish = FINISH_ABORT(
            f"no token can be sampled at output position {position}: the model's logits "
            "are not finite",
            HTTPStatus.INTERNAL_SERVER_ERROR,
            "InternalServerError",
        )
        return
    req.to_finish = FINISH_ABORT(message, HTTPStatus.BAD_REQUEST, "BadRequestError")


def _end_requests(reqs: Sequence[Any], indices: list[int], where: str) -> None:
    for index in indices:
        logger.warning(
            "nanospec: %s: request %s has no token left to sample; ending it",
            where,
            reqs[index].rid,
        )
        end_request(reqs[index])


def _sampling_batch_hook(batch_arg: int, batch_kwarg: str) -> Callable:
    """AROUND hook on a scheduler call that samples: name its batch's requests."""

    def hook(original: Callable, scheduler: Any, *args: Any, **kwargs: Any) -> Any:
        global _sampled_reqs
        batch = kwargs.get(batch_kwarg, args[batch_arg] if len(args) > batch_arg else None)
        outer, _sampled_reqs = _sampled_reqs, getattr(batch, "reqs", None)
        try:
            return original(scheduler, *args, **kwargs)
        finally:
            _sampled_reqs = outer

    return hook


def sampler_forward_hook(
    original: Callable, sampler: Any, logits_output: Any, sampling_info: Any, *args, **kwargs
) -> Tensor:
    """AROUND hook on `Sampler.forward`: unsamplable rows sample safely, their requests end."""
    logits = getattr(logits_output, "next_token_logits", None)
    if logits is not None and logits.dim() == 2 and logits.shape[0] > 0:
        temperatures = None if sampling_info.is_all_greedy else sampling_info.temperatures
        bad = unsamplable_rows(logits, temperatures)
        if bool(bad.any()):
            make_samplable(logits, bad)
            indices = bad.nonzero().flatten().tolist()
            reqs = _sampled_reqs
            if reqs is not None and len(reqs) == logits.shape[0]:
                _end_requests(reqs, indices, "sampler")
            else:
                logger.warning(
                    "nanospec: sampler: rows %s had no token to sample; their requests "
                    "are unknown here",
                    indices,
                )
    return original(sampler, logits_output, sampling_info, *args, **kwargs)


class GuardedVerifyMask:
    """Stands in for `eagle_sample`'s grammar mask: applies it (if any), then makes the
    verify rows that are left with no token samplable and remembers which they were."""

    def __init__(self, inner: Any, temperatures: Tensor | None, draft_token_num: int) -> None:
        self.inner = inner
        self.temperatures = temperatures
        self.draft_token_num = draft_token_num
        self.bad: Tensor | None = None

    def apply(self, logits: Tensor) -> None:
        if self.inner is not None:
            self.inner.apply(logits)
        temperatures = self.temperatures
        if temperatures is not None:
            temperatures = torch.repeat_interleave(
                temperatures.reshape(-1), self.draft_token_num, dim=0
            )
        bad = unsamplable_rows(logits, temperatures)
        if bool(bad.any()):
            make_samplable(logits, bad)
            self.bad = bad

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def requests_that_used(bad: Tensor, accept_index: Tensor) -> list[int]:
    """Requests (batch positions) whose accepted verify rows include a `bad` row.
    `accept_index` [bs, depth] holds global row numbers, -1 past the accepted length."""
    rows = accept_index.to(torch.int64)
    used = bad[rows.clamp(min=0)] & (rows >= 0)
    return used.any(dim=1).nonzero().flatten().tolist()


def eagle_sample_hook(
    original: Callable, verify_input: Any, batch: Any, logits_output: Any, *args, **kwargs
) -> Any:
    """AROUND hook on `eagle_sample`: verify rows with no token sample safely; a request
    that accepted from one ends."""
    if batch is None or batch.forward_mode.is_idle():
        return original(verify_input, batch, logits_output, *args, **kwargs)
    info = batch.sampling_info
    temperatures = None if info.is_all_greedy else info.temperatures
    if args:
        inner, rest = args[0], args[1:]
    else:
        inner, rest = kwargs.pop("grammar_mask", None), ()
    mask = GuardedVerifyMask(inner, temperatures, verify_input.draft_token_num)
    result = original(verify_input, batch, logits_output, mask, *rest, **kwargs)
    if mask.bad is not None:
        _end_requests(batch.reqs, requests_that_used(mask.bad, result[2]), "verify")
    return result


def register_hooks(speculative: bool) -> None:
    seams.hook(seams.NO_TOKEN_LEFT_RUN_BATCH, _sampling_batch_hook(0, "batch"))
    seams.hook(seams.NO_TOKEN_LEFT_SAMPLE, _sampling_batch_hook(1, "cur_batch"))
    seams.hook(seams.NO_TOKEN_LEFT_SAMPLER, sampler_forward_hook)
    if speculative:
        seams.hook(seams.NO_TOKEN_LEFT_VERIFY, eagle_sample_hook)
