"""The C++ CPU fast path (ops/kernels/vocab_cpu.cpp) against the torch reference path, state
field by field: random streams with many repeats, appends longer than the ring, masks,
live W_max shrinking and growing back, per-request W_max, and resets."""

import sys
from pathlib import Path

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vocab"))
from vocab_checks import ops_backend  # noqa: E402

from nanospec_server.vocab import DynamicVocab  # noqa: E402

SLOTS = 5


def operation(w_cap: int):
    slots = st.lists(st.integers(1, SLOTS - 1), min_size=1, max_size=4, unique=True)
    return st.one_of(
        st.tuples(st.just("append"), slots, st.integers(0, 2 * w_cap + 3), st.integers()),
        st.tuples(st.just("refresh"), slots),
        st.tuples(st.just("w_max"), st.integers(1, w_cap)),
        st.tuples(st.just("own_w_max"), slots, st.integers()),
        st.tuples(st.just("reset"), slots),
    )


@st.composite
def scenarios(draw):
    vocab_size = draw(st.sampled_from([37, 301]))
    w_cap = draw(st.integers(1, 16))
    return dict(
        vocab_size=vocab_size,
        distinct=draw(st.sampled_from([3, vocab_size])),
        w_cap=w_cap,
        ops=draw(st.lists(operation(w_cap), min_size=1, max_size=30)),
    )


def build(case: dict, backend: str) -> DynamicVocab:
    weight = torch.randn(case["vocab_size"], 4, generator=torch.Generator().manual_seed(0))
    with ops_backend(backend):
        vocab = DynamicVocab(weight, SLOTS, w_cap=case["w_cap"], w_max=case["w_cap"])
    assert (vocab._cpu is not None) == (backend == "cpu")
    return vocab


def check_same_state(fast: DynamicVocab, slow: DynamicVocab) -> None:
    w_cap = fast.w_cap
    a, b = fast.window, slow.window
    assert torch.equal(a.length, b.length)
    assert torch.equal(a.ring[:, :w_cap], b.ring[:, :w_cap])
    assert torch.equal(a.latest[:, :w_cap], b.latest[:, :w_cap])
    assert torch.equal(a.in_set, b.in_set)
    for slot in range(SLOTS):  # the tables may order members differently
        assert sorted(a.members[slot][a.members[slot] >= 0].tolist()) == sorted(
            b.members[slot][b.members[slot] >= 0].tolist()
        )
    count = int(slow.head.count)
    assert int(fast.head.count) == count
    assert set(fast.head.ids[:count].tolist()) == set(slow.head.ids[:count].tolist())


@settings(max_examples=150, deadline=None)
@given(case=scenarios())
def test_cpu_kernels_match_the_torch_reference(case):
    fast, slow = build(case, "cpu"), build(case, "reference")
    for kind, *args in case["ops"]:
        if kind == "append":
            slots, length, seed = args
            gen = torch.Generator().manual_seed(seed % 2**32)
            tokens = torch.randint(0, case["distinct"], (len(slots), length), generator=gen)
            valid = torch.rand(len(slots), length, generator=gen) < 0.8
            for vocab in (fast, slow):
                vocab.append(torch.tensor(slots), tokens, valid)
        elif kind == "refresh":
            for vocab in (fast, slow):
                vocab.refresh(torch.tensor(args[0]))
        elif kind == "w_max":
            for vocab in (fast, slow):
                vocab.set_w_max(args[0])
        elif kind == "own_w_max":
            slots, seed = args
            gen = torch.Generator().manual_seed(seed % 2**32)
            own = torch.randint(0, case["w_cap"] + 1, (len(slots),), generator=gen).tolist()
            for vocab in (fast, slow):
                vocab.set_request_w_max(torch.tensor(slots), own)
        else:
            for vocab in (fast, slow):
                vocab.reset(torch.tensor(args[0]))
        check_same_state(fast, slow)
