"""Re-filing SGLang's grammar abort: a 400 only while the request's min_new_tokens is pending."""

from __future__ import annotations

from http import HTTPStatus
from types import SimpleNamespace

import pytest
from sglang.srt.managers.schedule_batch import FINISH_ABORT

from nanospec_server.sglang_plugin.requests.grammar_conflict import grammar_conflict_hook


def request(min_new_tokens: int, outputs: int) -> SimpleNamespace:
    sampling = SimpleNamespace(min_new_tokens=min_new_tokens)
    return SimpleNamespace(sampling_params=sampling, output_ids=[5] * outputs, to_finish=None)


def refusing_grammar(processor, req, tokens):
    """What SGLang's grammar step does when the grammar refuses a sampled token."""
    req.to_finish = FINISH_ABORT(
        "Grammar accept_token failed", HTTPStatus.INTERNAL_SERVER_ERROR, "InternalServerError"
    )
    return []


def test_a_refused_token_while_min_new_tokens_is_pending_is_the_clients_400() -> None:
    req = request(min_new_tokens=3, outputs=1)
    grammar_conflict_hook(refusing_grammar, None, req, [7])
    assert req.to_finish.status_code == HTTPStatus.BAD_REQUEST
    assert req.to_finish.message.startswith("min_new_tokens: ")


def test_the_prefill_step_keyword_call_is_handled_too() -> None:
    req = request(min_new_tokens=2, outputs=0)

    def prefill(processor, *, req, next_token_id, already_advanced=False):
        return refusing_grammar(processor, req, [next_token_id])

    grammar_conflict_hook(prefill, None, req=req, next_token_id=7)
    assert req.to_finish.status_code == HTTPStatus.BAD_REQUEST


@pytest.mark.parametrize(("min_new_tokens", "outputs"), [(0, 1), (3, 4)])
def test_other_grammar_aborts_keep_sglangs_status(min_new_tokens: int, outputs: int) -> None:
    req = request(min_new_tokens, outputs)
    grammar_conflict_hook(refusing_grammar, None, req, [7])
    assert req.to_finish.status_code == HTTPStatus.INTERNAL_SERVER_ERROR


def test_an_abort_set_before_the_step_is_left_alone() -> None:
    req = request(min_new_tokens=3, outputs=1)
    earlier = FINISH_ABORT("client went away", HTTPStatus.INTERNAL_SERVER_ERROR)
    req.to_finish = earlier
    grammar_conflict_hook(lambda processor, req, tokens: [], None, req, [7])
    assert req.to_finish is earlier
