"""Per-request NanoSpec statistics: counters on the device, read on the host once per chunk.

Counters are indexed by the request slot (SGLang's `req_pool_idx`) and updated with
tensor ops inside the speculative step, so the step never waits on the host. The output
streamer turns them into one plain dict per request when it emits a chunk.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import Tensor

# Counter columns, one row per slot.
STEPS, ACCEPTED, EMITTED, COVERED, ACTIVE_SUM, ACTIVE_MAX, ROWS_SUM, HEAD_CALLS = range(8)
NUM_COUNTERS = 8
FINISHED_KEPT = 1024  # finished requests remembered for the admin layer


class RequestStats:
    def __init__(self, num_slots: int, vocab_size: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.counters = torch.zeros(num_slots, NUM_COUNTERS, dtype=torch.int64, device=device)
        self.finished: OrderedDict[str, dict] = OrderedDict()

    def reset(self, slots: Tensor) -> None:
        self.counters[slots] = 0

    def record_verify(
        self, slots: Tensor, accept_lens: Tensor, covered: Tensor, active_size: Tensor
    ) -> None:
        """One speculative step: tokens emitted (accepted + bonus), how many were in I."""
        delta = torch.zeros(len(slots), NUM_COUNTERS, dtype=torch.int64, device=slots.device)
        delta[:, STEPS] = 1
        delta[:, ACCEPTED] = accept_lens - 1  # draft tokens the target accepted
        delta[:, EMITTED] = accept_lens
        delta[:, COVERED] = covered
        delta[:, ACTIVE_SUM] = active_size
        self.counters.index_add_(0, slots, delta)
        maxed = torch.maximum(self.counters[slots, ACTIVE_MAX], active_size)
        self.counters[slots, ACTIVE_MAX] = maxed

    def record_head(self, slots: Tensor, rows: int | Tensor) -> None:
        """One draft LM-head call over `rows` rows for each of these requests."""
        self.counters[slots, ROWS_SUM] += rows
        self.counters[slots, HEAD_CALLS] += 1

    def snapshot(
        self, slots: list[int], active_now: list[int], stream_len: list[int]
    ) -> list[dict]:
        """Host dicts for these slots: the one device-to-host copy per output chunk."""
        rows = self.counters[slots].tolist()
        return [
            _to_dict(row, active, length, self.vocab_size)
            for row, active, length in zip(rows, active_now, stream_len, strict=True)
        ]

    def remember_finished(self, rid: str, stats: dict) -> None:
        self.finished[rid] = stats
        while len(self.finished) > FINISHED_KEPT:
            self.finished.popitem(last=False)


def _to_dict(row: list[int], active_now: int, stream_len: int, vocab_size: int) -> dict:
    steps, calls = row[STEPS], row[HEAD_CALLS]
    return {
        "active_vocab_size": active_now,
        "active_vocab_mean": row[ACTIVE_SUM] / steps if steps else float(active_now),
        "active_vocab_max": max(row[ACTIVE_MAX], active_now),
        "stream_length": stream_len,
        "coverage": row[COVERED] / row[EMITTED] if row[EMITTED] else None,
        "accept_length_mean": row[EMITTED] / steps if steps else None,
        "draft_steps": steps,
        "accepted_draft_tokens": row[ACCEPTED],
        "lm_head_rows_mean": row[ROWS_SUM] / calls if calls else None,
        "lm_head_calls": calls,
        "vocab_size": vocab_size,
    }
