"""Run one of this folder's ``*_check.py`` scripts in the Triton interpreter on CPU.

The interpreter is chosen when Triton is imported, so each check runs in its own process."""

import os
import subprocess
import sys
from pathlib import Path

import pytest


def run_check(script: str, *args: str, ops: str | None = None) -> subprocess.CompletedProcess:
    """``script`` under TRITON_INTERPRET=1 (and NANOSPEC_OPS=``ops`` if given)."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    if ops is not None:
        env["NANOSPEC_OPS"] = ops
    command = [sys.executable, str(Path(__file__).with_name(script)), *args]
    return subprocess.run(command, env=env, capture_output=True, text=True)
