"""Which kernels serve CUDA tensors, built (and cached) on first use."""

import functools
import os
import warnings
from types import ModuleType

from nanospec_server.ops.build import load_cuda_extension


def _forced() -> str | None:
    return os.environ.get("NANOSPEC_OPS") or None


@functools.cache
def cuda_ops() -> ModuleType | None:
    """The CUDA C++ extension, or None (forced off, or the build failed: warned once).

    Its functions take the same arguments as their namesakes in ``reference.py``.
    """
    if _forced() not in (None, "cuda"):
        return None
    try:
        return load_cuda_extension()
    except Exception as error:  # a broken toolchain must not take the server down
        warnings.warn(f"nanospec CUDA kernels unavailable, falling back: {error}", stacklevel=2)
        return None


@functools.cache
def triton_ops() -> ModuleType | None:
    if _forced() not in (None, "triton"):
        return None
    try:
        from nanospec_server.ops import triton_kernels

        return triton_kernels
    except ImportError:
        return None
