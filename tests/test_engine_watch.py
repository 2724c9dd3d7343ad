"""Which of SGLang's processes ended, and how, in the words `nanospec serve` stops with."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time

from nanospec_server.engine_watch import dead

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
