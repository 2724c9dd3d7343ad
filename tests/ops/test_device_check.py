"""benchmarks/device_check.py imports everywhere and, without a GPU, says so and exits 2."""

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
