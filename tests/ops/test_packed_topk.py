"""The fused packed-head top-k kernel against its torch reference, in the Triton
interpreter on CPU (hypothesis: random capacities, live counts, pinned rows, ties)."""

from tests.ops.interpreted import run_check


def test_fused_packed_topk_matches_the_torch_reference():
    result = run_check("packed_topk_check.py", "cpu", "60")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")
