"""One prepare per model at a time, across processes (an advisory `flock` on the model folder)."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_NAME = ".prepare.lock"


@contextmanager
def model_lock(model_dir: Path) -> Iterator[None]:
    """Hold the model's lock; a second process waits here until the first is done."""
    model_dir.mkdir(parents=True, exist_ok=True)
    with open(model_dir / LOCK_NAME, "a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
