"""Run `nanospec serve` as a subprocess and talk to it: for benchmarks and integration tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import requests

START_TIMEOUT_S = 300
READY_LINE = "nanospec: ready at"  # printed by `nanospec serve` once it serves
# What `nanospec serve` prints when another process holds its port (before or at the bind).
PORT_TAKEN_LINES = ("nanospec: error: --port:", "nanospec: error: could not listen on")
PORT_ATTEMPTS = 3
# A 1.5B model on a loaded 2-core host took over 300 s for one 32-token request.
REQUEST_TIMEOUT_S = 1200


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerFailed(RuntimeError):
    pass


@contextmanager
def running_server(args: list[str], log_path: Path) -> Iterator[str]:
    """Yield the base URL of a `nanospec serve` started with `args`; stop it on exit."""
    with running_servers({"server": (args, log_path)}) as urls:
        yield urls["server"]


@contextmanager
def running_servers(
    servers: dict[str, tuple[list[str], Path]], one_at_a_time: bool = False
) -> Iterator[dict[str, str]]:
    """Start every named server, wait until all are healthy, yield their URLs; stop them
    all on exit or failure. By default all start at once (a start is mostly imports and
    weight loading); ``one_at_a_time`` waits for each before starting the next: SGLang on
    a CPU sizes its KV pool from the memory free while it profiles, which a neighbour
    loading its weights at the same moment takes away (real models fail to start so)."""
    with running_server_processes(servers, one_at_a_time) as started:
        yield {name: url for name, (url, _) in started.items()}


@contextmanager
def running_server_processes(
    servers: dict[str, tuple[list[str], Path]], one_at_a_time: bool = False
) -> Iterator[dict[str, tuple[str, subprocess.Popen]]]:
    """`running_servers`, yielding each URL with its `nanospec serve` process (for tests
    of how that process ends)."""
    started: list[subprocess.Popen] = []
    with exit_on_sigterm():
        try:
            running = {}
            if one_at_a_time:
                for name, (args, log_path) in servers.items():
                    running[name] = _healthy(
                        args, log_path, *_start(args, log_path, started), started
                    )
            else:
                pending = [(name, *_start(*spec, started)) for name, spec in servers.items()]
                for name, url, process in pending:
                    running[name] = _healthy(*servers[name], url, process, started)
            yield running
        finally:
            for process in started:
                # SIGINT is what a user's Ctrl-C sends; the CLI must stop SGLang's children too.
                _signal_group(process, signal.SIGINT)
            for process in started:
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    _signal_group(process, signal.SIGKILL)
                    process.wait()


def _healthy(
    args: list[str],
    log_path: Path,
    url: str,
    process: subprocess.Popen,
    started: list[subprocess.Popen],
) -> tuple[str, subprocess.Popen]:
    """The started server once healthy, started again on another port while it lost its
    port to another process."""
    attempt = 1
    while not _wait_until_healthy(url, process, log_path):
        if attempt == PORT_ATTEMPTS:
            raise ServerFailed(f"no free port in {attempt} tries:\n{_tail(log_path)}")
        # The port was free when picked, but another process bound it first.
        url, process = _start(args, log_path, started)
        attempt += 1
    return url, process


@contextmanager
def exit_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM into SystemExit(143) while inside, so that cleanup runs: the servers
    live in sessions of their own, and a bench stopped by SIGTERM (`timeout`, a job
    runner) would otherwise leave them running. Off the main thread it changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _exit(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, _exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _start(args: list[str], log_path: Path, started: list[subprocess.Popen]):
    """`nanospec serve` on a port free now, logging to ``log_path``: (url, process)."""
    url, process = start_server_process(args, log_path)
    started.append(process)
    return url, process


def start_server_process(
    args: list[str], log_path: Path, warmup: bool = False
) -> tuple[str, subprocess.Popen]:
    """`nanospec serve` on a port free now, in a session of its own, logging to
    ``log_path``: (url, process), not waiting for it. ``warmup`` keeps SGLang's warm-up
    request, which the other starts skip."""
    port = free_port()
    command = [sys.executable, "-m", "nanospec_server.cli", "serve", "--port", str(port)]
    command += [*([] if warmup else ["--skip-server-warmup"]), *args]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    return f"http://127.0.0.1:{port}", process


def _signal_group(process: subprocess.Popen, sig: signal.Signals) -> None:
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass


def _wait_until_healthy(url: str, process: subprocess.Popen, log_path: Path) -> bool:
    """Healthy means: our process says it is ready, then `url` answers. The port was only
    free when picked; until our server binds it, another process may have taken it, and a
    health check alone could be answered by someone else's server (a wrong-server test).
    False: the server stopped because the port was taken (start it again elsewhere)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log = log_path.read_text(errors="replace")
            if any(line in log for line in PORT_TAKEN_LINES):
                return False
            raise ServerFailed(f"server exited with {process.returncode}:\n{_tail(log_path)}")
        try:
            ready = READY_LINE in log_path.read_text(errors="replace")
            if ready and requests.get(f"{url}/health_generate", timeout=30).status_code == 200:
                return True
        except requests.RequestException:
            pass
        time.sleep(1)
    raise ServerFailed(f"server not healthy after {START_TIMEOUT_S} s:\n{_tail(log_path)}")


def _tail(path: Path, lines: int = 60) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def checked(response: requests.Response) -> requests.Response:
    """``response``, or an HTTPError carrying the server's message when it is not a 200."""
    if response.status_code != 200:
        raise requests.HTTPError(f"{response.status_code}: {response.text}", response=response)
    return response


def generate(
    url: str, input_ids: list[int], max_new_tokens: int, *, return_logprob: bool = False, **sampling
) -> dict:
    """A `/generate` reply (greedy unless ``sampling`` says otherwise); ``return_logprob``
    adds every output token's log-probability to its meta_info."""
    params = {"temperature": 0.0, "max_new_tokens": max_new_tokens, **sampling}
    body = {"input_ids": input_ids, "sampling_params": params, "return_logprob": return_logprob}
    return checked(requests.post(f"{url}/generate", json=body, timeout=REQUEST_TIMEOUT_S)).json()


def speculative_flags(
    algorithm: str, draft: str | Path, steps: int, topk: int, tokens: int
) -> list[str]:
    """SGLang's speculative flags; `draft` is a path or a tiny model's name."""
    if not Path(draft).exists():
        # deferred: imports torch only when called
        from nanospec_server.models.tiny import tiny_model_path

        draft = tiny_model_path(str(draft))
    return [
        "--speculative-algorithm", algorithm,
        "--speculative-draft-model-path", str(draft),
        "--speculative-num-steps", str(steps),
        "--speculative-eagle-topk", str(topk),
        "--speculative-num-draft-tokens", str(tokens),
    ]  # fmt: skip
