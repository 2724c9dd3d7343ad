"""Device ops behind plain function names.

CPU tensors use the torch reference (``reference.py``). CUDA tensors use the CUDA C++
extension built from ``kernels/`` on first use, falling back to Triton, then to the
reference if a build fails. ``NANOSPEC_OPS=reference|triton|cuda`` forces a backend.
"""

from torch import Tensor

from nanospec_server.ops import reference
from nanospec_server.ops.backend import cuda_ops, triton_ops


def scatter_rows(dst: Tensor, dst_rows: Tensor, src: Tensor, src_rows: Tensor) -> None:
    if dst.is_cuda:
        if (ext := cuda_ops()) is not None:
            return ext.scatter_rows(dst, dst_rows, src, src_rows)
        if (tri := triton_ops()) is not None:
            return tri.scatter_rows(dst, dst_rows, src, src_rows)
    reference.scatter_rows(dst, dst_rows, src, src_rows)


def window_append(
    ring: Tensor,
    last_pos: Tensor,
    slots: Tensor,
    tokens: Tensor,
    positions: Tensor,
    valid: Tensor,
    in_ring: Tensor,
) -> None:
    args = (ring, last_pos, slots, tokens, positions, valid, in_ring)
    if ring.is_cuda:
        if (ext := cuda_ops()) is not None:
            return ext.window_append(*args)
        if (tri := triton_ops()) is not None:
            return tri.window_append(*args)
    reference.window_append(*args)


def packed_logits(hidden: Tensor, rows: Tensor) -> Tensor:
    return reference.packed_logits(hidden, rows)


__all__ = ["scatter_rows", "window_append", "packed_logits"]
