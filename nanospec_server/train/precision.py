"""Training precision: fp32 master weights, optionally bf16 autocast for the matmuls.

``auto`` picks bf16 on CUDA and on CPUs with native bf16 dot products
(avx512_bf16 / amx_bf16); elsewhere CPU bf16 is emulated and slower than fp32
(docs/results.md, "Training times").
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

CHOICES = ("auto", "bf16", "fp32")


def cpu_has_native_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def use_bf16(precision: str, device: torch.device) -> bool:
    if precision == "auto":
        return device.type == "cuda" or (device.type == "cpu" and cpu_has_native_bf16())
    return precision == "bf16"


def autocast(bf16: bool, device: torch.device):
    if bf16:
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
