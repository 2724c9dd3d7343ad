"""The Triton window append and fused window refresh against WindowState's torch code, in
the Triton interpreter on CPU (repeats, W_max shrinking and growing back, per-row W_max)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

CHECK = Path(__file__).with_name("window_refresh_check.py")


def test_triton_window_append_and_refresh_match_the_torch_reference():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "NANOSPEC_OPS": "reference"}
    result = subprocess.run(
        [sys.executable, str(CHECK), "cpu", "20"], env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
