"""Tensor parallelism on a CPU host: SGLang's model-parallel groups over gloo alone.

SGLang gives every model-parallel group a PyNccl communicator unless its platform says
otherwise, and its CPU platform does not. Where the installed torch is a CUDA build (its
NCCL library loads) on a host without a GPU, that communicator then asks CUDA for the CPU
device and the scheduler dies at ``--tp-size 2``. On a CPU there is no NCCL to use: the
groups' collectives fall back to torch.distributed over gloo (SGLang's shared-memory
all-reduce needs its AMX kernels), which is what a CPU TP run uses with or without us.
"""

from __future__ import annotations

from collections.abc import Callable

from nanospec_server import seams


def group_without_device_communicators(original: Callable, *args, **kwargs):
    """AROUND ``init_model_parallel_group``: no NCCL or custom all-reduce on CPU."""
    kwargs["use_pynccl"] = False
    kwargs["use_custom_allreduce"] = False
    return original(*args, **kwargs)


def install_cpu_parallel_hooks() -> None:
    """Register the hook (the caller applies it, before the parallel groups are made)."""
    seams.hook(seams.MODEL_PARALLEL_GROUP, group_without_device_communicators)
