"""The packed LM head shared by all live requests: one union buffer, kept compact.

``buf[:count]`` holds the LM-head rows of every token that is active in at least one slot
(plus the always-active tokens, pinned in rows ``[0, num_pinned)``); ``ids[j]`` is the
global id of row j and ``row_of[v]`` the row of token v. ``ref[v]`` counts the slots whose
active set holds v. A refresh applies a batch of window diffs:

1. ref += enters - leaves;
2. tokens whose ref dropped to 0 free their rows, tokens whose ref rose from 0 need one;
3. the buffer is kept dense: rows of new tokens go first into the holes below the new
   count, then past the old count; live rows stranded above the new count move down into
   the remaining holes. Only new tokens are gathered from the weight, plus those moves.

So the rows read per step are ``count = |union of I_r| <= min(V, sum_r |I_r|)`` (+ pinned).
All of it is fixed-shape tensor code: no host sync, capturable in a CUDA graph.

The buffer holds ``capacity`` rows, which may be fewer than a step's union. New tokens
that find no row are *not admitted*: they keep their reference count but no row, so no
request can draft them (the target still verifies every token, so output is unchanged);
``dropped`` counts them and ``overflows`` the refreshes where it happened. A token
without a row is offered a row again whenever a later diff touches it (it enters or
leaves another window).
"""

from collections.abc import Sequence

import torch
from torch import Tensor

from nanospec_server import ops
from nanospec_server.vocab.window import WindowDiff


class UnionHead:
    def __init__(
        self,
        weight: Tensor,
        capacity: int,
        pinned: Sequence[int],
        device: torch.device,
    ):
        vocab_size, hidden = weight.shape
        self.weight, self.vocab_size, self.capacity = weight, vocab_size, capacity
        self.buf = torch.zeros(capacity + 1, hidden, dtype=weight.dtype, device=device)  # +1: dump
        self.ids = torch.full((capacity + 1,), -1, dtype=torch.int64, device=device)
        self.row_of = torch.full((vocab_size + 1,), -1, dtype=torch.int64, device=device)
        self.ref = torch.zeros(vocab_size + 1, dtype=torch.int32, device=device)
        # Scratch for picking one representative among duplicate tokens of a batch.
        self.owner = torch.full((vocab_size + 1,), 2**62, dtype=torch.int64, device=device)
        pinned_ids = torch.tensor(sorted(set(pinned)), dtype=torch.int64, device=device)
        self.num_pinned = len(pinned_ids)
        rows = torch.arange(self.num_pinned, device=device)
        self.ids[rows] = pinned_ids
        self.row_of[pinned_ids] = rows
        self.ref[pinned_ids] = 1  # a reference nobody releases: pinned rows never move
        self.buf[rows] = weight[pinned_ids]
        self.count = torch.full((1,), self.num_pinned, dtype=torch.int64, device=device)
        self.dropped = torch.zeros(1, dtype=torch.int64, device=device)  # tokens not admitted
        self.overflows = torch.zeros(1, dtype=torch.int64, device=device)  # refreshes that did

    @staticmethod
    def bytes_for(vocab_size: int, capacity: int, hidden: int, element_size: int) -> int:
        rows = (capacity + 1) * (hidden * element_size + 8)  # buf, ids
        return rows + (vocab_size + 1) * (8 + 4 + 8) + 3 * 8  # row_of, ref, owner; counters

    def nbytes(self) -> int:
        tensors = (self.buf, self.ids, self.row_of, self.ref, self.owner, self.count)
        tensors += (self.dropped, self.overflows)
        return sum(t.numel() * t.element_size() for t in tensors)

    def _first_of_each_token(self, tokens: Tensor) -> Tensor:
        """Mask keeping one entry per distinct token of ``tokens`` (1-D)."""
        index = torch.arange(len(tokens), device=tokens.device)
        self.owner.scatter_reduce_(0, tokens, index, "amin")
        first = self.owner[tokens] == index
        self.owner[tokens] = 2**62
        return first

    def apply(self, diff: WindowDiff, row_token_ids: Tensor) -> None:
        """Apply a batch of window diffs; ``row_token_ids`` (ids clamped at 0) follows.

        With a compact diff (the fused window refresh) one Triton kernel does the
        bookkeeping, visiting only the changed tokens; ``apply_reference`` is its torch
        reference and the path elsewhere."""
        state = (self.ref, self.owner, self.row_of, self.ids, row_token_ids, self.count)
        state += (self.dropped, self.overflows, self.buf, self.weight)
        if diff.compact is not None and ops.union_apply(diff.compact, *state):
            return
        self.apply_reference(diff)
        torch.clamp(self.ids, min=0, out=row_token_ids)

    def apply_reference(self, diff: WindowDiff) -> None:
        dump_row, dump_token = self.capacity, self.vocab_size
        tokens = torch.cat([diff.enter_tokens.flatten(), diff.leave_tokens.flatten()])
        delta = torch.cat([diff.enter.flatten().int(), -diff.leave.flatten().int()])
        tokens = torch.where(delta != 0, tokens, dump_token)
        self.ref.index_add_(0, tokens, delta)
        after = self.ref[tokens]
        first = self._first_of_each_token(tokens) & (tokens != dump_token)
        # Held tokens have a row unless they were refused one (buffer full): those retry.
        placed = self.row_of[tokens] >= 0
        gone = first & placed & (after == 0)
        new = first & ~placed & (after > 0)

        # Free the rows of gone tokens.
        gone_rows = torch.where(gone, self.row_of[tokens], dump_row)
        self.ids[gone_rows] = -1
        self.row_of[torch.where(gone, tokens, dump_token)] = -1
        old_count = self.count
        # Past capacity, the last new tokens get the dump row (every hole is filled first).
        new_count = (old_count - gone.sum() + new.sum()).clamp(max=self.capacity)

        # Destinations, in order: holes below the new count, then rows [old, new count).
        n = len(tokens)
        span = torch.arange(n, device=tokens.device)
        destinations = torch.full((n + 1,), dump_row, dtype=torch.int64, device=tokens.device)
        hole = gone & (gone_rows < new_count)
        holes = hole.sum()
        destinations[torch.where(hole, hole.cumsum(0) - 1, n)] = gone_rows
        grow = old_count + span < new_count
        destinations[torch.where(grow, holes + span, n)] = old_count + span
        # Live rows in [new count, old count) must move down (at most n of them).
        stranded_rows = (new_count + span).clamp(max=dump_row)
        stranded = (new_count + span < old_count) & (self.ids[stranded_rows] >= 0)
        new_rank = new.cumsum(0) - 1
        move_rank = new.sum() + stranded.cumsum(0) - 1
        new_rows = torch.where(new, destinations[new_rank.clamp(0, n)], dump_row)
        move_rows = torch.where(stranded, destinations[move_rank.clamp(0, n)], dump_row)

        # Moves read rows the new tokens never write (sources >= new count > destinations).
        moved_ids = torch.where(stranded, self.ids[stranded_rows], dump_token)
        ops.scatter_rows(self.buf, move_rows, self.buf, stranded_rows)
        self.ids[torch.where(stranded, stranded_rows, dump_row)] = -1
        self.ids[move_rows] = moved_ids
        self.row_of[moved_ids] = move_rows
        ops.scatter_rows(self.buf, new_rows, self.weight, tokens.clamp(max=dump_token - 1))
        admitted = new & (new_rows != dump_row)
        self.ids[new_rows] = torch.where(new, tokens, -1)
        self.row_of[torch.where(admitted, tokens, dump_token)] = new_rows
        self.ids[dump_row] = -1
        self.row_of[dump_token] = -1
        self.count.copy_(new_count)
        self.record_dropped((new & ~admitted).sum())

    def record_dropped(self, tokens: Tensor | int) -> None:
        self.dropped += tokens
        self.overflows += torch.as_tensor(tokens, device=self.dropped.device) > 0
