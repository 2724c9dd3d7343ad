"""Wall time of the draft's share of each speculative step, and of its LM-head calls.

Per request slot: the seconds spent in the draft phase (the draft tree and the draft
extend after verification) and, inside it, in the draft's LM head. On a CPU the work is
synchronous, so a pair of clock reads times it; on a GPU timing would take a host sync per
step, which the serving path never does, so there the timer stays off.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

DRAFT, HEAD = 0, 1


class StepTimer:
    def __init__(self, num_slots: int, enabled: bool) -> None:
        self.enabled = enabled
        self.seconds = torch.zeros(num_slots, 2, dtype=torch.float64)  # host memory
        self._slots: Tensor | None = None  # the requests of the draft phase being timed

    def reset(self, slots: Tensor) -> None:
        self.seconds[slots.cpu()] = 0

    @contextmanager
    def draft_phase(self, slots: Tensor | None) -> Iterator[None]:
        """Charge the enclosed work to every request of the batch (each waited for it)."""
        if not self.enabled or slots is None or len(slots) == 0 or self._slots is not None:
            yield
            return
        self._slots = slots.to("cpu", torch.int64)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[self._slots, DRAFT] += time.perf_counter() - start
            self._slots = None

    @contextmanager
    def lm_head(self) -> Iterator[None]:
        """An LM-head call; counted only inside a draft phase (not the prefill's)."""
        if self._slots is None:
            yield
            return
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[self._slots, HEAD] += time.perf_counter() - start

    def read(self, slots: list[int]) -> list[tuple[float, float] | None]:
        """(draft seconds, LM-head seconds) per slot; None where nothing is timed."""
        if not self.enabled:
            return [None] * len(slots)
        return [tuple(row) for row in self.seconds[slots].tolist()]
