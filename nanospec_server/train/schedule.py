"""Learning-rate schedule: linear warmup, then cosine decay to ``min_ratio`` of the peak."""

from __future__ import annotations

import math


def cosine_lr(
    step: int, total_steps: int, peak: float, warmup: int, min_ratio: float = 0.1
) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total_steps - warmup)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return peak * (min_ratio + (1 - min_ratio) * cosine)
