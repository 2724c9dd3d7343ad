"""The fused union bookkeeping against UnionHead's torch reference, in the Triton
interpreter on CPU: random multi-request streams, capacities that overflow."""

from tests.ops.interpreted import run_check


def test_fused_union_apply_matches_the_torch_reference():
    result = run_check("union_apply_check.py", "cpu", "12", ops="triton")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")
