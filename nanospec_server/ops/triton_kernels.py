"""Triton versions of the ops (same semantics as ``reference.py``).

They run on CUDA tensors, and on CPU tensors under ``TRITON_INTERPRET=1`` (tests).
"""

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _scatter_rows_kernel(
    dst, dst_rows, src, src_rows, hidden, dst_stride, src_stride, dump_row, BLOCK: tl.constexpr
):
    i = tl.program_id(0)
    out_row = tl.load(dst_rows + i)
    if out_row != dump_row:  # masked entries cost one load
        in_row = tl.load(src_rows + i)
        for start in range(0, hidden, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < hidden
            values = tl.load(src + in_row * src_stride + cols, mask=mask)
            tl.store(dst + out_row * dst_stride + cols, values, mask=mask)


def scatter_rows(dst: Tensor, dst_rows: Tensor, src: Tensor, src_rows: Tensor) -> None:
    assert dst.dtype == src.dtype and dst.stride(1) == 1 and src.stride(1) == 1
    count = dst_rows.numel()
    if count:
        block = min(1024, triton.next_power_of_2(dst.shape[1]))
        _scatter_rows_kernel[(count,)](
            dst,
            dst_rows,
            src,
            src_rows,
            dst.shape[1],
            dst.stride(0),
            src.stride(0),
            dst.shape[0] - 1,
            BLOCK=block,
        )


@triton.jit
def _window_append_kernel(
    ring,
    last_pos,
    slots,
    tokens,
    positions,
    valid,
    in_ring,
    total,
    length,
    ring_stride,
    w_cap,
    vocab_stride,
    BLOCK: tl.constexpr,
):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = i < total
    keep = (tl.load(valid + i, mask=live, other=0) != 0) & live
    slot = tl.load(slots + i // length, mask=keep, other=0)
    token = tl.load(tokens + i, mask=keep, other=0)
    position = tl.load(positions + i, mask=keep, other=0)
    ring_write = keep & (tl.load(in_ring + i, mask=keep, other=0) != 0)
    tl.store(ring + slot * ring_stride + position % w_cap, token, mask=ring_write)
    tl.atomic_max(last_pos + slot * vocab_stride + token, position.to(tl.int32), mask=keep)


def window_append(
    ring: Tensor,
    last_pos: Tensor,
    slots: Tensor,
    tokens: Tensor,
    positions: Tensor,
    valid: Tensor,
    in_ring: Tensor,
) -> None:
    assert ring.is_contiguous() and last_pos.is_contiguous()
    batch, length = tokens.shape
    total = batch * length
    if total:
        block = 256
        _window_append_kernel[(triton.cdiv(total, block),)](
            ring,
            last_pos,
            slots.contiguous(),
            tokens.contiguous(),
            positions.contiguous(),
            valid.to(torch.int8).contiguous(),
            in_ring.to(torch.int8).contiguous(),
            total,
            length,
            ring.shape[1],
            ring.shape[1] - 1,
            last_pos.shape[1],
            BLOCK=block,
        )


@triton.jit
def _packed_logits_kernel(
    hidden, rows, count, out, n_rows, n_cols, hidden_size, stride_h, stride_r, stride_o,
    BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    live = tl.load(count)
    acc = tl.full((BLOCK_N, BLOCK_R), float("-inf"), dtype=tl.float32)
    # Tiles past the live row count read no weight: the buffer's capacity costs nothing.
    if tl.program_id(0) * BLOCK_R < live:
        acc = tl.zeros((BLOCK_N, BLOCK_R), dtype=tl.float32)
        for start in range(0, hidden_size, BLOCK_D):
            d = start + tl.arange(0, BLOCK_D)
            h_mask = (n[:, None] < n_rows) & (d[None, :] < hidden_size)
            h = tl.load(hidden + n[:, None] * stride_h + d[None, :], mask=h_mask, other=0.0)
            w_mask = (r[:, None] < live) & (d[None, :] < hidden_size)
            w = tl.load(rows + r[:, None] * stride_r + d[None, :], mask=w_mask, other=0.0)
            acc += tl.dot(h, tl.trans(w))
        acc = tl.where(r[None, :] < live, acc, float("-inf"))
    mask = (n[:, None] < n_rows) & (r[None, :] < n_cols)
    tl.store(out + n[:, None] * stride_o + r[None, :], acc, mask=mask)


def packed_logits(hidden: Tensor, rows: Tensor, count: Tensor) -> Tensor:
    """float32 logits [N, R] of hidden [N, d] against rows[:count]; -inf past ``count``."""
    n_rows, hidden_size = hidden.shape
    capacity = rows.shape[0]
    hidden = hidden.to(rows.dtype).contiguous()
    block_r, block_d = 64, 64
    block_n = max(16, min(64, triton.next_power_of_2(n_rows)))
    out = torch.empty(n_rows, capacity, dtype=torch.float32, device=rows.device)
    grid = (triton.cdiv(capacity, block_r), triton.cdiv(n_rows, block_n))
    _packed_logits_kernel[grid](
        hidden, rows, count, out, n_rows, capacity, hidden_size, hidden.stride(0),
        rows.stride(0), out.stride(0), BLOCK_N=block_n, BLOCK_R=block_r, BLOCK_D=block_d,
    )  # fmt: skip
    return out


@triton.jit
def _window_refresh_kernel(
    ring, length, last_pos, members, in_set, slots, free_list,
    enter_tokens, enter, leave_tokens, leave,
    w_max, w_cap, ring_stride, vocab_stride, BLOCK: tl.constexpr,
):  # fmt: skip
    """One program per slot: WindowState.refresh (leave, free list, enter) in three passes
    over the slot's W_cap table entries and ring columns; ``w_max`` holds one per slot."""
    b = tl.program_id(0)
    slot = tl.load(slots + b)
    end = tl.load(length + slot)
    start = tl.maximum(end - tl.load(w_max + b), 0)
    state = slot * ring_stride  # members and ring share the [S, W_cap + 1] layout
    lp_row = last_pos + slot * vocab_stride
    in_row = in_set + slot * vocab_stride
    out = b * w_cap
    # Leave: members whose latest occurrence fell out of the window.
    for first in range(0, w_cap, BLOCK):
        j = first + tl.arange(0, BLOCK)
        inside = j < w_cap
        token = tl.load(members + state + j, mask=inside, other=-1)
        held = token >= 0
        safe = tl.where(held, token, 0)
        latest = tl.load(lp_row + safe, mask=held, other=0)
        gone = held & (latest < start)
        tl.store(leave_tokens + out + j, safe, mask=inside)
        tl.store(leave + out + j, gone.to(tl.int8), mask=inside)
        tl.store(in_row + safe, tl.zeros_like(safe).to(tl.int8), mask=gone)
        tl.store(members + state + j, tl.full([BLOCK], -1, tl.int64), mask=gone)
    tl.debug_barrier()
    # The free table entries, in order.
    free_seen = 0
    for first in range(0, w_cap, BLOCK):
        j = first + tl.arange(0, BLOCK)
        inside = j < w_cap
        free = inside & (tl.load(members + state + j, mask=inside, other=0) < 0)
        rank = free_seen + tl.cumsum(free.to(tl.int32), 0) - 1
        tl.store(free_list + out + rank, j.to(tl.int64), mask=free)
        free_seen += tl.sum(free.to(tl.int32), 0)
    tl.debug_barrier()
    # Enter: distinct window tokens (each counted at its latest position) not yet members;
    # the k-th takes the k-th free entry.
    entered = 0
    for first in range(0, w_cap, BLOCK):
        c = first + tl.arange(0, BLOCK)
        inside = c < w_cap
        back = ((end - 1 - c) % w_cap + w_cap) % w_cap  # floor modulo, as in torch
        position = end - 1 - back
        token = tl.load(ring + state + c, mask=inside, other=0)
        latest = tl.load(lp_row + token, mask=inside, other=-2)
        member = tl.load(in_row + token, mask=inside, other=1) != 0
        new = inside & (position >= start) & (latest == position) & ~member
        rank = entered + tl.cumsum(new.to(tl.int32), 0) - 1
        entry = tl.load(free_list + out + rank, mask=new, other=0)
        tl.store(members + state + entry, token, mask=new)
        tl.store(in_row + token, tl.full([BLOCK], 1, tl.int8), mask=new)
        tl.store(enter_tokens + out + c, token, mask=inside)
        tl.store(enter + out + c, new.to(tl.int8), mask=inside)
        entered += tl.sum(new.to(tl.int32), 0)


def window_refresh(
    ring: Tensor, length: Tensor, last_pos: Tensor, members: Tensor, in_set: Tensor,
    slots: Tensor, w_max: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """WindowState.refresh in one launch: updates ``members``/``in_set`` of ``slots`` and
    returns the diff (enter_tokens, enter, leave_tokens, leave), each [B, W_cap].
    ``w_max``: [B] int64, the window length of each row of ``slots``."""
    assert ring.is_contiguous() and members.is_contiguous() and in_set.is_contiguous()
    assert w_max.shape == slots.shape and w_max.dtype == torch.int64 and w_max.is_contiguous()
    batch, w_cap = len(slots), ring.shape[1] - 1
    device = ring.device
    enter_tokens = torch.empty(batch, w_cap, dtype=torch.int64, device=device)
    leave_tokens = torch.empty(batch, w_cap, dtype=torch.int64, device=device)
    enter = torch.empty(batch, w_cap, dtype=torch.int8, device=device)
    leave = torch.empty(batch, w_cap, dtype=torch.int8, device=device)
    free_list = torch.empty(batch, w_cap, dtype=torch.int64, device=device)
    if batch:
        _window_refresh_kernel[(batch,)](
            ring, length, last_pos, members, in_set.view(torch.int8), slots.contiguous(),
            free_list, enter_tokens, enter, leave_tokens, leave,
            w_max, w_cap, ring.shape[1], last_pos.shape[1],
            BLOCK=min(1024, triton.next_power_of_2(max(w_cap, 16))),
        )  # fmt: skip
    return enter_tokens, enter.bool(), leave_tokens, leave.bool()
