"""The per-row ops on SGLang's CPU path give a row the same bits whatever rows share the
call: what lets a verify pass (many rows) reproduce a one-token decode (one row) exactly,
together with our attention and packed linears (tests/sgl_kernel_cpu, tests/ops). In fp32
and in bf16, the dtypes a CPU server runs in."""

from __future__ import annotations

import pytest
import torch

from nanospec_server.host import prepare_cpu_environment

prepare_cpu_environment()  # SGLang's layers import sgl_kernel: the stand-in on this host

from sglang.srt.layers.activation import SiluAndMul  # noqa: E402
from sglang.srt.layers.layernorm import RMSNorm  # noqa: E402
from sglang.srt.layers.rotary_embedding import base as rope_base  # noqa: E402
from sglang.srt.layers.rotary_embedding import get_rope  # noqa: E402

ROWS = (2, 3, 5, 8, 13, 21)
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])


def assert_row_invariant(op, width: int, seed: int, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(seed)
    for rows in ROWS:
        x = torch.randn(rows, width, generator=gen).to(dtype)
        together = op(x)
        for i in range(rows):
            assert torch.equal(op(x[i : i + 1].clone())[0], together[i]), (rows, i)


@DTYPES
@pytest.mark.parametrize("hidden", [64, 896, 1536])
def test_rms_norm_with_and_without_residual(hidden: int, dtype: torch.dtype) -> None:
    norm = RMSNorm(hidden, eps=1e-6)
    weight = torch.rand(hidden, generator=torch.Generator().manual_seed(1)) + 0.5
    norm.weight.data = weight.to(dtype)
    assert_row_invariant(norm.forward_native, hidden, seed=2, dtype=dtype)
    # fused with the residual add, as every layer after the first calls it
    assert_row_invariant(lambda x: norm.forward_native(x, x * 0.5)[0], hidden, 3, dtype)


@DTYPES
@pytest.mark.parametrize("intermediate", [128, 4864, 8960])
def test_silu_and_mul(intermediate: int, dtype: torch.dtype) -> None:
    assert_row_invariant(SiluAndMul().forward_native, 2 * intermediate, seed=4, dtype=dtype)


@pytest.mark.parametrize("vocab", [512, 151936])
def test_log_softmax_of_logits(vocab: int) -> None:
    # SGLang takes the log-softmax of float32 logits in either dtype
    assert_row_invariant(lambda x: torch.log_softmax(x, dim=-1), vocab, 5, torch.float32)


@DTYPES
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(4, 2, 16), (14, 2, 64), (12, 2, 128)])
def test_rotary_embedding(
    heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, monkeypatch
) -> None:
    # SGLang reads the platform once, at import; in this test process another test may have
    # imported it before the CPU switch was set (a server sets it first), and on a non-CPU
    # platform the rotary layer would look for a CUDA kernel.
    monkeypatch.setattr(rope_base, "_is_cpu", True)
    rope = get_rope(head_dim, rotary_dim=head_dim, max_position=4096, base=1000000.0, dtype=dtype)
    gen = torch.Generator().manual_seed(6)
    for rows in ROWS:
        positions = torch.randint(0, 4096, (rows,), generator=gen)
        q = torch.randn(rows, heads * head_dim, generator=gen).to(dtype)
        k = torch.randn(rows, kv_heads * head_dim, generator=gen).to(dtype)
        q_all, k_all = rope.forward_native(positions, q.clone(), k.clone())
        for i in range(rows):
            q_one, k_one = rope.forward_native(
                positions[i : i + 1], q[i : i + 1].clone(), k[i : i + 1].clone()
            )
            assert torch.equal(q_one[0], q_all[i]) and torch.equal(k_one[0], k_all[i])
