"""The `worker` label of NanoSpec's Prometheus series (the series themselves are checked
against a real server in test_api.py and test_router.py)."""

from __future__ import annotations

import socket

from nanospec_server.env import WORKER_NAME
from nanospec_server.sglang_plugin.stats.metrics import worker_name


def test_worker_name_is_the_address_it_listens_on_unless_named(monkeypatch) -> None:
    monkeypatch.delenv(WORKER_NAME, raising=False)
    assert worker_name("127.0.0.1", 30001) == "127.0.0.1:30001"  # as `nanospec stats` labels it
    assert worker_name("0.0.0.0", 30000) == f"{socket.gethostname()}:30000"  # a compose hostname
    assert worker_name("::1", 30000) == "[::1]:30000"
    monkeypatch.setenv(WORKER_NAME, "gpu-box-3")
    assert worker_name("0.0.0.0", 30000) == "gpu-box-3"
