"""Edge cases of the dynamic vocabulary, each against the naive oracle."""

import pytest
import torch
from vocab_checks import check_contains, check_state, check_topk, ops_backend
from vocab_oracle import NaiveVocab

from nanospec_server.vocab import DynamicVocab
from nanospec_server.vocab.window import WindowState

VOCAB, HIDDEN = 53, 16


def make(w_cap: int, w_max: int, pinned=(), slots: int = 4) -> tuple[DynamicVocab, NaiveVocab]:
    weight = torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(7))
    vocab = DynamicVocab(weight, slots, w_cap=w_cap, w_max=w_max, always_active=pinned)
    return vocab, NaiveVocab(w_max, pinned)


def step(vocab, naive, slot: int, tokens: list[int]) -> None:
    vocab.append(torch.tensor([slot]), torch.tensor([tokens], dtype=torch.int64))
    naive.append(slot, tokens)
    vocab.refresh(torch.tensor([slot]))
    naive.refresh(slot)
    check_state(vocab, naive, [1, 2, 3])
    check_contains(vocab, naive, [0, 1, 2, 3])
    check_topk(vocab, naive, [slot], k=5, seed=slot)


def test_prompt_longer_than_w_max():
    vocab, naive = make(w_cap=16, w_max=8)
    step(vocab, naive, 1, [i % VOCAB for i in range(100)])
    assert vocab.active_size(torch.tensor([1])).item() == 8


def test_w_max_smaller_than_one_step():
    vocab, naive = make(w_cap=4, w_max=3)
    step(vocab, naive, 1, [1, 2, 3])
    step(vocab, naive, 1, [10, 11, 12, 13, 14, 15, 16])  # a step of 7 candidates
    assert naive.drafting[1] == {14, 15, 16}


def test_duplicate_heavy_stream_refreshes_repeated_tokens():
    vocab, naive = make(w_cap=6, w_max=4)
    step(vocab, naive, 1, [5, 5, 5, 6, 5, 5])
    step(vocab, naive, 1, [7, 8, 5])  # 5 occurs again: it stays, 6 leaves
    assert naive.drafting[1] == {5, 7, 8}


def test_empty_draft_tree_changes_nothing():
    vocab, naive = make(w_cap=8, w_max=8)
    step(vocab, naive, 1, [1, 2, 3])
    vocab.append(torch.tensor([1]), torch.zeros(1, 0, dtype=torch.int64))
    vocab.append(torch.tensor([1]), torch.ones(1, 4, dtype=torch.int64), torch.zeros(1, 4).bool())
    step(vocab, naive, 1, [])


def test_always_active_tokens_are_draftable_everywhere():
    vocab, naive = make(w_cap=4, w_max=2, pinned=(0, 52))
    step(vocab, naive, 1, [0, 3, 4])  # EOS enters and leaves the window: still drafted
    probs, ids = vocab.topk(torch.randn(1, HIDDEN), torch.tensor([2]), k=3)  # empty slot
    assert set(ids[0, :2].tolist()) == {0, 52} and probs[0, 2] == 0
    assert vocab.contains(torch.tensor([3]), torch.tensor([[0, 52, 3]])).tolist() == [
        [True, True, False]
    ]


def test_slot_reuse_leaves_no_stale_tokens():
    vocab, naive = make(w_cap=8, w_max=8)
    step(vocab, naive, 1, [1, 2, 3, 4])
    step(vocab, naive, 2, [3, 4, 5])
    vocab.reset(torch.tensor([1]))
    naive.reset(1)
    check_state(vocab, naive, [1, 2, 3])
    step(vocab, naive, 1, [9])
    assert naive.drafting[1] == {9} and int(vocab.head.count) == 4


def test_k_larger_than_the_active_set_pads_with_valid_ids():
    vocab, naive = make(w_cap=8, w_max=8)
    step(vocab, naive, 1, [4, 9])
    probs, ids = vocab.topk(torch.randn(3, HIDDEN), torch.tensor([1, 1, 0]), k=6)
    assert ((ids >= 0) & (ids < VOCAB)).all()
    assert (probs[:2, 2:] == 0).all() and (probs[2] == 0).all()
    torch.testing.assert_close(probs[:2].sum(1), torch.ones(2))


def test_w_max_changes_take_effect_at_the_next_refresh():
    vocab, naive = make(w_cap=8, w_max=8)
    step(vocab, naive, 1, list(range(10)))
    vocab.set_w_max(3)
    naive.w_max = 3
    step(vocab, naive, 1, [])
    vocab.set_w_max(8)  # tokens come back into the window
    naive.w_max = 8
    step(vocab, naive, 1, [])
    for bad in (0, 9):
        with pytest.raises(ValueError):
            vocab.set_w_max(bad)


def step_together(vocab, naive, tokens: dict[int, list[int]]) -> None:
    """Append to several slots and refresh them in one call (one W_max per row)."""
    for slot, row in tokens.items():
        vocab.append(torch.tensor([slot]), torch.tensor([row], dtype=torch.int64))
        naive.append(slot, row)
    vocab.refresh(torch.tensor(list(tokens)))
    for slot in tokens:
        naive.refresh(slot)
    check_state(vocab, naive, [1, 2, 3])
    check_contains(vocab, naive, [0, 1, 2, 3])


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_a_slots_own_w_max_wins_over_the_live_one_until_reset(backend):
    with ops_backend(backend):
        vocab, naive = make(w_cap=8, w_max=8)
        slots = torch.tensor([1, 2, 3])
        vocab.set_request_w_max(torch.tensor([2, 3]), [2, 5])
        naive.own_w_max.update({2: 2, 3: 5})
        step_together(vocab, naive, {1: list(range(10)), 2: list(range(10)), 3: list(range(10))})
        assert vocab.w_max_of(slots).tolist() == [8, 2, 5]
        assert vocab.active_size(slots).tolist() == [8, 2, 5]
        vocab.set_w_max(3)  # a live change reaches slot 1 only
        naive.w_max = 3
        step_together(vocab, naive, {3: [], 1: [], 2: []})
        assert vocab.active_size(slots).tolist() == [3, 2, 5]
        vocab.reset(torch.tensor([2]))  # the slot's next request follows the live W_max
        naive.reset(2)
        step_together(vocab, naive, {2: list(range(20, 30)), 1: [40]})
        assert vocab.w_max_of(slots).tolist() == [3, 3, 5]
        for bad in (-1, 9):
            with pytest.raises(ValueError, match="w_max"):
                vocab.set_request_w_max(torch.tensor([1]), [bad])


def test_rows_computed_is_the_union_size():
    vocab, naive = make(w_cap=8, w_max=8)
    step(vocab, naive, 1, [1, 2, 3])
    step(vocab, naive, 2, [2, 3, 4])
    vocab.topk(torch.randn(2, HIDDEN), torch.tensor([1, 2]), k=2)
    assert vocab.rows_computed == 4  # |{1,2,3} | {2,3,4}|, not 3 + 3


def test_state_bytes_matches_the_allocation():
    weight = torch.randn(VOCAB, HIDDEN)
    vocab = DynamicVocab(weight, 6, w_cap=5, w_max=5, always_active=(1,), max_batch=3)
    expected = DynamicVocab.state_bytes(VOCAB, 5, 6, HIDDEN, 4, max_batch=3, num_pinned=1)
    assert vocab.nbytes() == expected


@pytest.mark.parametrize("w_cap", [8, 3072])
def test_per_slot_state_grows_with_the_vocabulary_by_one_bitmap_at_most(w_cap):
    """O(W_cap) per slot plus V bits: from V = 1000 to 151,936, a slot may grow by the
    bitmap's bytes only (the formula and the allocation alike)."""
    small, large = 1000, 151936
    allowed = (large - small) / 8 + 4  # + 4: rounding to whole int32 words
    assert (
        WindowState.bytes_per_slot(large, w_cap) - WindowState.bytes_per_slot(small, w_cap)
        <= allowed
    )
    slots = 3
    sizes = [WindowState(v, w_cap, slots, torch.device("cpu")).nbytes() for v in (small, large)]
    assert sizes == [slots * WindowState.bytes_per_slot(v, w_cap) for v in (small, large)]
    assert (sizes[1] - sizes[0]) / slots <= allowed
    # And linear in W_cap: at most 16 bytes per ring cell (ring, flag, members table).
    assert (
        WindowState.bytes_per_slot(large, 2 * w_cap) - WindowState.bytes_per_slot(large, w_cap)
        <= 16 * w_cap
    )


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_a_full_union_buffer_leaves_new_tokens_out_and_counts_them(backend):
    with ops_backend(backend):
        weight = torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(1))
        vocab = DynamicVocab(weight, 4, w_cap=4, w_max=4, always_active=(0,), union_capacity=6)
        vocab.append(torch.tensor([1, 2]), torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]]))
        vocab.refresh(torch.tensor([1, 2]))
        head = vocab.head
        assert int(head.count) == 6  # pinned 0, then 5 of the 8 new tokens
        assert vocab.overflow_stats() == {"tokens_not_admitted": 3, "overflows": 1}
        placed = set(head.ids[:6].tolist())
        probs, ids = vocab.topk(torch.randn(2, HIDDEN), torch.tensor([1, 2]), k=5)
        for row, window in enumerate(({0, 1, 2, 3, 4}, {0, 5, 6, 7, 8})):
            drafted = set(ids[row][probs[row] > 0].tolist())
            assert drafted == window & placed  # never a token outside the request's set
        # Request 1 ends and frees rows; a refused token gets one once a diff touches it
        # again (here: it enters another window).
        vocab.reset(torch.tensor([1]))
        vocab.append(torch.tensor([3]), torch.tensor([[7, 8]]))
        vocab.refresh(torch.tensor([3]))
        assert set(head.ids[: int(head.count)].tolist()) == {0, 5, 7, 8} | (placed - {1, 2, 3, 4})
        assert vocab.overflow_stats()["overflows"] == 1


def test_appends_to_the_padding_slot_are_dropped():
    vocab, naive = make(w_cap=8, w_max=8)
    vocab.append(torch.tensor([0, 1]), torch.tensor([[3, 4], [5, 6]]))
    vocab.refresh(torch.tensor([0, 1]))
    assert vocab.stream_length(torch.tensor([0, 1])).tolist() == [0, 2]
    assert set(vocab.head.ids[: int(vocab.head.count)].tolist()) == {5, 6}
