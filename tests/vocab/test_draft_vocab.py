"""DraftVocab (an EAGLE-3 head's d2t vocabulary D) against plain sets.

The oracle keeps each slot's stream S of token ids, every token (in D or not) one
position. After each refresh, for every slot: the tokens the head may draft are
(Unique(Suffix(S, W_max)) ∩ D) ∪ (pinned ∩ D), and the packed head holds a row for
exactly the union of those sets, each row a token of D with its own draft-head row.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from vocab_checks import ops_backend

from nanospec_server.vocab.draft_vocab import DraftIds, DraftVocab

HIDDEN, SLOTS = 8, 4


@st.composite
def draft_vocabularies(draw):
    vocab_size = draw(st.sampled_from([13, 61]))
    ids = draw(
        st.lists(st.integers(0, vocab_size - 1), min_size=1, max_size=vocab_size, unique=True)
    )
    if draw(st.booleans()):  # SpecForge sorts D; SGLang does not need it
        ids = sorted(ids)
    return vocab_size, ids


@given(draft_vocabularies())
def test_inverse_of_d2t_matches_a_dict(case) -> None:
    vocab_size, ids = case
    d2t = torch.tensor(ids) - torch.arange(len(ids))  # as a SpecForge checkpoint stores it
    draft = DraftIds.from_hot_token_ids(d2t + torch.arange(len(ids)), vocab_size)  # SGLang's
    inverse = {token: i for i, token in enumerate(ids)}
    tokens = torch.arange(vocab_size)
    assert draft.draft_id(tokens).tolist() == [inverse.get(t, -1) for t in range(vocab_size)]
    assert draft.contains(tokens).tolist() == [t in inverse for t in range(vocab_size)]
    # ids outside the vocabulary (a batch's padding) are outside D, not an index error
    assert draft.draft_id(torch.tensor([-1, vocab_size])).tolist() == [-1, -1]


def test_a_d2t_that_maps_two_ids_to_one_token_is_refused() -> None:
    with pytest.raises(ValueError, match="two draft ids"):
        DraftIds.from_hot_token_ids(torch.tensor([3, 3]), 10)
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        DraftIds.from_hot_token_ids(torch.tensor([3, 10]), 10)


@st.composite
def scenarios(draw):
    vocab_size, ids = draw(draft_vocabularies())
    w_cap = draw(st.integers(1, 10))
    w_max = draw(st.integers(1, w_cap))
    pinned = draw(st.lists(st.integers(0, vocab_size - 1), max_size=3, unique=True))
    appends = st.tuples(
        st.lists(st.integers(1, SLOTS - 1), min_size=1, max_size=3, unique=True),
        st.lists(st.integers(0, vocab_size - 1), min_size=0, max_size=2 * w_cap),
        st.booleans(),  # reset these slots first (a new request takes them over)
    )
    return vocab_size, ids, w_cap, w_max, pinned, draw(st.lists(appends, min_size=1, max_size=12))


@pytest.mark.parametrize("backend", ["reference", "cpu", "static-shapes"])
@settings(max_examples=60, deadline=None)
@given(scenario=scenarios(), seed=st.integers(0, 2**16))
def test_active_rows_are_the_window_intersected_with_d(backend, scenario, seed) -> None:
    vocab_size, ids, w_cap, w_max, pinned, steps = scenario
    with ops_backend("reference" if backend == "static-shapes" else backend):
        run_scenario(vocab_size, ids, w_cap, w_max, pinned, steps, seed, backend)


def run_scenario(vocab_size, ids, w_cap, w_max, pinned, steps, seed, backend) -> None:
    in_d = set(ids)
    weight = torch.randn(len(ids), HIDDEN, generator=torch.Generator().manual_seed(seed))
    draft = DraftIds.from_hot_token_ids(torch.tensor(ids), vocab_size)
    vocab = DraftVocab(
        weight, draft, SLOTS, w_cap=w_cap, w_max=w_max, always_active=pinned,
        static_shapes=backend == "static-shapes",
    )  # fmt: skip
    # With no pinned token in D, draft id 0 is pinned to stand for the tokens outside D.
    pinned_d = (set(pinned) & in_d) or {ids[0]}
    streams: dict[int, list[int]] = {}
    for slots, tokens, reset in steps:
        index = torch.tensor(slots)
        if reset:
            vocab.reset(index)
            for slot in slots:
                streams[slot] = []
        for slot in slots:
            streams.setdefault(slot, []).extend(tokens)
        vocab.append(index, torch.tensor([tokens] * len(slots), dtype=torch.int64))
        vocab.refresh(index)
        active = {
            s: (set(stream[max(0, len(stream) - w_max) :]) & in_d) | pinned_d
            for s, stream in streams.items()
        }
        check(vocab, draft, active, vocab_size, weight)


def check(
    vocab: DraftVocab, draft: DraftIds, active: dict[int, set[int]], vocab_size, weight
) -> None:
    slots = sorted(active)
    index = torch.tensor(slots)
    probe = torch.arange(vocab_size).expand(len(slots), -1)
    found = vocab.contains(index, probe)
    for row, slot in enumerate(slots):
        assert set(probe[row][found[row]].tolist()) == active[slot]
    assert vocab.active_size(index).tolist() == [len(active[s]) for s in slots]

    count = int(vocab.head.count)
    rows = vocab.head.ids[:count]
    tokens = vocab.row_token_ids[:count].tolist()
    # No row for a token outside D; a row per token of the union; each the token's own row.
    assert set(tokens) == set().union(*active.values())
    assert len(tokens) == count
    assert tokens == draft.token_of[rows].tolist()
    torch.testing.assert_close(vocab.head.buf[:count], weight[rows])

    # What the draft proposes maps back to token ids of the slot's own I ∩ D.
    hidden = torch.randn(len(slots), weight.shape[1])
    probs, proposed = vocab.topk(hidden, index, 2)
    for row, slot in enumerate(slots):
        assert set(proposed[row][probs[row] > 0].tolist()) <= active[slot]


def test_tokens_outside_d_take_window_positions_but_no_rows() -> None:
    """Window positions count every token, so an out-of-D run pushes the D tokens out."""
    ids = [1, 4, 6]  # D; EOS = 1 is pinned
    weight = torch.randn(len(ids), HIDDEN)
    vocab = DraftVocab(
        weight, DraftIds.from_hot_token_ids(torch.tensor(ids), 8), SLOTS, w_cap=4, w_max=4,
        always_active=[1],
    )  # fmt: skip
    slot = torch.tensor([1])
    vocab.append(slot, torch.tensor([[4, 6, 0, 2]]))
    vocab.refresh(slot)
    assert sorted(vocab.row_token_ids[: int(vocab.head.count)].tolist()) == [1, 4, 6]
    vocab.append(slot, torch.tensor([[0, 2, 3, 5, 7]]))  # none of them in D
    vocab.refresh(slot)
    assert vocab.row_token_ids[: int(vocab.head.count)].tolist() == [1]  # EOS only
    assert vocab.stream_length(slot).tolist() == [9]
