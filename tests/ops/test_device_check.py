"""benchmarks/device_check.py: without a GPU it says so and exits 2; --dry-run runs all of
it on the CPU (Triton interpreter, tiny shapes)."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks/device_check.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the script would run")
def test_device_check_fails_gracefully_without_a_gpu():
    result = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "no CUDA GPU" in result.stdout
    assert "Traceback" not in result.stderr


def test_device_check_dry_run_exercises_every_part_on_the_cpu():
    """--dry-run: tiny shapes through the Triton interpreter, so the script cannot rot."""
    pytest.importorskip("triton")
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run"], capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    for part in ("[1] fused union bookkeeping", "[1] fused packed head + top-k", "[2] eager"):
        assert part in result.stdout
    assert "fused head+top-k" in result.stdout and "all checks passed" in result.stdout
