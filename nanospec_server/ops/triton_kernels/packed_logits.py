"""``packed_logits``: float32 logits against the live packed rows. Semantics: ``ops/reference.py``."""

import torch
import triton
import triton.language as tl
from torch import Tensor


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
