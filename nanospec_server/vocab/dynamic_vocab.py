"""DynamicVocab: the draft model's LM head restricted to each request's context vocabulary.

Per step, the serving worker calls, for the requests of its batch (``slots``):

    vocab.append(slots, tokens, valid)   # stream candidates, in the documented order
    vocab.refresh(slots)                 # incremental update of the packed head
    probs, ids = vocab.topk(hidden, row_slots, k)

A step that does not draft (a depth-0 step) calls ``append_later`` instead: its append and
refresh wait until something reads those windows or the packed head, and run then for every
step that waited, in one pass (on a CPU).

W_max has two levels: the live setting (``set_w_max``), and a request's own W_max
(``set_request_w_max``, kept on the device per slot), which wins while the slot is held.

See docs/design.md for the definition of the active vocabulary and the design.
"""

from collections.abc import Sequence

import torch
from torch import Tensor

from nanospec_server import ops
from nanospec_server.ops import bitmap
from nanospec_server.vocab.union_head import UnionHead
from nanospec_server.vocab.window import WindowState

# Full windows the default union buffer holds (see default_union_capacity).
UNION_WINDOWS = 8
# Steps ``append_later`` queues before it applies them unasked.
MAX_QUEUED = 64


class DynamicVocab:
    def __init__(
        self,
        lm_head_weight: Tensor,
        num_slots: int,
        w_cap: int = 3072,
        w_max: int = 3072,
        always_active: Sequence[int] = (),
        max_batch: int | None = None,
        device: torch.device | str | None = None,
        static_shapes: bool | None = None,
        overlap: bool = True,
        union_capacity: int | None = None,
        vocab_size: int | None = None,
    ):
        """``num_slots``: window states, slot 0 being padding (appends to it are dropped):
        size it to the most requests running at once, plus one.
        ``union_capacity``: rows of the packed head (default ``default_union_capacity``
        from ``max_batch``, itself defaulting to every slot but 0). A step whose union
        would exceed it stays correct: the new tokens that find no row are not drafted
        and are counted (``overflow_stats``).
        ``static_shapes`` (default: on CUDA) keeps every shape fixed for CUDA graphs.
        ``overlap=False`` runs the CUDA gather on the compute stream (the paper's `sync`
        ablation); on CPU there is nothing to overlap.
        ``vocab_size`` (default: the weight's rows) is V where the weight holds only a
        shard of the head (``ShardedVocab``).
        """
        vocab_size = lm_head_weight.shape[0] if vocab_size is None else vocab_size
        self.device = torch.device(device) if device is not None else lm_head_weight.device
        self.static_shapes = self.device.type == "cuda" if static_shapes is None else static_shapes
        self.vocab_size, self.w_cap = vocab_size, w_cap
        self.always_active = sorted(set(always_active))
        # The live W_max, on the device too so that steps read it without a host copy,
        # and each slot's own W_max (0: the slot follows the live one).
        self.live_w_max = torch.zeros(1, dtype=torch.int64, device=self.device)
        self.request_w_max = torch.zeros(num_slots, dtype=torch.int64, device=self.device)
        self._side_stream, self._refreshed = None, None
        # Appends queued by ``append_later``, in order: (slots [B], ids [B, C], valid [B, C]).
        self._queued: list[tuple[Tensor, Tensor, Tensor]] = []
        self.set_w_max(w_max)
        max_batch = max_batch if max_batch is not None else max(num_slots - 1, 1)
        self.window = WindowState(vocab_size, w_cap, num_slots, self.device)
        num_pinned = len(self.always_active)
        capacity = union_capacity
        if capacity is None:
            capacity = self.default_union_capacity(vocab_size, w_cap, max_batch, num_pinned)
        if not num_pinned <= capacity <= vocab_size:
            raise ValueError(
                f"union_capacity must be in [{num_pinned}, {vocab_size}], got {capacity}"
            )
        weight = lm_head_weight.detach().to(self.device)
        self.head = self._make_head(weight, capacity)
        self._rows_read: Tensor | int = 0
        # CPU: the same state transitions as fused C++ loops (None: the torch path).
        self._cpu = self._cpu_kernels()
        # Vocabulary id of every packed row, free rows reading as 0, kept by the kernels
        # that update the head; ``row_token_ids`` is the same table in token ids: a lookup
        # for callers that map local top-k rows back to token ids (an impossible row is
        # never chosen unless a request has fewer active tokens than k, and then any valid
        # id will do). Here a vocabulary id is a token id; ``DraftVocab`` maps them apart.
        self.row_ids = self.head.ids.clamp(min=0)
        self.row_token_ids = self.row_ids
        if self.device.type == "cuda" and overlap:
            self._side_stream = torch.cuda.Stream(self.device)
            self._refreshed = torch.cuda.Event()

    def _make_head(self, weight: Tensor, capacity: int) -> UnionHead:
        return UnionHead(weight, capacity, self.always_active, self.device)

    def _cpu_kernels(self):
        return ops.cpu_vocab_kernels(self.window, self.head)

    @staticmethod
    def default_union_capacity(vocab_size: int, w_cap: int, max_batch: int, num_pinned: int) -> int:
        """Rows for the union of ``min(max_batch, UNION_WINDOWS)`` full windows: never
        full below that batch, and never a second copy of a large head. Beyond it, requests
        share most tokens (benchmarks/gpu_cost_model.py measures how rarely it fills)."""
        return min(vocab_size, min(max_batch, UNION_WINDOWS) * w_cap + num_pinned)

    # -- per-step path (no host sync on CUDA) -------------------------------------------

    def reset(self, slots: Tensor) -> None:
        self._wait_for_refresh()
        slots = slots.to(self.device, torch.int64).contiguous()
        self._take_queued(slots)  # their streams are forgotten: nothing to apply
        if self._cpu is not None:
            self.head.record_dropped(self._cpu.refresh(slots, self.w_max, release=True))
            torch.clamp(self.head.ids, min=0, out=self.row_ids)
        else:
            self.head.apply(self.window.release(slots), self.row_ids)
        self._rows_changed()
        self.window.reset(slots)
        self.request_w_max[slots] = 0

    def append(self, slots: Tensor, tokens: Tensor, valid: Tensor | None = None) -> None:
        self._wait_for_refresh()
        slots, ids, valid = self._append_args(slots, tokens, valid)
        self.settle(slots)  # a slot's queued entries come first in its stream
        self._write(slots, ids, valid)

    def append_later(self, slots: Tensor, tokens: Tensor, valid: Tensor | None = None) -> None:
        """``append`` then ``refresh`` of these slots, run at the latest when something
        reads their windows or the packed head (``settle``). The steps that do not draft
        leave their entries here: of a long run of them, most of a window's refreshes would
        be read by nothing, and on a CPU one append and one refresh over many steps cost
        about what one step's do (each scans the window once). Elsewhere: at once."""
        if self._cpu is None:
            self.append(slots, tokens, valid)
            self.refresh(slots)
            return
        self._queued.append(self._append_args(slots, tokens, valid))
        if len(self._queued) >= MAX_QUEUED:  # bounded host memory between reads
            self.settle()

    def settle(self, slots: Tensor | None = None) -> None:
        """Apply the queued appends of these slots (None: of every slot), in the order
        they came, and refresh those slots. Every read of a window or of the packed head
        calls this first, so a queued append is never seen half-applied."""
        if (taken := self._take_queued(slots)) is None:
            return
        queued_slots, ids, valid = taken
        # The C++ append applies rows one after another: a slot's rows, in queue order.
        self._write(queued_slots, ids, valid)
        self._refresh_now(queued_slots.unique())

    def _take_queued(self, slots: Tensor | None) -> tuple[Tensor, Tensor, Tensor] | None:
        """Remove the queued rows of these slots (None: of every slot) from the queue and
        return them, in queue order; None if it held none."""
        if not self._queued:
            return None
        queued = _merged(self._queued)
        if slots is None:  # all of it, as it is: no mask to copy through
            self._queued = []
            return queued
        queued_slots, ids, valid = queued
        take = torch.isin(queued_slots, slots.to(self.device))
        if not bool(take.any()):
            self._queued = [queued]  # merged once, kept so
            return None
        rest = ~take
        self._queued = [(queued_slots[rest], ids[rest], valid[rest])] if bool(rest.any()) else []
        return queued_slots[take], ids[take], valid[take]

    def _append_args(
        self, slots: Tensor, tokens: Tensor, valid: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """(slots, vocabulary ids, valid) on the device, slot 0's entries masked."""
        slots = slots.to(self.device, torch.int64).contiguous()
        ids = self._vocab_ids(tokens.to(self.device))
        valid = torch.ones_like(ids, dtype=torch.bool) if valid is None else _to(valid, self.device)
        # Slot 0 is padding (and requests that got no slot): its window stays empty.
        return slots, ids, valid & (slots != 0).unsqueeze(1)

    def _vocab_ids(self, tokens: Tensor) -> Tensor:
        """Token ids as this vocabulary's ids (the same here; ``DraftVocab`` maps them)."""
        return tokens

    def _write(self, slots: Tensor, ids: Tensor, valid: Tensor) -> None:
        if self._cpu is not None:
            self._cpu.append(slots, ids, valid)
        else:
            self.window.append(slots, ids, valid)

    def set_w_max(self, w: int) -> None:
        """The live W_max: every slot without a W_max of its own, from its next refresh."""
        if not 1 <= w <= self.w_cap:
            raise ValueError(f"w_max must be in [1, {self.w_cap}], got {w}")
        self.settle()  # queued appends refresh as they would have, before the change
        self.w_max = int(w)
        self._wait_for_refresh()  # a pending refresh reads the old value
        self.live_w_max.fill_(self.w_max)

    def set_request_w_max(self, slots: Tensor, w_max: Sequence[int]) -> None:
        """Give these slots a W_max of their own (0: follow the live one again), in force
        from their next refresh until ``reset``. Host values: this is admission, not a step."""
        bad = [w for w in w_max if not 0 <= w <= self.w_cap]
        if bad:
            raise ValueError(f"a slot's w_max must be in [0, {self.w_cap}], got {bad[0]}")
        values = torch.tensor(list(w_max), dtype=torch.int64)
        slots = slots.to(self.device, torch.int64)
        self.settle(slots)
        self.request_w_max[slots] = values.to(self.device)

    def w_max_of(self, slots: Tensor) -> Tensor:
        """[B] the W_max in force for each slot: its own, else the live one (device op)."""
        own = self.request_w_max[slots.to(self.device, torch.int64)]
        return torch.where(own > 0, own, self.live_w_max)

    def refresh(self, slots: Tensor) -> None:
        """Apply these slots' window changes to the packed head.

        On CUDA this runs on a side stream, concurrently with whatever the caller launches
        next (the draft backbone); ``topk`` waits for it right before the LM head. The
        fork/join is plain stream/event ordering, so it can be captured in a CUDA graph.
        """
        slots = slots.to(self.device, torch.int64).contiguous()
        self.settle(slots)
        self._refresh_now(slots)

    def _refresh_now(self, slots: Tensor) -> None:
        if self._side_stream is None:
            if self._cpu is not None:
                self.head.record_dropped(self._cpu.refresh(slots, self.w_max_of(slots)))
                torch.clamp(self.head.ids, min=0, out=self.row_ids)
            else:
                self.head.apply(self.window.refresh(slots, self.w_max_of(slots)), self.row_ids)
            self._rows_changed()
            return
        caller = torch.cuda.current_stream(self.device)
        self._side_stream.wait_stream(caller)
        with torch.cuda.stream(self._side_stream):
            self.head.apply(self.window.refresh(slots, self.w_max_of(slots)), self.row_ids)
            self._rows_changed()
            self._refreshed.record(self._side_stream)
        if not torch.cuda.is_current_stream_capturing():  # a graph keeps its inputs alive
            slots.record_stream(self._side_stream)

    def _rows_changed(self) -> None:
        """After every head update, on the stream that made it: keep tables derived from
        ``row_ids`` current (none here: vocabulary ids are token ids)."""

    def topk(self, hidden: Tensor, row_slots: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """Top-k of softmax over each row's active vocabulary: (probs [N, k], global ids)."""
        probs, rows = self.packed_topk(hidden, row_slots, k)
        return probs, self.row_token_ids[rows]

    def packed_topk(self, hidden: Tensor, row_slots: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """Top-k of softmax over each row's active vocabulary: (probs [N, k], packed rows
        [N, k]; ``row_token_ids`` maps them to token ids). Ties go to the lowest packed row.
        Rows with fewer than k active tokens get extra entries with probability 0 and a
        valid (arbitrary) row; a row with none (the padding slot) gets all zeros.

        On CUDA one fused kernel multiplies, masks and selects over the row tiles below the
        device-side count only, with fixed shapes (graphs); no [N, capacity] logits exist.
        """
        self.settle()
        self._wait_for_refresh()
        head = self.head
        # CPU: slice to the live rows (reading the count is free there). CUDA: fixed shapes.
        live = head.capacity if self.static_shapes else int(head.count)
        buf = head.buf[:live]
        slots = row_slots.to(self.device, torch.int64)
        values, rows, lse = ops.packed_topk(
            hidden, buf, head.count, head.ids, self.window.in_set, slots, head.num_pinned, k
        )
        self._note_rows_read(buf)
        # exp(-inf - lse) = 0 for missing entries; a row without any active token has
        # lse = -inf and gives NaN there, which means probability 0 as well.
        return torch.exp(values - lse.unsqueeze(1)).nan_to_num(0.0), rows

    @property
    def fuses_topk(self) -> bool:
        """Whether ``packed_topk`` runs the fused kernel over fixed shapes (the CUDA path;
        CPU tensors too under TRITON_INTERPRET=1), so callers may skip full-width logits."""
        return self.static_shapes and ops.packed_logits_reads_live_rows_only(self.head.buf)

    def packed_rows(self, min_rows: int = 1) -> tuple[Tensor, Tensor]:
        """The packed head rows to multiply by, and their token ids (-1: free row).

        For callers that run the matmul themselves (SGLang's logits processor); pair it
        with ``mask_logits_``. At least ``min_rows`` rows come back (free ones masked), so a
        caller's top-k has k columns even when an active set is smaller than k. Waits for
        a pending refresh.
        """
        self.settle()
        self._wait_for_refresh()
        live = self.head.capacity if self.static_shapes else int(self.head.count)
        rows = min(max(live, min_rows), self.head.capacity)
        return self.head.buf[:rows], self.head.ids[:rows]

    def packed_logits(self, hidden: Tensor, rows: Tensor) -> Tensor:
        """float32 logits of ``hidden`` [N, d] against ``rows`` (a prefix of the packed
        buffer, e.g. from ``packed_rows``), -inf past the live count. On CUDA the Triton
        kernel reads only the rows below the device-side count, so a fixed-shape (graph)
        caller multiplies the live union, not the capacity."""
        self.settle()
        logits = ops.packed_logits(hidden, rows, self.head.count)
        self._note_rows_read(rows)
        return logits

    def _note_rows_read(self, rows: Tensor) -> None:
        live_only = not self.static_shapes or ops.packed_logits_reads_live_rows_only(rows)
        self._rows_read = self.head.count.clone() if live_only else len(rows)

    def mask_logits_(self, logits: Tensor, row_slots: Tensor) -> Tensor:
        """In place: -inf wherever a packed row is not in that logits row's active set."""
        self.settle()
        ids = self.head.ids[: logits.shape[1]]
        return logits.masked_fill_(~self._allowed(ids, row_slots), float("-inf"))

    def _allowed(self, ids: Tensor, row_slots: Tensor) -> Tensor:
        """[N, R]: packed row r (token ``ids[r]``, -1 if free) is in row n's active set."""
        rows = row_slots.to(self.device, torch.int64).unsqueeze(1)
        allowed = bitmap.test(self.window.in_set, rows, ids.clamp(min=0)) & (ids >= 0)
        return allowed | (torch.arange(len(ids), device=self.device) < self.head.num_pinned)

    # -- statistics ---------------------------------------------------------------------

    @property
    def rows_computed(self) -> int:
        """LM-head rows the last topk / packed_logits read (on CUDA this reads a device
        value: stats only; ``rows_read`` keeps it on the device)."""
        return int(self._rows_read)

    @property
    def rows_read(self) -> Tensor | int:
        return self._rows_read

    def active_size(self, slots: Tensor) -> Tensor:
        """|I| per slot: distinct tokens of the current window, plus always-active ones."""
        slots = slots.to(self.device, torch.int64)
        self.settle(slots)
        w_max = self.w_max_of(slots)
        _, in_window = self.window.window_tokens(slots, w_max)
        size = in_window.sum(1)
        if self.always_active:
            pinned = torch.tensor(self.always_active, device=self.device)
            pinned_in_window = self.window.contains(slots, pinned.expand(len(slots), -1), w_max)
            size += len(self.always_active) - pinned_in_window.sum(1)
        return size

    def stream_length(self, slots: Tensor) -> Tensor:
        slots = slots.to(self.device, torch.int64)
        self.settle(slots)
        return self.window.length[slots].clone()

    def contains(self, slots: Tensor, tokens: Tensor) -> Tensor:
        """Membership of ``tokens[b, :]`` in the current active set of ``slots[b]``."""
        slots, tokens = slots.to(self.device, torch.int64), tokens.to(self.device, torch.int64)
        self.settle(slots)
        found = self.window.contains(slots, tokens, self.w_max_of(slots))
        if self.always_active:
            found |= torch.isin(tokens, torch.tensor(self.always_active, device=self.device))
        return found

    def overflow_stats(self) -> dict[str, int]:
        """Tokens not admitted to a full union buffer, and refreshes where that happened
        (reads device counters: for statistics, not the step)."""
        self.settle()
        return {
            "tokens_not_admitted": int(self.head.dropped),
            "overflows": int(self.head.overflows),
        }

    def usage(self) -> dict[str, int]:
        """Packed-head rows in use now and with no request running (the pinned ones), and
        the bytes of one row (reads a device counter: for statistics, not the step)."""
        self.settle()
        head = self.head
        return {
            "union_rows_in_use": int(head.count),
            "union_rows_idle": head.num_pinned,
            "union_bytes_per_row": head.buf.shape[1] * head.buf.element_size() + 8,  # + ids
        }

    def nbytes(self) -> int:
        return self.window.nbytes() + self.head.nbytes()

    def memory_report(self) -> dict[str, int]:
        """Device bytes by part, and the sizes that determine them."""
        head = self.head
        return {
            "window_bytes": self.window.nbytes(),
            "window_bytes_per_slot": WindowState.bytes_per_slot(self.vocab_size, self.w_cap),
            "union_bytes": head.nbytes(),
            "total_bytes": self.nbytes(),
            "slots": self.window.num_slots,
            "union_capacity": head.capacity,
            "vocab_size": self.vocab_size,
            "w_cap": self.w_cap,
        }

    @staticmethod
    def state_bytes(
        vocab_size: int,
        w_cap: int,
        num_slots: int,
        hidden: int,
        element_size: int = 2,
        max_batch: int | None = None,
        num_pinned: int = 0,
        union_capacity: int | None = None,
    ) -> int:
        """Device bytes of a DynamicVocab (``element_size``: bytes of the head's dtype)."""
        max_batch = max_batch if max_batch is not None else max(num_slots - 1, 1)
        capacity = union_capacity
        if capacity is None:
            capacity = DynamicVocab.default_union_capacity(vocab_size, w_cap, max_batch, num_pinned)
        window = num_slots * WindowState.bytes_per_slot(vocab_size, w_cap)
        return window + UnionHead.bytes_for(vocab_size, capacity, hidden, element_size)

    def _wait_for_refresh(self) -> None:
        if self._refreshed is not None:
            torch.cuda.current_stream(self.device).wait_event(self._refreshed)


def _merged(queued: list[tuple[Tensor, Tensor, Tensor]]) -> tuple[Tensor, Tensor, Tensor]:
    """Queued appends as one batch of rows, in queue order (columns padded, invalid)."""
    if len(queued) == 1:
        return queued[0]
    width = max(ids.shape[1] for _, ids, _ in queued)
    slots = torch.cat([s for s, _, _ in queued])
    ids = torch.cat([torch.nn.functional.pad(i, (0, width - i.shape[1])) for _, i, _ in queued])
    valid = torch.cat([torch.nn.functional.pad(v, (0, width - v.shape[1])) for _, _, v in queued])
    return slots, ids, valid


def _to(tensor: Tensor | None, device: torch.device) -> Tensor | None:
    return None if tensor is None else tensor.to(device)
