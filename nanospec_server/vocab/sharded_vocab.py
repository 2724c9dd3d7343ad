"""The packed draft head under tensor parallelism: each rank packs its own shard's rows.

A vocab-parallel LM head gives rank r the rows ``[r*P, (r+1)*P)`` of V (the vocabulary
padded so that the ranks get equal shards, the last one partly padding). Design (the cost
estimate is in docs/design.md, "Tensor parallelism"):

- **Bookkeeping replicated, rows sharded.** Every rank keeps the windows of every slot
  over all of V, and one ``UnionHead`` per shard: reference counts, the packed order and
  the live count of every shard. All ranks see the same appends (the same accepted
  tokens), so they hold the same id sets without exchanging any; only rank r's own shard
  head holds weight rows (the others have rows of width 0).
- **Local logits, one gather.** Rank r multiplies its packed rows only, ``width`` columns
  of them; SGLang's logits processor all-gathers the columns of all ranks as it does for
  a full head, giving ``[N, tp * width]``. ``ids`` names the token of every gathered
  column (-1: free), so the per-request mask, the global top-k and the softmax normaliser
  run over the gathered columns exactly as over the unsharded packed head.
- **Fixed shapes.** ``width`` is the same on every rank and at every step; each shard's
  capacity keeps its columns below V, because SGLang trims gathered columns past V (its
  head padding) and a live row there would be lost.

The refresh applies each shard's part of the window diff with the torch bookkeeping of
``UnionHead`` (fixed shapes, no host sync), on tokens translated to shard-local ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from nanospec_server import ops
from nanospec_server.ops import bitmap
from nanospec_server.vocab.dynamic_vocab import DynamicVocab
from nanospec_server.vocab.union_head import UnionHead
from nanospec_server.vocab.window import WindowDiff


@dataclass(frozen=True)
class ShardLayout:
    """Which rows of V each rank's head holds: ``[r * shard_rows, (r+1) * shard_rows)``."""

    vocab_size: int  # V, without padding
    shard_rows: int  # P, padding included
    rank: int
    size: int

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size or self.shard_rows * self.size < self.vocab_size:
            raise ValueError(f"bad shard layout {self}")

    def start(self, shard: int) -> int:
        return shard * self.shard_rows

    def real_rows(self, shard: int) -> int:
        """Rows of shard ``shard`` that are tokens (the rest is padding)."""
        return max(0, min(self.shard_rows, self.vocab_size - self.start(shard)))

    def width(self, capacity: int) -> int:
        """Packed columns per rank for a union capacity: a shard never needs more rows
        than its own tokens, and ``size * width`` must not pass V by more than the last
        shard's own padding columns (SGLang trims past V)."""
        return max(min(capacity, self.shard_rows), 1)

    def capacity(self, shard: int, width: int) -> int:
        """Rows shard ``shard`` may fill: its tokens, within its columns below V."""
        below_v = self.vocab_size - shard * width
        return max(0, min(width, self.real_rows(shard), below_v))


class ShardedUnionHead:
    """One ``UnionHead`` per shard, bookkept on every rank; rows only for this rank's.

    Quacks like ``UnionHead`` for ``DynamicVocab``: ``buf`` and ``count`` are this rank's,
    ``ids`` is the token of every gathered column SGLang keeps, ``dropped``/``overflows`` sum all shards.
    """

    def __init__(
        self,
        local_weight: Tensor,
        layout: ShardLayout,
        capacity: int,
        pinned: Sequence[int],
        device: torch.device,
    ):
        self.layout, self.width = layout, layout.width(capacity)
        self.vocab_size, hidden = layout.vocab_size, local_weight.shape[1]
        self.shards: list[UnionHead] = []
        for shard in range(layout.size):
            start, real = layout.start(shard), layout.real_rows(shard)
            local_pinned = [p - start for p in pinned if start <= p < start + real]
            rows = layout.capacity(shard, self.width)
            if len(local_pinned) > rows:
                raise ValueError(
                    f"shard {shard} holds {len(local_pinned)} always-active tokens but only "
                    f"{rows} packed rows; raise --nanospec-union-capacity"
                )
            own = shard == layout.rank
            # Other shards' heads: bookkeeping only, rows of width 0 (no memory).
            # A shard of padding only still gets one (never used) row: no empty tables.
            real = max(real, 1)
            weight = local_weight[:real] if own else local_weight.new_empty(real, 0)
            self.shards.append(UnionHead(weight, rows, local_pinned, device))
        own = self.shards[layout.rank]
        if own.buf.shape[0] < self.width:  # every rank returns `width` columns
            own.buf = torch.cat([own.buf, own.buf.new_zeros(self.width - own.buf.shape[0], hidden)])
        self.buf, self.count, self.weight = own.buf, own.count, local_weight
        self.capacity = self.width
        self.num_pinned = len(set(pinned))
        # One entry per gathered column that SGLang keeps (it trims those past V).
        columns = min(layout.size * self.width, layout.vocab_size)
        self.ids = torch.full((columns,), -1, dtype=torch.int64, device=device)
        self._update_ids()
        # Pinned rows never move: their columns are allowed for every request.
        self.pinned_columns = torch.zeros_like(self.ids, dtype=torch.bool)
        for shard, head in enumerate(self.shards):
            self.pinned_columns[shard * self.width : shard * self.width + head.num_pinned] = True

    @property
    def dropped(self) -> Tensor:
        return sum(head.dropped for head in self.shards)

    @property
    def overflows(self) -> Tensor:
        return sum(head.overflows for head in self.shards)

    def nbytes(self) -> int:
        return sum(head.nbytes() for head in self.shards) + self.ids.numel() * 8

    def own_ids(self) -> Tensor:
        """The tokens of this rank's columns (-1: free)."""
        start = self.layout.rank * self.width
        return self.ids[start : start + self.width]

    def apply(self, diff: WindowDiff, row_token_ids: Tensor) -> None:
        for shard, head in enumerate(self.shards):
            head.apply_reference(_shard_diff(diff, self.layout.start(shard), head.vocab_size))
        self._update_ids()
        torch.clamp(self.ids, min=0, out=row_token_ids)

    def _update_ids(self) -> None:
        for shard, head in enumerate(self.shards):
            ids = head.ids[: head.capacity]
            column = shard * self.width
            token = torch.where(ids >= 0, ids + self.layout.start(shard), -1)
            self.ids[column : column + head.capacity] = token


def _shard_diff(diff: WindowDiff, start: int, rows: int) -> WindowDiff:
    """The part of ``diff`` whose tokens lie in ``[start, start + rows)``, in local ids."""

    def local(tokens: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        inside = (tokens >= start) & (tokens < start + rows)
        return (tokens - start).clamp(0, max(rows - 1, 0)), mask & inside

    enter_tokens, enter = local(diff.enter_tokens, diff.enter)
    leave_tokens, leave = local(diff.leave_tokens, diff.leave)
    return WindowDiff(diff.slots, enter_tokens, enter, leave_tokens, leave)


class ShardedVocab(DynamicVocab):
    """``DynamicVocab`` for one rank of a vocab-parallel head (``lm_head_weight`` is the
    rank's shard, padding rows included). ``packed_rows`` + ``packed_logits`` give this
    rank's ``[N, width]`` logits; after the all-gather, ``mask_logits_`` and
    ``row_token_ids`` work on the gathered columns."""

    def __init__(self, lm_head_weight: Tensor, layout: ShardLayout, num_slots: int, **kwargs):
        self.layout = layout
        super().__init__(lm_head_weight, num_slots, vocab_size=layout.vocab_size, **kwargs)

    def _make_head(self, weight: Tensor, capacity: int) -> ShardedUnionHead:
        return ShardedUnionHead(weight, self.layout, capacity, self.always_active, self.device)

    def _cpu_kernels(self) -> None:
        return None  # the fused C++ refresh updates one unsharded head

    @property
    def fuses_topk(self) -> bool:
        return False  # the top-k runs over the gathered columns of every rank

    def packed_topk(self, hidden: Tensor, row_slots: Tensor, k: int) -> tuple[Tensor, Tensor]:
        raise NotImplementedError("a sharded head's top-k runs after the logits all-gather")

    def packed_rows(self, min_rows: int = 1) -> tuple[Tensor, Tensor]:
        """This rank's packed rows, always ``width`` of them (the gather needs one width
        on every rank; rows past the count come back as -inf), and their tokens."""
        self._wait_for_refresh()
        return self.head.buf[: self.head.width], self.head.own_ids()

    def _note_rows_read(self, rows: Tensor) -> None:
        """Rows the TP group multiplies: every shard's live rows where the kernel skips
        the rest (each rank knows every shard's count), else every rank's full width."""
        if self.static_shapes and not ops.packed_logits_reads_live_rows_only(rows):
            self._rows_read = self.layout.size * self.head.width
        else:
            self._rows_read = sum(head.count for head in self.head.shards).clone()

    def _allowed(self, ids: Tensor, row_slots: Tensor) -> Tensor:
        rows = row_slots.to(self.device, torch.int64).unsqueeze(1)
        allowed = bitmap.test(self.window.in_set, rows, ids.clamp(min=0)) & (ids >= 0)
        return allowed | self.head.pinned_columns[: len(ids)]
