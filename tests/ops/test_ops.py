"""The ops: the torch reference against plain loops, and every kernel against the reference.

Triton kernels run on CPU under TRITON_INTERPRET=1; the CUDA extension needs a GPU.
"""

import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

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
    """W_cap 4, V 8. Slot 2 has streamed [1, 2, 3, 4, 5, 1, 6] (positions 3..6 in the ring,
    all latest); it appends [1, 6, 1, 3] with the 6 masked. Slot 1 appends [5, 5, 0]."""
    ring = torch.zeros(3, 5, dtype=torch.int32, device=device)  # + dump column
    latest = torch.zeros(3, 5, dtype=torch.bool, device=device)
    ring[2, :4] = torch.tensor([5, 1, 6, 4])  # position p at column p % 4
    latest[2, :4] = True
    slots = torch.tensor([2, 1], device=device)
    tokens = torch.tensor([[1, 6, 1, 3], [5, 5, 0, 0]], device=device)
    positions = torch.tensor([[7, 7, 8, 9], [0, 1, 2, 2]], device=device)
    in_ring = torch.tensor([[1, 0, 1, 1], [1, 1, 1, 0]], device=device).bool()
    return ring, latest, slots, tokens, positions, in_ring


def stream_state(stream: list[int], w_cap: int) -> tuple[list[int], list[bool]]:
    """Ring cells and latest flags of a stream, from the definition (plain loops)."""
    ring, latest = [0] * w_cap, [False] * w_cap
    for p in range(max(0, len(stream) - w_cap), len(stream)):
        ring[p % w_cap] = stream[p]
        latest[p % w_cap] = stream[p] not in stream[p + 1 :]
    return ring, latest


@pytest.mark.parametrize("compact", [True, False])
def test_reference_scatter_rows_is_a_masked_row_copy(compact):
    dst, dst_rows, src, src_rows = scatter_case()
    expected = dst.clone()
    for out_row, in_row in zip(dst_rows.tolist(), src_rows.tolist(), strict=True):
        if out_row != len(dst) - 1:
            expected[out_row] = src[in_row]
    reference.scatter_rows(dst, dst_rows, src, src_rows, compact)
    assert torch.equal(dst[:-1], expected[:-1])


def test_reference_window_append_keeps_the_latest_flags():
    ring, latest, *args = append_case()
    reference.window_append(ring, latest, *args)
    assert ring[2, :4].tolist() == [1, 3, 6, 1]  # positions 8, 9, 6 (kept), 7
    # The 1 at position 7 is followed by another; the masked 6 supersedes nothing.
    assert latest[2, :4].tolist() == [True, True, True, False]
    assert ring[1, :3].tolist() == [5, 5, 0]
    assert latest[1, :4].tolist() == [False, True, True, False]


@settings(max_examples=60, deadline=None)
@given(
    w_cap=st.integers(1, 8),
    appends=st.lists(
        st.lists(st.tuples(st.integers(0, 4), st.booleans()), max_size=20), max_size=6
    ),
)
def test_reference_window_append_matches_the_definition(w_cap, appends):
    """Random appends (few distinct tokens: many repeats; masks; appends longer than the
    ring) leave the ring and its flags as the definition says."""
    ring = torch.zeros(1, w_cap + 1, dtype=torch.int32)
    latest = torch.zeros(1, w_cap + 1, dtype=torch.bool)
    stream: list[int] = []
    for rows in appends:
        tokens = torch.tensor([[t for t, _ in rows]], dtype=torch.int64).view(1, len(rows))
        valid = torch.tensor([[v for _, v in rows]], dtype=torch.bool).view(1, len(rows))
        offset = valid.cumsum(1) - 1
        count = valid.sum(1, keepdim=True)
        in_ring = valid & (offset >= count - w_cap)
        positions = len(stream) + offset
        reference.window_append(ring, latest, torch.tensor([0]), tokens, positions, in_ring)
        stream += [t for t, v in rows if v]
        want_ring, want_latest = stream_state(stream, w_cap)
        reached = min(len(stream), w_cap)  # cells no position reached yet hold anything
        cells = [p % w_cap for p in range(len(stream) - reached, len(stream))]
        assert [int(ring[0, c]) for c in cells] == [want_ring[c] for c in cells]
        assert [bool(latest[0, c]) for c in cells] == [want_latest[c] for c in cells]


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
    if backend == "triton":
        a, b = append_case("cuda"), append_case("cuda")
        kernels.window_append(*a)
        reference.window_append(*b)
        assert torch.equal(a[0][:, :-1], b[0][:, :-1]) and torch.equal(a[1][:, :-1], b[1][:, :-1])
        hidden = torch.randn(24, 96, device="cuda", dtype=dtype)
        rows = torch.randn(300, 96, device="cuda", dtype=dtype)
        count = torch.tensor([211], device="cuda")
        expected = reference.packed_logits(hidden, rows, count)
        actual = kernels.packed_logits(hidden, rows, count)
        torch.testing.assert_close(actual, expected, atol=0.05, rtol=0.02)
