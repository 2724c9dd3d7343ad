"""A port another process holds: `nanospec serve` says so and stops, never answers for the
other server, and the test harness starts again elsewhere instead of failing.

The failure this pins down: a server whose port was taken after it was picked posted
SGLang's post-warmup `/freeze_gc` to the other process (10 s, then a timeout), printed
"ready", and exited with uvicorn's code 3 under a test that then failed.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from nanospec_server.launch import server as launcher
from nanospec_server.launch.server import free_port, generate, running_server
from nanospec_server.models.tiny import tiny_model_path

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]

SERVE = [sys.executable, "-m", "nanospec_server.cli", "serve", "--skip-server-warmup"]
PLAIN_TINY = ["--model-path", str(tiny_model_path("tiny-target")), "--dtype", "float32"]
PLAIN_TINY += ["--max-total-tokens", "2048", "--mem-fraction-static", "0.3"]


@contextmanager
def listening(port: int) -> Iterator[socket.socket]:
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", port))
        holder.listen()
        yield holder


def test_a_port_in_use_is_refused_before_loading(tmp_path: Path) -> None:
    port = free_port()
    with listening(port):
        done = subprocess.run(
            [*SERVE, "--port", str(port), *PLAIN_TINY],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    assert done.returncode == 2
    assert f"--port: 127.0.0.1:{port} is in use" in done.stderr


def test_a_port_taken_during_loading_stops_the_server_with_a_message(tmp_path: Path) -> None:
    port = free_port()
    log_path = tmp_path / "server.log"
    holder: list[socket.socket] = []
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [*SERVE, "--port", str(port), *PLAIN_TINY], stdout=log, stderr=subprocess.STDOUT
        )

    def take_port_once_started() -> None:
        # "starting" is printed after the port check and before minutes (here seconds)
        # of model loading: the window in which another process can take the port.
        while process.poll() is None and "nanospec: starting" not in log_path.read_text():
            time.sleep(0.05)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen()
        holder.append(sock)

    taker = threading.Thread(target=take_port_once_started)
    taker.start()
    try:
        returncode = process.wait(timeout=300)
    finally:
        process.kill()
        taker.join()
        for sock in holder:
            sock.close()
    log = log_path.read_text()
    assert returncode != 0
    assert f"could not listen on 127.0.0.1:{port}" in log
    assert "nanospec: ready at" not in log and "freeze_gc failed" not in log


def test_the_harness_starts_again_on_another_port(tmp_path: Path, monkeypatch) -> None:
    taken = free_port()
    ports = iter([taken])
    monkeypatch.setattr(launcher, "free_port", lambda: next(ports, None) or free_port())
    with listening(taken):
        with running_server(PLAIN_TINY, tmp_path / "server.log") as url:
            assert not url.endswith(f":{taken}")
            assert generate(url, [1, 5, 9], 4)["output_ids"]
