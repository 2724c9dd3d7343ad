"""The offline stream replay (on `DynamicVocab`) against a plainly written reference."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanospec_server.vocab_tools.replay import Sequence, replay, static_coverage

V = 50


def reference(seq: Sequence, w_max: int, k_pre: int, k_ver: int, step: int, eos: tuple[int, ...]):
    """The stream as a list; I = distinct tokens of its last W_max entries, plus EOS."""
    n = len(seq.prompt)
    stream = list(seq.prompt) + seq.top[:n, :k_pre].flatten().tolist()
    covered = active = steps = 0
    for start in range(0, len(seq.output), step):
        emitted = seq.output[start : start + step]
        vocab = set(stream[-w_max:]) | set(eos)
        covered += sum(t in vocab for t in emitted)
        active += len(vocab)
        steps += 1
        stream += (
            emitted
            + seq.top[n - 1 + start : n - 1 + start + len(emitted), :k_ver].flatten().tolist()
        )
    return covered / len(seq.output), active / steps


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_replay_matches_the_plain_stream(data) -> None:
    prompt = data.draw(st.lists(st.integers(0, V - 1), min_size=1, max_size=40))
    output = data.draw(st.lists(st.integers(0, V - 1), min_size=1, max_size=40))
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 1000)))
    top = torch.randint(0, V, (len(prompt) + len(output) - 1, 3), generator=g)
    seq = Sequence(prompt, output, top)
    w_max = data.draw(st.integers(1, 60))
    step = data.draw(st.integers(1, 4))
    k = data.draw(st.integers(0, 3))
    eos = tuple(data.draw(st.lists(st.integers(0, V - 1), max_size=2, unique=True)))
    got = replay(seq, V, w_max, k_pre=k, k_ver=k, step_tokens=step, always_active=eos)
    coverage, mean_active = reference(seq, w_max, k, k, step, eos)
    assert got.coverage == coverage
    assert abs(got.mean_active - mean_active) < 1e-9


def test_trace_reports_size_and_turnover() -> None:
    seq = Sequence([1, 2, 3], [4, 5, 6, 7], torch.tensor([[9], [9], [4], [5], [6], [7]]))
    stats = replay(seq, 10, w_max=4, k_pre=1, k_ver=1, trace=True)
    # Stream 1 2 3 9 9 4 -> I = {3, 9, 4}; each step appends the token and its prediction
    # (the same token here): 4 4 -> {9, 4}, 5 5 -> {4, 5}, 6 6 -> {5, 6}, 7 7 -> {6, 7}.
    assert stats.sizes == [2, 2, 2, 2]
    assert stats.turnover == [1, 2, 2, 2]  # tokens entering plus leaving
    assert stats.coverage == 0.25 and stats.mean_active == (3 + 2 + 2 + 2) / 4


def test_static_coverage() -> None:
    seqs = [Sequence([0], [1, 2, 3, 4], torch.zeros(4, 1, dtype=torch.int64))]
    assert static_coverage(seqs, [1, 2, 9, 3], 2) == 0.5
    assert static_coverage(seqs, [1, 2, 9, 3], 4) == 0.75
