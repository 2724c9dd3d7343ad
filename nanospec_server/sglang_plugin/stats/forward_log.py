"""A line per model forward, for comparing where two servers' steps spend their time.

With ``NANOSPEC_FORWARD_LOG=PREFIX`` every scheduler process (plain decoding's too: the
plugin loads in every `nanospec serve`) appends to ``PREFIX.PID``, one line per
`ModelRunner.forward`: its start (`time.perf_counter`, one clock for every process on
the host), its seconds, the seconds since the previous forward of that runner ended
(what the step did outside the model: scheduling, sampling, bookkeeping), the forward
mode, the batch size, the batch's KV tokens, whether the runner is a draft's, and the
seconds Python's garbage collector ran in this process since the previous line (inside
the forward or between forwards: the collector runs wherever an allocation trips it).
`benchmarks/forward_gaps.py` compares two such logs. Off unless the variable is set.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable
from typing import Any, TextIO

from nanospec_server import env, seams

FIELDS = ("start", "seconds", "gap", "mode", "batch_size", "kv_tokens", "draft", "gc")


class ForwardLog:
    def __init__(self, prefix: str) -> None:
        self.path = f"{prefix}.{os.getpid()}"
        self._file: TextIO | None = None
        self._last_end: dict[int, float] = {}  # per runner: the end of its last forward
        self._gc_seconds = 0.0  # collections since the last line
        self._gc_start: float | None = None
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        elif self._gc_start is not None:
            self._gc_seconds += time.perf_counter() - self._gc_start
            self._gc_start = None

    def __call__(self, original: Callable, runner: Any, forward_batch: Any, *args, **kwargs):
        start = time.perf_counter()
        result = original(runner, forward_batch, *args, **kwargs)
        end = time.perf_counter()
        previous = self._last_end.get(id(runner))
        self._last_end[id(runner)] = end
        gap = start - previous if previous is not None else -1.0
        if self._file is None:
            self._file = open(self.path, "a", buffering=1)  # noqa: SIM115 (lives with the process)
        gc_seconds, self._gc_seconds = self._gc_seconds, 0.0
        self._file.write(line(start, end - start, gap, runner, forward_batch, gc_seconds) + "\n")
        return result


def line(
    start: float, seconds: float, gap: float, runner: Any, forward_batch: Any, gc_seconds: float
) -> str:
    mode = forward_batch.forward_mode.name
    kv_tokens = int(forward_batch.seq_lens_sum or 0)
    draft = int(bool(getattr(runner, "is_draft_worker", False)))
    fields = (f"{start:.6f}", f"{seconds:.6f}", f"{gap:.6f}", mode,
              str(forward_batch.batch_size), str(kv_tokens), str(draft), f"{gc_seconds:.6f}")  # fmt: skip
    return " ".join(fields)


def register_hooks() -> None:
    """Log every forward of this process when ``NANOSPEC_FORWARD_LOG`` is set."""
    if prefix := env.forward_log():
        seams.hook(seams.MODEL_FORWARD, ForwardLog(prefix))
