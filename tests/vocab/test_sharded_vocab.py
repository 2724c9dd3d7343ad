"""The sharded packed head across real processes (torch.distributed over gloo) against the
unsharded one: same active sets, same logits on every gathered column, same top-k.

Each rank holds only its shard of a vocab-parallel head (V padded to a multiple of 64,
the last shard partly padding, as SGLang's ParallelLMHead does); the rank's logits are
all-gathered along the vocabulary and trimmed at V, as SGLang's logits processor does.
"""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from nanospec_server.vocab import DynamicVocab
from nanospec_server.vocab.sharded_vocab import ShardedVocab, ShardLayout

HIDDEN, SLOTS, W_CAP, W_MAX = 16, 5, 64, 24


def pinned_tokens(vocab_size: int) -> list[int]:
    """EOS-like tokens in every shard, one the last token of V."""
    return [0, 2, vocab_size * 7 // 10, vocab_size - 1]


def padded_shard_rows(vocab_size: int, ranks: int) -> int:
    """SGLang's ParallelLMHead: V up to a multiple of 64 (of 64 * ranks if that one does
    not split evenly), then equal shards."""
    pad = 64 if -(-vocab_size // 64) * 64 % ranks == 0 else 64 * ranks
    return -(-vocab_size // pad) * pad // ranks


def run_steps(vocabs: list[DynamicVocab], vocab_size: int, seed: int, on_step) -> None:
    """Appends, refreshes, resets and W_max changes from one seed, the same on each
    vocabulary; ``on_step`` after each step."""
    gen = torch.Generator().manual_seed(seed)
    for step in range(12):
        slots = torch.randperm(SLOTS - 1, generator=gen)[:3] + 1
        # Skewed ids: some steps crowd one shard, so one shard's packed rows grow alone.
        high = vocab_size if step % 3 else vocab_size // 3
        tokens = torch.randint(0, high, (3, 20), generator=gen)
        valid = torch.rand(3, 20, generator=gen) < 0.8
        for vocab in vocabs:
            vocab.append(slots, tokens, valid)
            vocab.refresh(slots)
            if step == 5:
                vocab.reset(slots[:1])
            if step == 8:
                vocab.set_w_max(10)
        on_step(slots)


def masked_logits(vocab: DynamicVocab, hidden: torch.Tensor, slots: torch.Tensor, gather):
    rows, _ = vocab.packed_rows(min_rows=4)
    logits = gather(vocab.packed_logits(hidden, rows))
    return vocab.mask_logits_(logits, slots)


def by_token(vocab: DynamicVocab, logits: torch.Tensor) -> list[dict[int, float]]:
    ids = vocab.head.ids[: logits.shape[1]].tolist()
    return [
        {ids[c]: float(row[c]) for c in range(len(ids)) if row[c] != float("-inf")}
        for row in logits
    ]


def _worker(rank: int, size: int, init_file: str, vocab_size: int, capacity, results) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=size)
    torch.manual_seed(0)
    weight = torch.randn(vocab_size, HIDDEN)
    hidden = torch.randn(3, HIDDEN)
    shard_rows = padded_shard_rows(vocab_size, size)
    padded = torch.cat([weight, torch.zeros(shard_rows * size - vocab_size, HIDDEN)])
    local = padded[rank * shard_rows : (rank + 1) * shard_rows]
    layout = ShardLayout(vocab_size, shard_rows, rank, size)
    options = dict(
        w_cap=W_CAP, w_max=W_MAX, always_active=pinned_tokens(vocab_size), union_capacity=capacity
    )
    sharded = ShardedVocab(local, layout, SLOTS, **options)
    full = DynamicVocab(weight, SLOTS, **options)

    def gather(part: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(part) for _ in range(size)]
        dist.all_gather(parts, part)
        return torch.cat(parts, dim=1)[:, :vocab_size]  # SGLang trims at V

    def compare(slots: torch.Tensor) -> None:
        mine = by_token(sharded, masked_logits(sharded, hidden, slots, gather))
        theirs = by_token(full, masked_logits(full, hidden, slots, lambda x: x))
        for got, want in zip(mine, theirs, strict=True):
            assert got.keys() == want.keys()
            for token, value in want.items():
                assert abs(got[token] - value) <= 1e-4 * max(1.0, abs(value))
        assert torch.equal(sharded.active_size(slots), full.active_size(slots))
        assert int(sharded.head.dropped) == 0  # big enough: nothing refused a row
        # Exactly the union's rows are packed, each once, in the shard that owns it.
        packed = sharded.head.ids[sharded.head.ids >= 0].tolist()
        assert sorted(packed) == sorted(set(full.head.ids[full.head.ids >= 0].tolist()))

    run_steps([sharded, full], vocab_size, seed=7, on_step=compare)  # every rank: same steps
    # Every rank holds the same id sets: the gathered column table agrees everywhere.
    tables = [torch.empty_like(sharded.head.ids) for _ in range(size)]
    dist.all_gather(tables, sharded.head.ids)
    results[rank] = all(torch.equal(t, tables[0]) for t in tables)
    dist.destroy_process_group()


@pytest.mark.parametrize(
    ("vocab_size", "ranks", "capacity"),
    [(997, 2, None), (997, 3, 600)],  # 997 is prime: no rank count divides it
)
def test_sharded_head_matches_unsharded_across_processes(vocab_size, ranks, capacity):
    with tempfile.TemporaryDirectory() as tmp, mp.Manager() as manager:
        results = manager.dict()
        init_file = os.path.join(tmp, "rendezvous")
        args = (ranks, init_file, vocab_size, capacity, results)
        mp.spawn(_worker, args=args, nprocs=ranks, join=True)
        assert dict(results) == dict.fromkeys(range(ranks), True)


def test_layout_keeps_live_columns_below_v():
    # 997 over 2 ranks: shards of 512 rows, the second with 485 tokens and 27 padding.
    layout = ShardLayout(997, 512, rank=0, size=2)
    width = layout.width(capacity=997)
    assert width == 512
    assert [layout.capacity(s, width) for s in range(2)] == [512, 485]
    # A smaller capacity: each shard's rows stay within its columns below V.
    width = layout.width(capacity=300)
    assert [layout.capacity(s, width) for s in range(2)] == [300, 300]
    with pytest.raises(ValueError):
        ShardLayout(997, 400, rank=0, size=2)  # shards that do not cover V
