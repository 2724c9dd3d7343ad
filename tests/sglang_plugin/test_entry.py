"""The post-warmup `/freeze_gc` hook: it waits for this process to listen, and gives up
at once where another process holds the port."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from nanospec_server.sglang_plugin import entry


@pytest.fixture
def snapshots(monkeypatch):
    """Feeds ``port_listeners`` the given snapshots, one per poll (then the last again)."""
    queue: list[set[int | None]] = []

    def next_snapshot(port: int) -> set[int | None]:
        return queue.pop(0) if len(queue) > 1 else queue[0]

    monkeypatch.setattr(entry, "port_listeners", next_snapshot)
    monkeypatch.setattr(entry.time, "sleep", lambda seconds: None)
    return queue


def run_hook() -> list[object]:
    calls: list[object] = []
    entry.freeze_gc_once_listening(calls.append, SimpleNamespace(port=30000))
    return calls


def test_waits_through_an_unowned_socket_until_ours_listens(snapshots) -> None:
    # psutil reports our own socket without an owner when it is bound between two scans
    snapshots.extend([set(), {None}, {None}, {os.getpid()}])
    assert len(run_hook()) == 1


def test_skips_at_once_where_another_process_listens(snapshots, caplog) -> None:
    snapshots.extend([{None}, {os.getpid() + 1}, {os.getpid()}])
    with caplog.at_level("INFO"):
        assert run_hook() == []
    assert "freeze_gc skipped" in caplog.text
