"""Which kernels serve CUDA tensors, built (and cached) on first use."""

import functools
import os
import warnings
from types import ModuleType

from nanospec_server.env import ops_backend
from nanospec_server.ops import cpu_kernels
from nanospec_server.ops.build import load_cuda_extension


def _forced() -> str | None:
    return ops_backend()


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


def triton_interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def triton_ops() -> ModuleType | None:
    if _forced() not in (None, "triton"):
        return None
    try:
        # deferred: imports triton only when called
        from nanospec_server.ops import triton_kernels

        return triton_kernels
    except ImportError:
        return None


@functools.cache
def cpu_ops() -> ModuleType | None:
    """The C++ CPU fast path, or None (forced off, or no compiler: warned once)."""
    if _forced() not in (None, "cpu"):
        return None

    try:
        cpu_kernels.library()
        return cpu_kernels
    except Exception as error:
        warnings.warn(f"nanospec CPU kernels unavailable, using torch: {error}", stacklevel=2)
        return None
