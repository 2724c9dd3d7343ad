"""``scatter_rows``: copy listed rows between tensors. Semantics: ``ops/reference.py``."""

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
