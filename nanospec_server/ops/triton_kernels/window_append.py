"""``window_append``: write stream tokens into their slots' rings. Semantics: ``ops/reference.py``."""

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _ring_supersede_kernel(
    ring, latest, slots, tokens, in_ring, length, ring_stride, w_cap,
    BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr,
):  # fmt: skip
    """Program (row b, block of ring cells): a cell whose token is among row b's appended
    tokens loses its ``latest`` flag (cells about to be overwritten too: no matter)."""
    b = tl.program_id(0)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    inside = c < w_cap
    state = tl.load(slots + b) * ring_stride
    old = tl.load(ring + state + c, mask=inside, other=-1).to(tl.int64)
    hit = tl.zeros((BLOCK_C,), tl.int32)
    for first in range(0, length, BLOCK_T):
        t = first + tl.arange(0, BLOCK_T)
        keep = (t < length) & (tl.load(in_ring + b * length + t, mask=t < length, other=0) != 0)
        token = tl.load(tokens + b * length + t, mask=keep, other=0)
        token = tl.where(keep, token, -2)  # -2: matches no cell (stale cells hold >= 0)
        same = (old[:, None] == token[None, :]).to(tl.int32)
        hit = tl.maximum(hit, tl.max(same, axis=1))
    flag = tl.load(latest + state + c, mask=inside, other=0)
    tl.store(latest + state + c, tl.where(hit > 0, 0, flag).to(tl.int8), mask=inside)


@triton.jit
def _ring_write_kernel(
    ring, latest, slots, tokens, positions, in_ring, length, ring_stride, w_cap,
    BLOCK_T: tl.constexpr,
):  # fmt: skip
    """Program (row b, block of appended tokens): write them into the ring, each flagged
    iff no later token of the row is the same. Runs after ``_ring_supersede_kernel``."""
    b = tl.program_id(0)
    i = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    keep = (i < length) & (tl.load(in_ring + b * length + i, mask=i < length, other=0) != 0)
    state = tl.load(slots + b) * ring_stride
    token = tl.load(tokens + b * length + i, mask=keep, other=-2)
    position = tl.load(positions + b * length + i, mask=keep, other=0)
    later = tl.zeros((BLOCK_T,), tl.int32)
    for first in range(tl.program_id(1) * BLOCK_T, length, BLOCK_T):
        j = first + tl.arange(0, BLOCK_T)
        j_keep = (j < length) & (tl.load(in_ring + b * length + j, mask=j < length, other=0) != 0)
        other = tl.load(tokens + b * length + j, mask=j_keep, other=0)
        other = tl.where(j_keep, other, -3)
        same = (token[:, None] == other[None, :]) & (j[None, :] > i[:, None])
        later = tl.maximum(later, tl.max(same.to(tl.int32), axis=1))
    cell = state + position % w_cap
    tl.store(ring + cell, token.to(tl.int32), mask=keep)
    tl.store(latest + cell, (later == 0).to(tl.int8), mask=keep)


def window_append(
    ring: Tensor,
    latest: Tensor,
    slots: Tensor,
    tokens: Tensor,
    positions: Tensor,
    in_ring: Tensor,
) -> None:
    """``reference.window_append`` in two launches: flags of superseded cells (grid rows x
    cell blocks), then the new cells (grid rows x token blocks). Fixed grid for a given
    [B, L]: graph-capturable."""
    assert ring.is_contiguous() and latest.is_contiguous() and ring.dtype == torch.int32
    batch, length = tokens.shape
    if batch * length == 0:
        return
    w_cap = ring.shape[1] - 1
    slots, tokens = slots.contiguous(), tokens.to(torch.int64).contiguous()
    in_ring = in_ring.to(torch.int8).contiguous()
    flags = latest.view(torch.int8)
    block_c, block_t = 128, 64
    _ring_supersede_kernel[(batch, triton.cdiv(w_cap, block_c))](
        ring, flags, slots, tokens, in_ring, length, ring.shape[1], w_cap,
        BLOCK_C=block_c, BLOCK_T=block_t,
    )  # fmt: skip
    _ring_write_kernel[(batch, triton.cdiv(length, block_t))](
        ring, flags, slots, tokens, positions.contiguous(), in_ring, length, ring.shape[1],
        w_cap, BLOCK_T=block_t,
    )  # fmt: skip
