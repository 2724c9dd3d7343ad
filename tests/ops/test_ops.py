"""The ops: the torch reference against plain loops, and every kernel against the reference.

Triton kernels run on CPU under TRITON_INTERPRET=1; the CUDA extension needs a GPU.
"""

import os
import subprocess
import sys

import pytest
import torch

from nanospec_server.ops import build, reference

GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")


def scatter_case(device="cpu", dtype=torch.float32):
    generator = torch.Generator().manual_seed(0)
    src = torch.randn(23, 40, generator=generator).to(device, dtype)
    dst = torch.randn(11, 40, generator=generator).to(device, dtype)  # row 10: dump
    dst_rows = torch.tensor([3, 10, 0, 10, 9, 5], device=device)
    src_rows = torch.tensor([22, 1, 7, 7, 0, 3], device=device)
    return dst, dst_rows, src, src_rows


def append_case(device="cpu"):
    ring = torch.zeros(3, 5, dtype=torch.int64, device=device)  # W_cap 4, + dump column
    last_pos = torch.full((3, 8), -1, dtype=torch.int32, device=device)  # V 7, + dump
    slots = torch.tensor([2, 1], device=device)
    tokens = torch.tensor([[1, 6, 1, 3, 2], [5, 5, 0, 0, 0]], device=device)
    valid = torch.tensor([[1, 1, 1, 1, 1], [1, 0, 1, 0, 0]], device=device).bool()
    positions = torch.tensor([[7, 8, 9, 10, 11], [0, 0, 1, 1, 1]], device=device)
    in_ring = valid & torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]], device=device).bool()
    return ring, last_pos, slots, tokens, positions, valid, in_ring


@pytest.mark.parametrize("compact", [True, False])
def test_reference_scatter_rows_is_a_masked_row_copy(compact):
    dst, dst_rows, src, src_rows = scatter_case()
    expected = dst.clone()
    for out_row, in_row in zip(dst_rows.tolist(), src_rows.tolist(), strict=True):
        if out_row != len(dst) - 1:
            expected[out_row] = src[in_row]
    reference.scatter_rows(dst, dst_rows, src, src_rows, compact)
    assert torch.equal(dst[:-1], expected[:-1])


def test_reference_window_append_keeps_the_latest_position():
    ring, last_pos, *args = append_case()
    reference.window_append(ring, last_pos, *args)
    assert ring[2, :4].tolist() == [6, 1, 3, 2]  # positions 8..11 at p % 4
    assert last_pos[2, :7].tolist() == [-1, 9, 11, 10, -1, -1, 8]
    assert last_pos[1, :7].tolist() == [1, -1, -1, -1, -1, 0, -1]
    assert ring[1, :2].tolist() == [5, 0]


def run_with_triton_interpreter(code: str) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]


def test_triton_kernels_match_the_reference_in_the_interpreter():
    pytest.importorskip("triton")
    run_with_triton_interpreter(
        "import torch, sys; sys.path.insert(0, 'tests/ops')\n"
        "from test_ops import scatter_case, append_case, reference\n"
        "from nanospec_server.ops import triton_kernels as tk\n"
        "a, b = scatter_case(), scatter_case()\n"
        "tk.scatter_rows(*a); reference.scatter_rows(*b)\n"
        "assert torch.equal(a[0][:-1], b[0][:-1])\n"
        "a, b = append_case(), append_case()\n"
        "tk.window_append(*a); reference.window_append(*b)\n"
        "assert torch.equal(a[0][:, :-1], b[0][:, :-1]) and torch.equal(a[1][:, :-1], b[1][:, :-1])\n"
        "h, w, c = torch.randn(5, 70), torch.randn(150, 70), torch.tensor([97])\n"
        "torch.testing.assert_close(tk.packed_logits(h, w, c), reference.packed_logits(h, w, c))\n"
    )


@pytest.mark.skipif(build.find_nvcc() is None, reason="nvcc not installed")
def test_cuda_sources_compile_with_nvcc():
    build.compile_check(archs=("sm_90",))


@GPU
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_kernels_match_the_reference(backend, dtype):
    from nanospec_server.ops import backend as backends

    kernels = backends.cuda_ops() if backend == "cuda" else backends.triton_ops()
    if kernels is None:
        pytest.skip(f"{backend} kernels unavailable")
    a, b = scatter_case("cuda", dtype), scatter_case("cuda", dtype)
    kernels.scatter_rows(*a)
    reference.scatter_rows(*b)
    assert torch.equal(a[0][:-1], b[0][:-1])
    a, b = append_case("cuda"), append_case("cuda")
    kernels.window_append(*a)
    reference.window_append(*b)
    assert torch.equal(a[0][:, :-1], b[0][:, :-1]) and torch.equal(a[1][:, :-1], b[1][:, :-1])
    if backend == "triton":
        hidden = torch.randn(24, 96, device="cuda", dtype=dtype)
        rows = torch.randn(300, 96, device="cuda", dtype=dtype)
        count = torch.tensor([211], device="cuda")
        expected = reference.packed_logits(hidden, rows, count)
        actual = kernels.packed_logits(hidden, rows, count)
        torch.testing.assert_close(actual, expected, atol=0.05, rtol=0.02)
