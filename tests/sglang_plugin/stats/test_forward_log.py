"""`NANOSPEC_FORWARD_LOG`: one line per model forward, its gap measured per runner."""

from __future__ import annotations

import time
from types import SimpleNamespace

from nanospec_server.sglang_plugin.stats.forward_log import FIELDS, ForwardLog


def batch(mode: str, size: int, kv: int) -> SimpleNamespace:
    return SimpleNamespace(forward_mode=SimpleNamespace(name=mode), batch_size=size,
                           seq_lens_sum=kv)  # fmt: skip


def test_each_forward_is_a_line_with_the_gap_since_its_runners_last(tmp_path) -> None:
    log = ForwardLog(str(tmp_path / "fwd"))
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
    assert [fields[3:] for fields in lines] == [
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
