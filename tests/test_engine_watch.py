"""Which of SGLang's processes ended, and how, in the words `nanospec serve` stops with;
a shutdown that cannot finish still ends."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time

from nanospec_server.engine_watch import EXIT_STOPPED, SHUTDOWN_GRACE_S, dead

CONTEXT = multiprocessing.get_context("spawn")


def test_a_dead_process_is_named_with_how_it_ended() -> None:
    sleeper = CONTEXT.Process(target=time.sleep, args=(60,))
    exiting = CONTEXT.Process(target=sys.exit, args=(3,))
    for process in (sleeper, exiting):
        process.start()
    try:
        exiting.join(timeout=60)
        assert dead([sleeper], ["scheduler_0"]) == []
        os.kill(sleeper.pid, signal.SIGKILL)
        sleeper.join(timeout=60)
        assert dead([sleeper, exiting], ["scheduler_0", "detokenizer"]) == [
            f"SGLang's scheduler_0 process (pid {sleeper.pid}) was killed by signal 9 (SIGKILL)",
            f"SGLang's detokenizer process (pid {exiting.pid}) exited with status 3",
        ]
    finally:
        sleeper.kill()
        sleeper.join()


STUCK_SHUTDOWN = """
import time
import sglang.srt.utils  # imported, as in a server
from nanospec_server import engine_watch

engine_watch.expect_shutdown()
print("shutting down", flush=True)
time.sleep(120)  # an open request that never drains
"""


def test_a_shutdown_that_cannot_finish_ends_after_the_grace() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", STUCK_SHUTDOWN], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert child.stdout.readline().strip() == b"shutting down"
    asked = time.monotonic()
    assert child.wait(timeout=60) == EXIT_STOPPED
    assert time.monotonic() - asked < SHUTDOWN_GRACE_S + 5
    assert b"nanospec: stopped" in child.stdout.read()
    assert b"still shutting down after" in child.stderr.read()
