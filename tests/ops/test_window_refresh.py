"""The Triton window append and fused window refresh against WindowState's torch code, in
the Triton interpreter on CPU (repeats, W_max shrinking and growing back, per-row W_max)."""

from tests.ops.interpreted import run_check


def test_triton_window_append_and_refresh_match_the_torch_reference():
    result = run_check("window_refresh_check.py", "cpu", "20", ops="reference")
    assert result.returncode == 0, result.stderr[-3000:]
