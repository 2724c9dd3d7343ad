"""Triton versions of the ops, one module per kernel (same semantics as ``reference.py``;
``window_refresh`` and ``union_apply`` follow ``WindowState.refresh_reference`` and
``UnionHead.apply_reference`` in ``vocab/``, whose state they update).

They run on CUDA tensors, and on CPU tensors under ``TRITON_INTERPRET=1`` (tests).
"""

from nanospec_server.ops.triton_kernels.packed_logits import packed_logits
from nanospec_server.ops.triton_kernels.packed_topk import packed_topk
from nanospec_server.ops.triton_kernels.scatter_rows import scatter_rows
from nanospec_server.ops.triton_kernels.union_apply import union_apply
from nanospec_server.ops.triton_kernels.window_append import window_append
from nanospec_server.ops.triton_kernels.window_refresh import window_refresh

__all__ = [
    "packed_logits",
    "packed_topk",
    "scatter_rows",
    "union_apply",
    "window_append",
    "window_refresh",
]
