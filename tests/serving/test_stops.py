"""`nanospec serve` always stops: whichever of SGLang's processes dies, at whichever moment
(loading, SGLang's warm-up request in flight, serving), it exits with status 1 and says
which; SIGINT and SIGTERM end it too. Within 10 s, leaving none of SGLang's processes.

A moment is held still by SIGSTOPping the scheduler: loading as soon as it exists, warm-up
once the launcher's own connection to `/generate` (the warm-up request) is open."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import requests

from nanospec_server.engine_watch import EXIT_ENGINE_DIED
from nanospec_server.launch.server import READY_LINE, start_server_process
from nanospec_server.models.tiny import tiny_model_path
from tests.serving.conftest import BASE_FLAGS

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]

STOP_S = 10
REACH_S = 300  # a tiny server's start on a loaded 2-core host
TARGET = ["--model-path", str(tiny_model_path("tiny-target")), *BASE_FLAGS]
TITLES = {"scheduler": "sglang::scheduler", "detokenizer": "sglang::detokenizer"}
WATCHED_AS = {"scheduler": "scheduler_0", "detokenizer": "detokenizer"}  # SGLang's names


def child(launcher: psutil.Process, name: str) -> psutil.Process | None:
    for process in launcher.children():
        try:
            if process.cmdline()[:1] == [TITLES[name]]:
                return process
        except psutil.NoSuchProcess:
            pass
    return None


def listening(launcher: psutil.Process, port: int) -> bool:
    return any(
        c.status == psutil.CONN_LISTEN and c.laddr.port == port
        for c in launcher.net_connections(kind="tcp")
    )


def own_connections(launcher: psutil.Process, port: int) -> set[int]:
    """Local ports of the launcher's client connections to its own server."""
    return {
        c.laddr.port
        for c in launcher.net_connections(kind="tcp")
        if c.status == psutil.CONN_ESTABLISHED and c.raddr and c.raddr.port == port
    }


def wait_for(what: str, condition, server: subprocess.Popen, log: Path):
    deadline = time.monotonic() + REACH_S
    while time.monotonic() < deadline:
        assert server.poll() is None, f"stopped before {what}:\n{log.read_text()[-3000:]}"
        if found := condition():
            return found
        time.sleep(0.05)
    raise AssertionError(f"no {what} after {REACH_S} s:\n{log.read_text()[-3000:]}")


def reach(moment: str, url: str, server: subprocess.Popen, log: Path) -> psutil.Process:
    """Hold the server at `moment`; its launcher (psutil)."""
    launcher, port = psutil.Process(server.pid), int(url.rsplit(":", 1)[1])
    if moment == "loading":
        scheduler = wait_for("scheduler", lambda: child(launcher, "scheduler"), server, log)
        scheduler.suspend()
    elif moment == "warm-up":
        wait_for("listening launcher", lambda: listening(launcher, port), server, log)
        # SGLang's warm-up waits 1 s before its first request: the scheduler stops first.
        child(launcher, "scheduler").suspend()
        seen: set[int] = set()

        def warm_up_open() -> bool:
            # /model_info comes and goes; the warm-up /generate stays open, unanswered
            nonlocal seen
            now = own_connections(launcher, port)
            held, seen = bool(now & seen), now
            time.sleep(0.5)
            return held

        wait_for("open warm-up request", warm_up_open, server, log)
    else:
        wait_for("ready line", lambda: READY_LINE in log.read_text(), server, log)
        assert requests.get(f"{url}/health_generate", timeout=60).status_code == 200
    return launcher


@pytest.fixture
def server(tmp_path: Path, request) -> Iterator[tuple[str, subprocess.Popen, Path]]:
    log = tmp_path / "server.log"
    url, process = start_server_process(TARGET, log, warmup=True)
    try:
        yield url, process, log
    finally:
        if process.poll() is None:
            psutil.Process(process.pid).kill()  # the test failed; its children follow it
            process.wait()


def stopped_within(server: subprocess.Popen, since: float, log: Path) -> int:
    try:
        code = server.wait(timeout=STOP_S + 50)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"still running {STOP_S + 50} s on:\n{log.read_text()[-3000:]}"
        ) from None
    took = time.monotonic() - since
    assert took < STOP_S, f"stopped after {took:.1f} s:\n{log.read_text()[-3000:]}"
    return code


@pytest.mark.parametrize(
    "name,moment",
    [
        ("scheduler", "loading"),
        ("scheduler", "warm-up"),
        ("scheduler", "serving"),
        ("detokenizer", "serving"),
    ],
)
def test_a_dead_engine_process_stops_the_server_with_a_message(server, name, moment) -> None:
    url, process, log = server
    launcher = reach(moment, url, process, log)
    engine = launcher.children(recursive=True)
    victim = child(launcher, name)
    victim.kill()
    code = stopped_within(process, time.monotonic(), log)
    assert code == EXIT_ENGINE_DIED, log.read_text()[-3000:]
    text = log.read_text()
    if moment == "loading":  # SGLang's own start reports it, before any watch runs
        message = "Rank 0 scheduler died during initialization (exit code: -9)"
    else:
        message = f"SGLang's {WATCHED_AS[name]} process (pid {victim.pid}) was killed by signal 9"
    assert message in text, text[-3000:]
    _, alive = psutil.wait_procs(engine, timeout=STOP_S)
    assert not alive, alive


@pytest.mark.parametrize("moment", ["loading", "warm-up"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_sigint_and_sigterm_stop_the_server(server, sig, moment) -> None:
    url, process, log = server
    launcher = reach(moment, url, process, log)
    engine = launcher.children(recursive=True)
    process.send_signal(sig)
    stopped_within(process, time.monotonic(), log)
    _, alive = psutil.wait_procs(engine, timeout=STOP_S)
    assert not alive, alive
