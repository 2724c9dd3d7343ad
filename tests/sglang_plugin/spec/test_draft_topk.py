"""The fused draft top-k through SGLang's own draft top-k functions (hooked) equals those
functions over the full-width packed logits: run in the Triton interpreter on CPU."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

CHECK = Path(__file__).with_name("draft_topk_check.py")


def test_fused_draft_topk_matches_sglangs_topk_over_full_logits():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run(
        [sys.executable, str(CHECK), "3"], env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")
