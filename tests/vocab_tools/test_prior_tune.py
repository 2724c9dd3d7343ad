"""The prior's k by the trimming utility: window ∪ prior coverage against a plain set
reference, and the search's choice on problems whose answer is known."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanospec_server.vocab_tools.prior_tune import (
    ROW_QUANTUM,
    HeadTimer,
    PriorProblem,
    union_replay,
)
from nanospec_server.vocab_tools.replay import Sequence

VOCAB = 60


def plain_union_coverage(seq: Sequence, pinned: set[int]) -> float:
    """One emitted token per step, a window longer than the stream: the token at output
    position j is covered when the prompt, the prompt's top-3, the outputs before j and
    their top-3, or the pinned ids hold it."""
    n = len(seq.prompt)
    known = set(seq.prompt) | set(seq.top[:n, :3].flatten().tolist()) | pinned
    covered = 0
    for j, token in enumerate(seq.output):
        covered += token in known
        known |= {token, *seq.top[n - 1 + j, :3].tolist()}
    return covered / len(seq.output)


sequences = st.builds(
    lambda prompt, output, seed: Sequence(
        prompt, output,
        torch.randint(0, VOCAB, (len(prompt) + len(output) - 1, 3),
                      generator=torch.Generator().manual_seed(seed)),
    ),
    st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12),
    st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=20),
    st.integers(0, 2**31 - 1),
)  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(sequences, st.lists(st.integers(0, VOCAB - 1), max_size=10))
def test_union_coverage_matches_the_plain_reference(seq: Sequence, prior: list[int]) -> None:
    stats = union_replay([seq], VOCAB, w_max=512, pinned=prior, step_tokens=1)
    assert stats.coverage == pytest.approx(plain_union_coverage(seq, set(prior)))


def problem(sequences: list[Sequence], ranked: list[int]) -> PriorProblem:
    # the head costs 1 ms per row: the prior's rows show up in the latency term
    return PriorProblem(sequences, ranked, [], VOCAB, backbone_ms=10.0, head_ms=lambda r: r,
                        w_max=512, step_tokens=1)  # fmt: skip


def test_a_prior_that_covers_nothing_new_is_not_chosen() -> None:
    seq = Sequence([1, 2, 3], [1, 2, 3, 1, 2], torch.ones(7, 3, dtype=torch.int64))
    p = problem([seq], ranked=list(range(10, 40)))  # none of them is ever emitted
    assert p.evaluate(0)["coverage"] == 1.0
    assert p.search(high=30, trials=15, seed=0, start=[]).best_k == 0


def test_the_prior_is_chosen_up_to_the_tokens_it_adds() -> None:
    # the output is 20 tokens the window never saw; the prior's first 20 ranks are those
    output = list(range(20, 40))
    seq = Sequence([1], output, torch.zeros(len(output), 3, dtype=torch.int64))
    p = problem([seq], ranked=output + list(range(40, 60)))
    best = p.search(high=40, trials=40, seed=0, start=[]).best_k
    assert best == 20, p.rows  # every further token costs a row and covers nothing
    assert p.evaluate(20)["coverage"] == 1.0 and p.evaluate(19)["coverage"] == 19 / 20


def test_head_times_are_measured_once_per_row_block() -> None:
    timer = HeadTimer(torch.randn(1000, 16), repeats=1)
    timer(100.0), timer(110.0), timer(5000.0)
    assert sorted(timer.measured) == [2 * ROW_QUANTUM, 1000]  # 100 and 110 share a block
