"""`NANOSPEC_FORWARD_LOG`: one line per model forward, its gap measured per runner, the
garbage collections between lines."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from nanospec_server.sglang_plugin.stats.forward_log import FIELDS, ForwardLog


def batch(mode: str, size: int, kv: int) -> SimpleNamespace:
    return SimpleNamespace(forward_mode=SimpleNamespace(name=mode), batch_size=size,
                           seq_lens_sum=kv)  # fmt: skip


@pytest.fixture
def log(tmp_path) -> Iterator[ForwardLog]:
    log = ForwardLog(str(tmp_path / "fwd"))
    yield log
    gc.callbacks.remove(log._on_gc)  # a server's log lives as long as its process


def test_each_forward_is_a_line_with_the_gap_since_its_runners_last(log: ForwardLog) -> None:
    target, draft = SimpleNamespace(), SimpleNamespace(is_draft_worker=True)

    def forward(runner, forward_batch):
        time.sleep(0.01)
        return "out"

    assert log(forward, target, batch("DECODE", 4, 100)) == "out"
    log(forward, draft, batch("DECODE", 4, 100))
    time.sleep(0.02)
    log(forward, target, batch("DECODE", 4, 104))
    log(forward, target, batch("TARGET_VERIFY", 4, 120))

    lines = [text.split() for text in open(log.path).read().splitlines()]
    assert [len(fields) for fields in lines] == [len(FIELDS)] * 4
    assert [fields[3:7] for fields in lines] == [
        ["DECODE", "4", "100", "0"],
        ["DECODE", "4", "100", "1"],
        ["DECODE", "4", "104", "0"],
        ["TARGET_VERIFY", "4", "120", "0"],
    ]
    gaps = [float(fields[2]) for fields in lines]
    assert gaps[0] == gaps[1] == -1.0  # each runner's first forward has none
    assert gaps[2] >= 0.03  # the draft's forward and the sleep, between the target's two
    assert 0 <= gaps[3] < gaps[2]
    assert all(float(fields[1]) >= 0.01 for fields in lines)


def test_each_line_carries_the_garbage_collections_since_the_previous_line(log: ForwardLog) -> None:
    runner = SimpleNamespace()

    def forward_that_collects(runner, forward_batch):
        cycles = [[] for _ in range(20_000)]
        for cycle in cycles:
            cycle.append(cycle)
        del cycles
        gc.collect()
        return None

    log(lambda runner, forward_batch: None, runner, batch("DECODE", 1, 10))
    log(forward_that_collects, runner, batch("DECODE", 1, 11))
    log(lambda runner, forward_batch: None, runner, batch("DECODE", 1, 12))
    at = FIELDS.index("gc")
    collected = [float(text.split()[at]) for text in open(log.path).read().splitlines()]
    assert collected[1] > 0  # the full collection inside the second forward
    assert collected[2] < collected[1]  # counted once, not carried to the next line
