"""Timing a draft head: the median wall time of a call, and what one head step computes."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``fn()`` over ``repeats`` calls, in milliseconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def head_topk(hidden: torch.Tensor, rows: torch.Tensor, k: int = 8) -> torch.Tensor:
    """What a draft head does per step: logits, softmax, top-k (as ``DynamicVocab.topk``)."""
    return torch.softmax(hidden @ rows.T, dim=-1).topk(k, dim=-1).indices
