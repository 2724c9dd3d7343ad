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
