"""The fused union bookkeeping against UnionHead's torch reference, in the Triton
interpreter on CPU: random multi-request streams, capacities that overflow."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

CHECK = Path(__file__).with_name("union_apply_check.py")


def test_fused_union_apply_matches_the_torch_reference():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "NANOSPEC_OPS": "triton"}
    result = subprocess.run(
        [sys.executable, str(CHECK), "cpu", "12"], env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")
