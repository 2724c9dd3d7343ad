"""W_max as the kernels take it: one int64 value per row of a batch of slots."""

from __future__ import annotations

import torch
from torch import Tensor


def w_max_per_row(w_max: int | Tensor, slots: Tensor) -> Tensor:
    """W_max as a contiguous int64 tensor with one value per row of ``slots`` (an int, or
    a tensor of one value or of one per row; no host sync either way)."""
    if isinstance(w_max, Tensor):
        return w_max.to(slots.device, torch.int64).expand(len(slots)).contiguous()
    return torch.full((len(slots),), w_max, dtype=torch.int64, device=slots.device)
