"""Compact vocabulary slots for an engine's request pool.

An engine's request pool (SGLang's ``req_to_token_pool``) has far more entries than
requests ever run at once, and each window slot costs O(W_cap) plus a V-bit bitmap. So
the vocabulary keeps one slot per *running* request and this map sends pool index -> slot
on the device (0: padding, or a request that found no free slot), so a step looks slots up
without a host sync and a CUDA graph replays the lookup. Claims and releases happen on the host,
at admission time.
"""

import torch
from torch import Tensor


class SlotPool:
    def __init__(self, pool_size: int, num_slots: int, device: torch.device | str) -> None:
        """``num_slots`` counts the padding slot 0: ``num_slots - 1`` requests fit."""
        self.table = torch.zeros(pool_size, dtype=torch.int64, device=device)
        self._free = list(range(num_slots - 1, 0, -1))  # pop() hands out 1, 2, ... first
        self._slot_of: dict[int, int] = {}

    def claim(self, pool_index: int) -> int:
        """A free slot for this pool entry (0 if every slot is taken)."""
        if pool_index in self._slot_of:
            raise ValueError(
                f"pool entry {pool_index} already holds slot {self._slot_of[pool_index]}"
            )
        slot = self._free.pop() if self._free else 0
        if slot:
            self._slot_of[pool_index] = slot
        self.table[pool_index] = slot
        return slot

    def release(self, pool_index: int) -> int:
        """Give this entry's slot back (0 if it held none)."""
        slot = self._slot_of.pop(pool_index, 0)
        if slot:
            self._free.append(slot)
        self.table[pool_index] = 0
        return slot

    def slot_of(self, pool_index: int) -> int:
        return self._slot_of.get(pool_index, 0)

    def lookup(self, pool_indices: Tensor) -> Tensor:
        """Slots of these pool entries, on the device (no host sync)."""
        return self.table[pool_indices.to(self.table.device, torch.int64)]

    @property
    def free_slots(self) -> int:
        return len(self._free)
