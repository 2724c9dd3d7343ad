"""Comparisons of a DynamicVocab against the naive oracle, shared by the tests."""

import contextlib
import os

import pytest
import torch
from vocab_oracle import NaiveVocab

from nanospec_server.ops import backend as backends
from nanospec_server.vocab import DynamicVocab


def check_state(vocab: DynamicVocab, naive: NaiveVocab, slots: list[int]) -> None:
    """Window sets, union buffer invariants and statistics agree with the oracle."""
    index = torch.tensor(slots)
    vocab.settle()  # the window state below is read directly
    members = vocab.window.members[index.to(vocab.device), : vocab.w_cap].cpu()
    for row, slot in enumerate(slots):
        drafted = {int(t) for t in members[row] if t >= 0} | naive.always_active
        assert drafted == naive.drafting.get(slot, set()) | naive.always_active
    sizes = vocab.active_size(index).tolist()
    assert sizes == [len(naive.active(s)) for s in slots]
    assert vocab.stream_length(index).tolist() == [len(naive.streams.get(s, [])) for s in slots]

    head = vocab.head
    count = int(head.count)
    ids = head.ids[:count].tolist()
    assert len(set(ids)) == count <= head.capacity
    # A full buffer leaves tokens out (counted); otherwise it holds exactly the union.
    if int(head.overflows) == 0:
        assert set(ids) == naive.union()
    else:
        assert set(ids) <= naive.union() and int(head.dropped) > 0
        assert naive.always_active <= set(ids)
    assert (head.ids[count:] == -1).all()
    assert head.row_of[torch.tensor(ids, dtype=torch.int64)].tolist() == list(range(count))
    assert int((head.row_of >= 0).sum()) == count
    torch.testing.assert_close(
        head.buf[:count], head.weight[torch.tensor(ids, dtype=torch.int64)].to(head.buf.dtype)
    )


def check_contains(vocab: DynamicVocab, naive: NaiveVocab, slots: list[int]) -> None:
    probe = torch.arange(vocab.vocab_size).expand(len(slots), -1)
    found = vocab.contains(torch.tensor(slots), probe).cpu()
    for row, slot in enumerate(slots):
        assert {int(t) for t in probe[row][found[row]]} == naive.active(slot)


def check_topk(vocab: DynamicVocab, naive: NaiveVocab, slots: list[int], k: int, seed: int) -> None:
    """topk equals softmax over the full head with non-drafting tokens masked, then top-k.

    Drafting tokens are the active set as of the last refresh, less any token a full union
    buffer did not admit."""
    generator = torch.Generator().manual_seed(seed)
    weight = vocab.head.weight.cpu()
    row_slots = torch.tensor(slots).repeat_interleave(2)  # two tree rows per request
    hidden = torch.randn(len(row_slots), weight.shape[1], generator=generator)
    probs, ids = (t.cpu() for t in vocab.topk(hidden.to(vocab.device), row_slots, k))
    assert probs.shape == ids.shape == (len(row_slots), k)
    assert ((ids >= 0) & (ids < vocab.vocab_size)).all()
    full = (hidden @ weight.T).float()
    placed = set(vocab.head.ids[: int(vocab.head.count)].tolist())
    for row, slot in enumerate(row_slots.tolist()):
        active = sorted((naive.drafting.get(slot, set()) | naive.always_active) & placed)
        mask = torch.full_like(full[row], float("-inf"))
        mask[active] = 0.0
        expected = torch.softmax(full[row] + mask, -1).nan_to_num(0.0)
        values, expected_ids = expected.topk(k)
        torch.testing.assert_close(probs[row], values, atol=1e-5, rtol=1e-4)
        # Each id carries its own probability (padding entries: any valid id, prob 0), and
        # ids equal the oracle's wherever it has no near-tie.
        drafted = probs[row] > 0
        torch.testing.assert_close(expected[ids[row][drafted]], probs[row][drafted])
        live = min(k, len(active))
        gaps = values[:live].diff().abs()
        if live and (gaps > 1e-4).all():
            assert ids[row, :live].tolist() == expected_ids[:live].tolist()


@contextlib.contextmanager
def ops_backend(name: str):
    """Run with only this ops backend (plus the torch reference) enabled."""
    caches = (backends.cpu_ops, backends.cuda_ops, backends.triton_ops)
    previous = os.environ.get("NANOSPEC_OPS")
    os.environ["NANOSPEC_OPS"] = name
    for cache in caches:
        cache.cache_clear()
    try:
        if name == "cpu" and backends.cpu_ops() is None:
            pytest.skip("the C++ CPU kernels could not be built")
        yield
    finally:
        if previous is None:
            os.environ.pop("NANOSPEC_OPS")
        else:
            os.environ["NANOSPEC_OPS"] = previous
        for cache in caches:
            cache.cache_clear()
