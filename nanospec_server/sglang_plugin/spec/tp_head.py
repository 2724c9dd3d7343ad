"""NanoSpec's draft heads at ``--tp-size`` >= 2: the pieces that know SGLang's sharding.

SGLang's LM heads are vocab-parallel (``ParallelLMHead``): rank r holds rows
``[r*P, (r+1)*P)`` of V padded to equal shards, multiplies its own rows, and the logits
processor all-gathers the columns and trims those past V. An EAGLE-2 draft shares the
target's shard. So at TP >= 2:

- dynamic modes: ``vocab.sharded_vocab.ShardedVocab`` packs each rank's own rows;
- static mode (FR-Spec token map): each rank keeps the map's tokens that fall in its shard
  (SGLang's own pruning indexes the local shard with global ids), and
  the gathered columns are mapped back through a table with -1 for padding columns;
- top-K_pre at prefill: each rank's top-k of its shard, all-gathered, then the global one.

Every table here is built once at load from values all ranks share (the shard layout and
the token map); the per-step work is fixed-shape tensor code plus SGLang's own gathers.
"""

from __future__ import annotations

import copy

import torch
from sglang.srt.runtime_context import get_parallel
from torch import Tensor

from nanospec_server.vocab.sharded_vocab import ShardLayout


def tp_size() -> int:
    return get_parallel().tp_size


def layout_of(lm_head, vocab_size: int) -> ShardLayout:
    """The shard layout of a ``ParallelLMHead`` on this rank (``vocab_size``: V)."""
    parallel = get_parallel()
    shard_rows = lm_head.weight.shape[0]
    start = lm_head.shard_indices.org_vocab_start_index
    if start != parallel.tp_rank * shard_rows:  # added vocabulary (LoRA) shifts shards
        raise ValueError(
            f"--tp-size {parallel.tp_size}: NanoSpec expects equal vocabulary shards; "
            f"rank {parallel.tp_rank} starts at row {start}, not {parallel.tp_rank * shard_rows}"
        )
    return ShardLayout(vocab_size, shard_rows, parallel.tp_rank, parallel.tp_size)


def all_gather_last_dim(tensor: Tensor) -> Tensor:
    """Concatenate every TP rank's ``tensor`` along the last dimension (rank order)."""
    from sglang.srt.distributed import tensor_model_parallel_all_gather

    return tensor_model_parallel_all_gather(tensor.contiguous(), dim=-1)


class ShardedTopk:
    """Top-k token ids of the target's head when each rank holds one shard of it: each
    rank's top-k of its shard (``local``), all-gathered, then the top-k of those
    (``merge_topk``)."""

    def __init__(self, local_weight: Tensor, layout: ShardLayout, chunk: int = 256):
        self.rows = local_weight[: layout.real_rows(layout.rank)]  # padding rows: no tokens
        self.start, self.chunk = layout.start(layout.rank), chunk

    def __call__(self, hidden: Tensor, k: int) -> Tensor:
        out = []
        for begin in range(0, hidden.shape[0], self.chunk):
            values, ids = self.local(hidden[begin : begin + self.chunk], k)
            out.append(merge_topk(all_gather_last_dim(values), all_gather_last_dim(ids), k))
        return torch.cat(out) if out else hidden.new_zeros(0, k, dtype=torch.int64)

    def local(self, hidden: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """(logits [T, k], token ids [T, k]) of this shard's top-k; every rank sends k
        candidates, a shard with fewer tokens pads with -inf, which never wins."""
        logits = (hidden.to(self.rows.dtype) @ self.rows.T).float()
        local_k = min(k, logits.shape[1])
        values, index = logits.topk(local_k, dim=-1)
        if local_k < k:
            fill = values.new_full((len(values), k - local_k), -torch.inf)
            values = torch.cat([values, fill], 1)
            index = torch.cat([index, index.new_zeros(len(index), k - local_k)], 1)
        return values, index + self.start


def merge_topk(values: Tensor, ids: Tensor, k: int) -> Tensor:
    """The top-k token ids among every rank's candidates ([T, tp * k] each)."""
    return ids.gather(1, values.topk(k, dim=-1).indices)


def shard_token_map(local_weight: Tensor, layout: ShardLayout, token_map: Tensor):
    """FR-Spec's list on a sharded head: (this rank's rows [width, d], the token of each
    gathered column, -1 for padding). Every rank gets ``width`` = the largest number of
    listed tokens in one shard, so the gathered width is ``tp * width``."""
    token_map = token_map.to(local_weight.device, torch.int64)
    shard_of = token_map // layout.shard_rows
    counts = torch.bincount(shard_of, minlength=layout.size)
    width = max(int(counts.max()), 1)
    if layout.size * width > layout.vocab_size:
        raise ValueError(
            f"--speculative-token-map: {int(counts.max())} of its tokens fall in one of "
            f"{layout.size} vocabulary shards; at --tp-size {layout.size} one shard may hold "
            f"at most {layout.vocab_size // layout.size}"
        )
    columns = torch.full((layout.size * width,), -1, dtype=torch.int64, device=token_map.device)
    for shard in range(layout.size):
        mine = token_map[shard_of == shard]
        columns[shard * width : shard * width + len(mine)] = mine
    own = columns[layout.rank * width : (layout.rank + 1) * width]
    rows = local_weight.new_zeros(width, local_weight.shape[1])
    listed = own >= 0
    rows[listed] = local_weight[own[listed] - layout.start(layout.rank)]
    return rows, columns


def replace_head_rows(draft_model, rows: Tensor) -> None:
    """Give the draft model an LM head of ``rows`` (a copy: the module may be shared with
    the target, or be the embedding, which must keep every row)."""
    head = copy.copy(draft_model.lm_head)
    head._parameters = dict(head._parameters)  # a shallow copy would share the weight slot
    head.weight = torch.nn.Parameter(rows.contiguous(), requires_grad=False)
    draft_model.lm_head = head


def mask_padding_columns_(logits: Tensor, columns: Tensor) -> Tensor:
    """-inf on gathered columns that stand for no token (``columns`` -1)."""
    return logits.masked_fill_(columns[: logits.shape[-1]] < 0, float("-inf"))
