"""Host settings: the scheduler's CPU threads."""

from __future__ import annotations

from nanospec_server.host import CPU_THREADS_ENV, default_cpu_threads, scheduler_cpu_threads


def test_default_leaves_two_cores_to_the_other_processes() -> None:
    assert [default_cpu_threads(n) for n in (1, 2, 3, 8, 64)] == [1, 1, 1, 6, 62]


def test_environment_overrides_the_default(monkeypatch) -> None:
    monkeypatch.setenv(CPU_THREADS_ENV, "3")
    assert scheduler_cpu_threads() == 3
