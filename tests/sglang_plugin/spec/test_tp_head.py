"""TP helpers that need no process group: top-K_pre over head shards and token maps per
shard, against the unsharded head, with the padded shards SGLang's ParallelLMHead makes."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanospec_server.sglang_plugin.spec.tp_head import ShardedTopk, merge_topk, shard_token_map
from nanospec_server.vocab.candidates import topk_tokens_in_chunks
from nanospec_server.vocab.sharded_vocab import ShardLayout


def shards(weight: torch.Tensor, ranks: int) -> tuple[list[torch.Tensor], list[ShardLayout]]:
    vocab_size = weight.shape[0]
    shard_rows = -(-vocab_size // (64 * ranks)) * 64  # V padded, split evenly
    padded = torch.cat([weight, torch.zeros(shard_rows * ranks - vocab_size, weight.shape[1])])
    layouts = [ShardLayout(vocab_size, shard_rows, rank, ranks) for rank in range(ranks)]
    return [padded[r * shard_rows : (r + 1) * shard_rows] for r in range(ranks)], layouts


@settings(max_examples=25, deadline=None)
@given(
    vocab_size=st.integers(70, 400),
    ranks=st.integers(2, 4),
    k=st.integers(1, 8),
    seed=st.integers(0, 99),
)
def test_sharded_top_k_pre_is_the_unsharded_one(vocab_size, ranks, k, seed):
    gen = torch.Generator().manual_seed(seed)
    # Every real logit < 0: the padding rows' logit 0 would win if they counted.
    weight = -torch.rand(vocab_size, 8, generator=gen) - 0.1
    hidden = torch.rand(5, 8, generator=gen) + 0.1
    locals_, layouts = shards(weight, ranks)
    parts = [ShardedTopk(w, lay).local(hidden, k) for w, lay in zip(locals_, layouts, strict=True)]
    values = torch.cat([v for v, _ in parts], 1)
    ids = torch.cat([i for _, i in parts], 1)
    got = merge_topk(values, ids, k)
    want = topk_tokens_in_chunks(hidden, weight, k)
    assert torch.equal(got.sort(1).values, want.sort(1).values)


def test_token_map_rows_per_shard():
    weight = torch.randn(997, 4)
    token_map = torch.tensor([3, 900, 5, 600, 511, 512, 996])
    locals_, layouts = shards(weight, 2)  # shards of 512 rows; the second holds 485 tokens
    gathered_rows = []
    for local, layout in zip(locals_, layouts, strict=True):
        rows, columns = shard_token_map(local, layout, token_map)
        gathered_rows.append(rows)
    # Shard 0 holds 3 listed tokens, shard 1 holds 4: each rank gets 4 columns.
    assert columns.tolist() == [3, 5, 511, -1, 900, 600, 512, 996]
    rows = torch.cat(gathered_rows)
    listed = columns >= 0
    assert torch.equal(rows[listed], weight[columns[listed]])
    assert torch.count_nonzero(rows[~listed]) == 0
