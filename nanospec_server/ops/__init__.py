"""Device ops behind plain function names.

CUDA tensors use Triton (``scatter_rows`` first tries the CUDA C++ extension built from
``ops/kernels/`` on first use), falling back to the torch reference (``reference.py``) where
neither is available. CPU tensors use the C++ loops of ``ops/kernels/vocab_cpu.cpp`` where
they apply, else the reference.
``NANOSPEC_OPS=reference|cpu|triton|cuda`` allows only that backend (plus the reference).
"""

import torch
from torch import Tensor

from nanospec_server.ops import reference
from nanospec_server.ops.backend import cpu_ops, cuda_ops, triton_interpreting, triton_ops
from nanospec_server.ops.w_max import w_max_per_row


def _triton_for(tensor: Tensor):
    """Triton serves CUDA tensors, and CPU ones under TRITON_INTERPRET=1, where tests run
    the CUDA path's kernels on the CPU."""
    return triton_ops() if tensor.is_cuda or triton_interpreting() else None


def scatter_rows(dst: Tensor, dst_rows: Tensor, src: Tensor, src_rows: Tensor) -> None:
    if dst.is_cuda and (ext := cuda_ops()) is not None:
        return ext.scatter_rows(dst, dst_rows, src, src_rows)
    if (tri := _triton_for(dst)) is not None:
        return tri.scatter_rows(dst, dst_rows, src, src_rows)
    reference.scatter_rows(dst, dst_rows, src, src_rows)


def window_append(
    ring: Tensor, latest: Tensor, slots: Tensor, tokens: Tensor, positions: Tensor,
    in_ring: Tensor,
) -> None:  # fmt: skip
    args = (ring, latest, slots, tokens, positions, in_ring)
    if (tri := _triton_for(ring)) is not None:
        return tri.window_append(*args)
    reference.window_append(*args)


def packed_logits(hidden: Tensor, rows: Tensor, count: Tensor) -> Tensor:
    """float32 logits of ``hidden`` [N, d] against ``rows[:count]``, -inf past ``count``."""
    if (tri := _triton_for(rows)) is not None:
        return tri.packed_logits(hidden, rows, count)
    return reference.packed_logits(hidden, rows, count)


def packed_logits_reads_live_rows_only(rows: Tensor) -> bool:
    """Whether ``packed_logits`` skips the rows past ``count`` (else it reads all of them)."""
    return _triton_for(rows) is not None


def packed_topk(
    hidden: Tensor, rows: Tensor, count: Tensor, ids: Tensor, in_set: Tensor,
    row_slots: Tensor, num_pinned: int, k: int,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """Top-k packed rows of each hidden row's active vocabulary and its log-sum-exp
    (semantics: ``reference.packed_topk``). Where Triton runs, one fused GEMM + running
    top-k that reads only the row tiles below the device-side ``count``."""
    args = (hidden, rows, count, ids, in_set, row_slots, num_pinned, k)
    if (tri := _triton_for(rows)) is not None:
        return tri.packed_topk(*args)
    return reference.packed_topk(*args)


def window_refresh(
    ring: Tensor, latest: Tensor, length: Tensor, members: Tensor, in_set: Tensor,
    slots: Tensor, w_max: int | Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor] | None:  # fmt: skip
    """WindowState.refresh fused in one kernel where Triton runs (its torch code is the
    reference); None elsewhere. ``w_max``: one for all slots, or one per row of slots."""
    if (tri := _triton_for(ring)) is None:
        return None
    w_max = w_max_per_row(w_max, slots)
    return tri.window_refresh(ring, latest, length, members, in_set, slots, w_max)


def union_apply(
    compact: tuple[Tensor, Tensor, Tensor], ref: Tensor, owner: Tensor, row_of: Tensor,
    ids: Tensor, row_token_ids: Tensor, count: Tensor, dropped: Tensor, overflows: Tensor,
    buf: Tensor, weight: Tensor,
) -> bool:  # fmt: skip
    """UnionHead.apply fused (bookkeeping in one launch, row copies in another) where
    Triton runs; False elsewhere (the caller runs its torch reference)."""
    if (tri := _triton_for(buf)) is None:
        return False
    state = (ref, owner, row_of, ids, row_token_ids, count, dropped, overflows, buf, weight)
    tri.union_apply(*compact, *state)
    return True


def _row_topk_kernels(logits: Tensor, k: int):
    """The C++ row top-k where it serves these logits (2-D, float32 or bfloat16, on a CPU,
    k > 0, a compiler at hand), else None."""
    fast = logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.bfloat16)
    return cpu_ops() if fast and logits.dim() == 2 and k > 0 else None


def topk_indices(logits: Tensor, k: int) -> Tensor:
    """Indices [rows, k] of each row's k largest logits, descending. On a CPU (float32 or
    bfloat16) one C++ pass per row, the lowest index first among equal values; elsewhere
    ``torch.topk`` (order among equal values unspecified)."""
    k = min(k, logits.shape[-1])
    if (cpu := _row_topk_kernels(logits, k)) is not None:
        return cpu.topk_rows(logits, k)
    return logits.topk(k, dim=-1).indices


def topk_and_empty_rows(logits: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """`topk_indices`, and per row whether it holds no token to pick: every entry -inf, or
    a NaN (a greedy row's `unsamplable_rows`). On a CPU both come from the one C++ pass
    (the top-1's value and the pass's NaN flags), elsewhere from a second reduction."""
    k = min(k, logits.shape[-1])
    if (cpu := _row_topk_kernels(logits, k)) is not None:
        nan_rows = torch.empty(logits.shape[0], dtype=torch.bool)
        top = cpu.topk_rows(logits, k, nan_rows)
        best = logits.gather(1, top[:, :1]).squeeze(1)
        return top, nan_rows | ~(best > float("-inf"))
    # NaN > -inf is False, so NaN rows count too.
    return topk_indices(logits, k), ~(logits.amax(dim=-1) > float("-inf"))


def cpu_vocab_kernels(window, head):
    """Fused C++ append/refresh for a CPU (window, head) pair, or None where they do not
    apply (CUDA tensors, mixed dtypes, no compiler, or another backend forced)."""
    if (cpu := cpu_ops()) is None or not cpu.CpuVocabKernels.applies(window, head):
        return None
    return cpu.CpuVocabKernels(window, head)


__all__ = [
    "scatter_rows",
    "window_append",
    "packed_logits",
    "packed_logits_reads_live_rows_only",
    "packed_topk",
    "window_refresh",
    "union_apply",
    "topk_indices",
    "topk_and_empty_rows",
    "cpu_vocab_kernels",
]
