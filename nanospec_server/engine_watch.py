"""Stop `nanospec serve` with a message and exit status 1 when one of SGLang's processes dies.

Without its scheduler a server answers nothing, yet its HTTP front would keep accepting
requests. SGLang's `SubprocessWatchdog` polls the schedulers and detokenizers each second,
but ignores one that exited with status 0, and on a crash it raises SIGQUIT, whose
handler sleeps 5 s for GPU crash diagnostics and SIGKILLs the launcher: status 137, which
reads like an OOM kill, and no word from us. So both come here (`check_processes_hook`,
`sigquit_hook`): the server stops at once, naming what died and how.

A shutdown asked for (Ctrl-C, SIGTERM, the end of `nanospec serve`) ends those processes
on purpose: `expect_shutdown` turns the watch off. It also bounds the shutdown: uvicorn
waits for open connections and SGLang's SIGTERM handler drains open requests, both without
end, so a request that can never finish (SGLang's warm-up request to a dead or stuck
scheduler) would keep the server up forever. After `SHUTDOWN_GRACE_S` whatever is left is
killed and the server exits.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from multiprocessing.process import BaseProcess

EXIT_ENGINE_DIED = 1
EXIT_STOPPED = 0
# How long a shutdown asked for may drain open requests; the rest of the 10 s a stop may
# take is for killing SGLang's processes.
SHUTDOWN_GRACE_S = 5.0
# How long to wait for SGLang's killed processes to be reaped before exiting anyway.
REAP_WAIT_S = 3.0
# Ctrl-C reaches SGLang's processes with us, and one may be gone before our handler has
# run: a death counts only if no shutdown was asked for within this grace.
GRACE_S = 1.0

_stopping = threading.Lock()
_shutting_down = threading.Event()


def how_it_ended(exitcode: int) -> str:
    """multiprocessing's exit code (negative: the signal that killed it), in words."""
    if exitcode < 0:
        return f"was killed by signal {-exitcode} ({signal.Signals(-exitcode).name})"
    return f"exited with status {exitcode}"


def dead(processes: list[BaseProcess], names: list[str]) -> list[str]:
    """Which of these processes ended, and how (`is_alive` reaps one that did)."""
    return [
        f"SGLang's {name} process (pid {process.pid}) {how_it_ended(process.exitcode)}"
        for process, name in zip(processes, names, strict=True)
        if not process.is_alive() and process.exitcode is not None
    ]


def stop(reasons: list[str]) -> None:
    """Say why, stop every process SGLang started, and exit (from any thread)."""
    if not _stopping.acquire(blocking=False):
        return  # the other path is already stopping the server
    print(
        f"nanospec: error: {'; '.join(reasons)}; the server cannot serve without it, stopping",
        file=sys.stderr,
        flush=True,
    )
    end_processes()
    os._exit(EXIT_ENGINE_DIED)


def end_processes() -> None:
    """SIGKILL every process SGLang started, waiting at most `REAP_WAIT_S` for them."""
    # deferred: imports SGLang only when called
    from sglang.srt.utils import kill_process_tree

    try:
        kill_process_tree(os.getpid(), include_parent=False, wait_timeout=REAP_WAIT_S)
    except RuntimeError as error:  # one not reaped in time: the kernel still ends it
        print(f"nanospec: {error}", file=sys.stderr, flush=True)


def expect_shutdown(*args, **kwargs) -> None:
    """BEFORE hook on uvicorn's and SGLang's exit signal handlers; called at the end of
    `nanospec serve` too: from now on SGLang's processes end on purpose, and the server
    exits within `SHUTDOWN_GRACE_S` (plus the kill) whatever is still open."""
    if _shutting_down.is_set():
        return
    _shutting_down.set()
    threading.Thread(target=_end_after_grace, name="nanospec-shutdown", daemon=True).start()


def _end_after_grace() -> None:
    time.sleep(SHUTDOWN_GRACE_S)
    if not _stopping.acquire(blocking=False):
        return
    print(
        f"nanospec: still shutting down after {SHUTDOWN_GRACE_S:.0f} s (requests open or "
        "SGLang's processes busy); ending them",
        file=sys.stderr,
        flush=True,
    )
    end_processes()
    print("nanospec: stopped", flush=True)
    os._exit(EXIT_STOPPED)


def check_processes_hook(original, watchdog, *args, **kwargs) -> bool:
    """AROUND hook on `SubprocessWatchdog._check_processes` (its thread, once a second):
    any end of a watched process stops the server, an exit with status 0 included.
    True tells the watchdog to stop polling."""
    if _shutting_down.is_set():
        return True
    ended = dead(watchdog._processes, watchdog._names)
    if ended and not _shutting_down.wait(GRACE_S):
        stop(ended)
    return bool(ended)


def sigquit_hook(original, handler, *args, **kwargs) -> None:
    """AROUND hook on SGLang's running-phase SIGQUIT handler, which a failing child
    raises: stop as `check_processes_hook` does instead of SIGKILLing ourselves."""
    if _shutting_down.is_set():
        return original(handler, *args, **kwargs)
    watchdog = handler.tokenizer_manager._subprocess_watchdog
    ended = dead(watchdog._processes, watchdog._names) if watchdog is not None else []
    stop(ended or ["an SGLang process reported a failure (its log is above)"])
