"""The unsamplable-row guard against a plain reference: SGLang's own torch sampler, row by row."""

from __future__ import annotations

from http import HTTPStatus
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sglang.srt.layers.sampler import top_k_top_p_min_p_sampling_from_probs_torch
from sglang.srt.managers.schedule_batch import FINISH_ABORT

from nanospec_server.sglang_plugin.requests.no_token_left import (
    GuardedVerifyMask,
    end_request,
    requests_that_used,
    sampler_forward_hook,
)
from nanospec_server.sglang_plugin.requests.unsamplable_rows import (
    make_samplable,
    unsamplable_rows,
)

VOCAB = 12
NEG_INF = float("-inf")


def sglang_samples(logits: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    """SGLang's CPU sampling of `logits` [rows, vocab]: temperature, softmax, top-k/top-p/min-p
    (as the `pytorch` backend runs them), then `torch.multinomial`."""
    probs = torch.softmax(logits / temperatures.view(-1, 1), dim=-1)
    rows = logits.shape[0]
    return top_k_top_p_min_p_sampling_from_probs_torch(
        probs,
        top_ks=torch.full((rows,), 5, dtype=torch.int32),
        top_ps=torch.full((rows,), 0.8),
        min_ps=torch.full((rows,), 0.4),
        need_min_p_sampling=True,
        sampling_seed=None,
        positions=torch.zeros(rows, dtype=torch.int64),
    )


def reference_unsamplable(logits: torch.Tensor, temperatures: torch.Tensor) -> list[bool]:
    """Does SGLang's sampler refuse each row on its own?"""
    refused = []
    for row in range(logits.shape[0]):
        try:
            sglang_samples(logits[row : row + 1].clone(), temperatures[row : row + 1])
        except RuntimeError:
            refused.append(True)
        else:
            refused.append(False)
    return refused


entries = st.one_of(
    st.floats(-30, 30),
    st.just(NEG_INF),  # a masked token (grammar, min_new_tokens, a -inf penalty)
    st.sampled_from([float("inf"), float("nan"), 3e38, -3e38]),
)
rows = st.lists(entries, min_size=VOCAB, max_size=VOCAB)
# Whole rows masked, as a grammar meeting min_new_tokens leaves them.
masked_row = st.just([NEG_INF] * VOCAB)


@settings(max_examples=200, deadline=None)
@given(
    batch=st.lists(st.one_of(rows, masked_row), min_size=1, max_size=6),
    temperature=st.sampled_from([0.39, 1.0, 1e-5, 7.0]),
)
def test_the_guard_flags_exactly_the_rows_sglangs_sampler_refuses(
    batch: list[list[float]], temperature: float
) -> None:
    logits = torch.tensor(batch, dtype=torch.float32)
    temperatures = torch.full((len(batch), 1), temperature)
    bad = unsamplable_rows(logits, temperatures)
    assert bad.tolist() == reference_unsamplable(logits, temperatures)

    untouched = logits.clone()
    make_samplable(logits, bad)
    sampled = sglang_samples(logits, temperatures)  # the whole batch completes
    assert sampled.shape == (len(batch),)
    good = ~bad
    assert torch.equal(logits[good], untouched[good])  # other rows sample as before


def test_greedy_rows_fail_only_with_nothing_to_pick() -> None:
    logits = torch.tensor(
        [[NEG_INF, NEG_INF], [NEG_INF, 2.0], [float("nan"), 1.0], [float("inf"), 0.0]]
    )
    assert unsamplable_rows(logits, None).tolist() == [True, False, True, False]


def test_the_reported_request_is_refused_by_sglang_and_completes_guarded() -> None:
    """The row of the request that stopped the server: everything masked, T 0.39."""
    logits = torch.randn(3, VOCAB)
    logits[1] = NEG_INF
    temperatures = torch.tensor([[1.0], [0.39], [0.7]])
    with pytest.raises(RuntimeError, match="probability tensor"):
        sglang_samples(logits.clone(), temperatures)
    bad = unsamplable_rows(logits, temperatures)
    make_samplable(logits, bad)
    assert bad.tolist() == [False, True, False]
    sglang_samples(logits, temperatures)


def request(**params) -> SimpleNamespace:
    defaults = dict(
        json_schema=None,
        regex=None,
        ebnf=None,
        min_new_tokens=0,
        stop_token_ids=None,
        logit_bias=None,
        frequency_penalty=0.0,
        presence_penalty=0.0,
        repetition_penalty=1.0,
    )
    req = SimpleNamespace(
        rid="r",
        sampling_params=SimpleNamespace(**(defaults | params)),
        output_ids=[4, 5],
        to_finish=None,
        grammar=object() if params.get("json_schema") else None,
    )
    req.finished = lambda: False
    return req


def test_a_request_that_masked_every_token_ends_with_a_400_naming_its_fields() -> None:
    req = request(stop_token_ids={3}, logit_bias={"4": -1.0}, repetition_penalty=0.64)
    end_request(req)
    assert isinstance(req.to_finish, FINISH_ABORT)
    assert req.to_finish.status_code == HTTPStatus.BAD_REQUEST
    message = req.to_finish.message
    assert message.startswith("sampling_params: no token is left to sample at output position 2")
    for field in ("stop_token_ids", "logit_bias", "repetition_penalty"):
        assert field in message


def test_a_grammar_that_ends_before_min_new_tokens_names_min_new_tokens() -> None:
    req = request(json_schema='{"type": "object"}', min_new_tokens=4)
    end_request(req)
    assert req.to_finish.status_code == HTTPStatus.BAD_REQUEST
    assert req.to_finish.message.startswith("min_new_tokens: ")


def test_without_constraints_the_models_logits_are_to_blame() -> None:
    req = request()
    end_request(req)
    assert req.to_finish.status_code == HTTPStatus.INTERNAL_SERVER_ERROR


def test_the_sampler_hook_ends_only_the_unsamplable_rows_request() -> None:
    import nanospec_server.sglang_plugin.requests.no_token_left as guard

    reqs = [request(), request(min_new_tokens=3, stop_token_ids={1}), request()]
    logits = torch.randn(3, VOCAB)
    logits[1] = NEG_INF
    info = SimpleNamespace(is_all_greedy=False, temperatures=torch.ones(3, 1))
    output = SimpleNamespace(next_token_logits=logits)

    def sampler(_, logits_output, sampling_info):
        probs = torch.softmax(logits_output.next_token_logits, dim=-1)
        return torch.multinomial(probs, 1).view(-1)

    guard._sampled_reqs = reqs
    try:
        sampled = sampler_forward_hook(sampler, None, output, info)
    finally:
        guard._sampled_reqs = None
    assert sampled.shape == (3,)
    assert [r.to_finish is not None for r in reqs] == [False, True, False]


def test_a_verify_request_ends_only_if_it_accepted_from_an_unsamplable_row() -> None:
    draft_tokens = 3  # rows: request 0 -> 0..2, request 1 -> 3..5
    logits = torch.randn(6, VOCAB)
    logits[2] = NEG_INF  # request 0: a node it never reached
    logits[4] = NEG_INF  # request 1: on its accepted path
    mask = GuardedVerifyMask(None, torch.ones(2, 1), draft_tokens)
    mask.apply(logits)
    assert torch.isfinite(logits).all()
    accept_index = torch.tensor([[0, 1, -1], [3, 4, -1]])
    assert requests_that_used(mask.bad, accept_index) == [1]
