"""Property tests: DynamicVocab against the naive definition (tests/vocab/vocab_oracle.py).

Random batches of appends (with masks; some with their refresh left for the next read,
`append_later`), refreshes, resets (slot reuse), live W_max changes and per-slot W_max (a
request's own, 0: back to the live one) over a few slots; after every refresh the active
sets, the union buffer, the statistics and topk must agree with the oracle.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from vocab_checks import check_contains, check_state, check_topk, ops_backend
from vocab_oracle import NaiveVocab

from nanospec_server.vocab import DynamicVocab

HIDDEN, SLOTS = 8, 5
# Vocabulary sizes that are multiples of nothing nice; 101 makes the union capacity
# (4 requests x W_cap + pinned) smaller than V, so a tight buffer is exercised too.
VOCABS = (37, 101)


def operation(w_cap: int):
    slots = st.lists(st.integers(1, SLOTS - 1), min_size=1, max_size=3, unique=True)
    rows = st.integers(0, 2 * w_cap)
    append = st.tuples(st.just("append"), slots, rows, st.data())
    # An append whose refresh waits for the next read (a depth-0 step's).
    append_later = st.tuples(st.just("append_later"), slots, rows, st.data())
    return st.one_of(
        append,
        append,
        append_later,
        append_later,
        st.tuples(st.just("refresh"), slots),
        st.tuples(st.just("reset"), slots),
        st.tuples(st.just("w_max"), st.integers(1, w_cap)),
        st.tuples(st.just("own_w_max"), slots, st.data()),
        st.tuples(st.just("topk"), slots, st.integers(1, 6)),
    )


@st.composite
def scenarios(draw):
    vocab_size = draw(st.sampled_from(VOCABS))
    # Few distinct tokens make duplicate-heavy streams.
    distinct = draw(st.sampled_from([3, vocab_size]))
    w_cap = draw(st.integers(1, 12))
    w_max = draw(st.integers(1, w_cap))
    pinned = draw(st.lists(st.integers(0, vocab_size - 1), max_size=2, unique=True))
    ops = draw(st.lists(operation(w_cap), min_size=1, max_size=25))
    # None: the default buffer (never full here); else often too small for the union.
    capacity = draw(st.one_of(st.none(), st.integers(len(pinned), len(pinned) + 2 * w_cap)))
    return vocab_size, distinct, w_cap, w_max, pinned, capacity, ops


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@settings(max_examples=100, deadline=None)
@given(scenario=scenarios(), seed=st.integers(0, 2**16))
def test_matches_the_definition(backend, scenario, seed):
    with ops_backend(backend):
        run_scenario(scenario, seed)


@settings(max_examples=40, deadline=None)
@given(scenario=scenarios(), seed=st.integers(0, 2**16))
def test_matches_the_definition_with_the_static_shapes_of_cuda(scenario, seed):
    """The torch code CUDA runs (fixed shapes, no host reads), exercised on CPU."""
    with ops_backend("reference"):
        run_scenario(scenario, seed, static_shapes=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
@settings(max_examples=30, deadline=None)
@given(scenario=scenarios(), seed=st.integers(0, 2**16))
def test_matches_the_definition_on_cuda(scenario, seed):
    run_scenario(scenario, seed, device="cuda")


def run_scenario(scenario, seed, device="cpu", static_shapes=None):
    vocab_size, distinct, w_cap, w_max, pinned, capacity, ops = scenario
    weight = torch.randn(vocab_size, HIDDEN, generator=torch.Generator().manual_seed(seed))
    vocab = DynamicVocab(
        weight.to(device), SLOTS, w_cap=w_cap, w_max=w_max, always_active=pinned,
        static_shapes=static_shapes, union_capacity=capacity,
    )  # fmt: skip
    naive = NaiveVocab(w_max, pinned)
    for op in ops:
        kind, *args = op
        if kind in ("append", "append_later"):
            slots, length, data = args
            tokens = data.draw(
                st.lists(
                    st.lists(st.integers(0, distinct - 1), min_size=length, max_size=length),
                    min_size=len(slots),
                    max_size=len(slots),
                )
            )
            valid = data.draw(
                st.lists(
                    st.lists(st.booleans(), min_size=length, max_size=length),
                    min_size=len(slots),
                    max_size=len(slots),
                )
            )
            tokens_t = torch.tensor(tokens, dtype=torch.int64).view(len(slots), length)
            valid_t = torch.tensor(valid, dtype=torch.bool).view(len(slots), length)
            append = vocab.append if kind == "append" else vocab.append_later
            append(torch.tensor(slots), tokens_t, valid_t)
            for slot, row, mask in zip(slots, tokens, valid, strict=True):
                naive.append(slot, [t for t, keep in zip(row, mask, strict=True) if keep])
                if kind == "append_later":
                    naive.refresh(slot)
        elif kind == "refresh":
            vocab.refresh(torch.tensor(args[0]))
            for slot in args[0]:
                naive.refresh(slot)
            check_state(vocab, naive, list(range(1, SLOTS)))
        elif kind == "reset":
            vocab.reset(torch.tensor(args[0]))
            for slot in args[0]:
                naive.reset(slot)
            check_state(vocab, naive, list(range(1, SLOTS)))
        elif kind == "w_max":
            vocab.set_w_max(args[0])
            naive.w_max = args[0]
        elif kind == "own_w_max":
            slots, data = args
            values = data.draw(
                st.lists(st.integers(0, vocab.w_cap), min_size=len(slots), max_size=len(slots))
            )
            vocab.set_request_w_max(torch.tensor(slots), values)
            for slot, value in zip(slots, values, strict=True):
                naive.own_w_max[slot] = value
        else:
            slots, k = args
            check_topk(vocab, naive, slots, k, seed)
        if kind != "append_later":  # a read: queued appends would not outlive it
            check_contains(vocab, naive, list(range(SLOTS)))
