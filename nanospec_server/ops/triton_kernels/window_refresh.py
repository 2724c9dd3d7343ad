"""``window_refresh``: WindowState.refresh in one kernel. Semantics: ``ops/reference.py``."""

import torch
import triton
import triton.language as tl
from torch import Tensor

from nanospec_server.ops.triton_kernels.bitmap import word_and_bit


@triton.jit
def _window_refresh_kernel(
    ring, latest, length, members, in_set, slots, free_list,
    enter_tokens, enter, leave_tokens, leave, enter_list, leave_list, list_lengths,
    w_max, w_cap, ring_stride, words_stride, BLOCK: tl.constexpr,
):  # fmt: skip
    """One program per slot: WindowState.refresh_reference in four passes over the slot's
    W_cap ring cells and table entries, with barriers between:
    1. window tokens (flagged cells in the window): clear their bits, and those whose bit
       was clear enter;
    2. members whose bit is still set left: free their entries;
    3. the free entries, in order;
    4. set the bits of every window token; the k-th entering one takes free entry k.
    Besides the masks, it writes the leaving and entering tokens compacted, in mask order
    (``leave_list[b, :n_leave]``, ``enter_list[b, :n_enter]``, ``list_lengths[b] =
    (n_enter, n_leave)``): the union kernel then visits only tokens that changed.
    ``w_max`` holds one per slot. Bits of one word are changed by atomics: distinct
    tokens of a row can share a word."""
    b = tl.program_id(0)
    slot = tl.load(slots + b)
    end = tl.load(length + slot)
    start = tl.maximum(end - tl.load(w_max + b), 0)
    state = slot * ring_stride  # ring, latest and members share the [S, W_cap + 1] layout
    bits = in_set + slot * words_stride
    out = b * w_cap
    # 1. Window tokens: clear members' bits; the others enter.
    for first in range(0, w_cap, BLOCK):
        c = first + tl.arange(0, BLOCK)
        inside = c < w_cap
        back = ((end - 1 - c) % w_cap + w_cap) % w_cap  # floor modulo, as in torch
        position = end - 1 - back
        token = tl.load(ring + state + c, mask=inside, other=0).to(tl.int64)
        flagged = tl.load(latest + state + c, mask=inside, other=0) != 0
        in_window = inside & flagged & (position >= start)
        word, bit = word_and_bit(token)
        old = tl.atomic_and(bits + word, ~bit, mask=in_window)
        new = in_window & ((old & bit) == 0)
        tl.store(enter_tokens + out + c, token, mask=inside)
        tl.store(enter + out + c, new.to(tl.int8), mask=inside)
    tl.debug_barrier()
    # 2. Leave: members whose bit is still set are not in the window.
    left = 0
    for first in range(0, w_cap, BLOCK):
        j = first + tl.arange(0, BLOCK)
        inside = j < w_cap
        token = tl.load(members + state + j, mask=inside, other=-1).to(tl.int64)
        held = token >= 0
        safe = tl.where(held, token, 0)
        word, bit = word_and_bit(safe)
        # Clearing every member's bit is a no-op for those of the window (already clear);
        # the old word tells which were still set. Atomics only: no cached word is read.
        old = tl.atomic_and(bits + word, ~bit, mask=held)
        gone = held & ((old & bit) != 0)
        tl.store(leave_tokens + out + j, safe, mask=inside)
        tl.store(leave + out + j, gone.to(tl.int8), mask=inside)
        tl.store(members + state + j, tl.full([BLOCK], -1, tl.int32), mask=gone)
        gone_rank = left + tl.cumsum(gone.to(tl.int32), 0) - 1
        tl.store(leave_list + out + gone_rank, safe, mask=gone)
        left += tl.sum(gone.to(tl.int32), 0)
    tl.debug_barrier()
    # 3. The free table entries, in order.
    free_seen = 0
    for first in range(0, w_cap, BLOCK):
        j = first + tl.arange(0, BLOCK)
        inside = j < w_cap
        free = inside & (tl.load(members + state + j, mask=inside, other=0) < 0)
        rank = free_seen + tl.cumsum(free.to(tl.int32), 0) - 1
        tl.store(free_list + out + rank, j.to(tl.int64), mask=free)
        free_seen += tl.sum(free.to(tl.int32), 0)
    tl.debug_barrier()
    # 4. The new sets' bits; entering tokens take the free entries in order.
    entered = 0
    for first in range(0, w_cap, BLOCK):
        c = first + tl.arange(0, BLOCK)
        inside = c < w_cap
        back = ((end - 1 - c) % w_cap + w_cap) % w_cap
        position = end - 1 - back
        token = tl.load(ring + state + c, mask=inside, other=0).to(tl.int64)
        flagged = tl.load(latest + state + c, mask=inside, other=0) != 0
        in_window = inside & flagged & (position >= start)
        word, bit = word_and_bit(token)
        tl.atomic_or(bits + word, bit, mask=in_window)
        new = tl.load(enter + out + c, mask=inside, other=0) != 0
        rank = entered + tl.cumsum(new.to(tl.int32), 0) - 1
        entry = tl.load(free_list + out + rank, mask=new, other=0)
        tl.store(members + state + entry, token.to(tl.int32), mask=new)
        tl.store(enter_list + out + rank, token, mask=new)
        entered += tl.sum(new.to(tl.int32), 0)
    tl.store(list_lengths + 2 * b, entered)
    tl.store(list_lengths + 2 * b + 1, left)


def window_refresh(
    ring: Tensor, latest: Tensor, length: Tensor, members: Tensor, in_set: Tensor,
    slots: Tensor, w_max: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor, tuple[Tensor, Tensor, Tensor]]:  # fmt: skip
    """WindowState.refresh in one launch: updates ``members``/``in_set`` of ``slots`` and
    returns the diff (enter_tokens, enter, leave_tokens, leave), each [B, W_cap], and the
    same changes compacted: (enter_list, leave_list [B, W_cap], lengths [B, 2] int32)."""
    assert ring.is_contiguous() and members.is_contiguous() and in_set.is_contiguous()
    assert in_set.dtype == torch.int32 and members.dtype == ring.dtype == torch.int32
    assert w_max.shape == slots.shape and w_max.dtype == torch.int64 and w_max.is_contiguous()
    batch, w_cap = len(slots), ring.shape[1] - 1
    device = ring.device
    enter_tokens = torch.empty(batch, w_cap, dtype=torch.int64, device=device)
    leave_tokens = torch.empty(batch, w_cap, dtype=torch.int64, device=device)
    enter = torch.empty(batch, w_cap, dtype=torch.int8, device=device)
    leave = torch.empty(batch, w_cap, dtype=torch.int8, device=device)
    free_list = torch.empty(batch, w_cap, dtype=torch.int64, device=device)
    enter_list = torch.empty(batch, w_cap, dtype=torch.int64, device=device)
    leave_list = torch.empty(batch, w_cap, dtype=torch.int64, device=device)
    lengths = torch.zeros(batch, 2, dtype=torch.int32, device=device)
    if batch:
        _window_refresh_kernel[(batch,)](
            ring, latest.view(torch.int8), length, members, in_set, slots.contiguous(),
            free_list, enter_tokens, enter, leave_tokens, leave, enter_list, leave_list, lengths,
            w_max, w_cap, ring.shape[1], in_set.shape[1],
            BLOCK=min(1024, triton.next_power_of_2(max(w_cap, 16))),
        )  # fmt: skip
    compact = (enter_list, leave_list, lengths)
    return enter_tokens, enter.bool(), leave_tokens, leave.bool(), compact
