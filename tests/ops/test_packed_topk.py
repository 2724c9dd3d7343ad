"""The fused packed-head top-k kernel against its torch reference, in the Triton
interpreter on CPU (hypothesis: random capacities, live counts, pinned rows, ties)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

CHECK = Path(__file__).with_name("packed_topk_check.py")


def test_fused_packed_topk_matches_the_torch_reference():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run(
        [sys.executable, str(CHECK), "cpu", "60"], env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")
