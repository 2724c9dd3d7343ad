"""The CUDA path of DynamicVocab (fixed shapes, Triton kernels) on CPU through the Triton
interpreter, against the torch reference path: same union, same top-k, and the packed
logits kernel reads only the live rows although the buffer's shape is its capacity."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def test_cuda_path_matches_the_reference_in_the_triton_interpreter():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "NANOSPEC_OPS": "triton"}
    command = [sys.executable, str(HERE / "cuda_path_check.py"), "cpu", "4"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")
