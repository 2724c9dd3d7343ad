"""A bench stopped by SIGTERM still runs its cleanup (and so stops its servers)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import sys, time
from pathlib import Path
from nanospec_server.launch.server import exit_on_sigterm

marker = Path(sys.argv[1])
with exit_on_sigterm():
    try:
        print("inside", flush=True)
        time.sleep(60)
    finally:
        marker.write_text("cleaned up")
"""


def test_sigterm_inside_runs_the_cleanup(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    child = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(marker)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout.readline().strip() == "inside"
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=30) == 128 + signal.SIGTERM
    assert marker.read_text() == "cleaned up"


def test_the_previous_handler_is_back_outside() -> None:
    from nanospec_server.launch.server import exit_on_sigterm

    before = signal.getsignal(signal.SIGTERM)
    with exit_on_sigterm():
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before
