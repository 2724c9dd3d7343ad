"""Servers started one at a time: each is healthy before the next one starts (real models
on a CPU need it: SGLang sizes a server's KV pool from the memory free while it profiles)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nanospec_server.launch import server as launcher
from nanospec_server.launch.server import READY_LINE, running_servers
from nanospec_server.models.tiny import tiny_model_path

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]

PLAIN_TINY = ["--model-path", str(tiny_model_path("tiny-target")), "--dtype", "float32"]
PLAIN_TINY += ["--max-total-tokens", "2048", "--mem-fraction-static", "0.3"]


@pytest.mark.parametrize("one_at_a_time", [True, False])
def test_one_at_a_time_waits_for_each_server(
    tmp_path: Path, monkeypatch, one_at_a_time: bool
) -> None:
    servers = {name: (PLAIN_TINY, tmp_path / f"{name}.log") for name in ("first", "second")}
    ready_before_each_start: list[int] = []
    start = launcher._start

    def counting_start(args, log_path, started):
        logs = [path for _, path in servers.values() if path.exists()]
        ready_before_each_start.append(sum(READY_LINE in path.read_text() for path in logs))
        return start(args, log_path, started)

    monkeypatch.setattr(launcher, "_start", counting_start)
    with running_servers(servers, one_at_a_time) as urls:
        assert set(urls) == {"first", "second"}
    assert ready_before_each_start == ([0, 1] if one_at_a_time else [0, 0])
