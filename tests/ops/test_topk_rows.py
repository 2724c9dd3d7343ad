"""The C++ row top-k (ops/kernels/topk_cpu.cpp) against a plain reference: a stable sort
of each row, descending (the lowest index first among equal values), NaN never chosen.
Rows with many ties, NaN and -inf, widths around the kernel's 64-entry blocks, row
strides past the width, float32 and bfloat16."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanospec_server import ops
from nanospec_server.ops import cpu_kernels


def reference(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Stable sort, descending; NaN as -inf; a row short of k entries above -inf takes the
    lowest indices not yet taken (what the kernel documents)."""
    inf = float("inf")
    values = logits.float().nan_to_num(nan=-inf, posinf=inf, neginf=-inf)
    rows = []
    for row in values:
        order = torch.sort(-row, stable=True).indices.tolist()
        above = [i for i in order if row[i] > float("-inf")][:k]
        rest = [i for i in range(row.numel()) if i not in above]
        rows.append(above + rest[: k - len(above)])
    return torch.tensor(rows, dtype=torch.int64)


@st.composite
def matrices(draw):
    rows = draw(st.integers(1, 5))
    cols = draw(st.sampled_from([1, 3, 63, 64, 65, 130, 1000]))
    k = draw(st.integers(1, min(cols, 8)))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    distinct = draw(st.sampled_from([2, 5, 1000]))  # few distinct values: many ties
    seed = draw(st.integers(0, 2**31 - 1))
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randint(-distinct, distinct, (rows, cols + 3), generator=generator).float()
    special = torch.rand((rows, cols + 3), generator=generator)
    if draw(st.booleans()):
        logits[special < 0.1] = float("nan")
    if draw(st.booleans()):
        logits[special > 0.8] = float("-inf")
    strided = draw(st.booleans())  # a view whose rows are longer than its width
    logits = logits.to(dtype)
    return (logits[:, :cols] if strided else logits[:, :cols].contiguous()), k


@settings(max_examples=300, deadline=None)
@given(matrices())
def test_topk_rows_matches_a_stable_sort(case):
    logits, k = case
    assert torch.equal(cpu_kernels.topk_rows(logits, k), reference(logits, k))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_split_among_threads_match_one_thread(dtype):
    """Enough rows that the kernel splits them among threads, with NaN rows flagged."""
    rows = 3 * cpu_kernels.ROWS_PER_THREAD + 5
    logits = torch.randint(-8, 8, (rows, 333), generator=torch.Generator().manual_seed(3))
    logits = logits.float().to(dtype)
    logits[7, 11] = float("nan")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        nan_rows = torch.empty(rows, dtype=torch.bool)
        split = cpu_kernels.topk_rows(logits, 4, nan_rows)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(split, reference(logits, 4))
    assert nan_rows.nonzero().flatten().tolist() == [7]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_topk_indices_gives_the_values_torch_topk_gives_over_a_vocabulary(dtype):
    logits = torch.randn(9, 151_936).to(dtype)
    ours = ops.topk_indices(logits, 3)
    values, _ = logits.topk(3, dim=-1)
    assert torch.equal(logits.gather(1, ours), values)
    assert torch.equal(ours, reference(logits, 3))


def test_topk_indices_clamps_k_to_the_width():
    logits = torch.tensor([[0.5, 2.0]])
    assert ops.topk_indices(logits, 5).tolist() == [[1, 0]]


@settings(max_examples=200, deadline=None)
@given(matrices(), st.booleans())
def test_the_first_column_is_torchs_argmax_on_rows_with_a_maximum(case, with_posinf):
    """A plain step reads its greedy tokens from the top-k (`plain_step.argmax_from_top`):
    on every row with something to pick (no NaN, not all -inf), the first column is
    torch.argmax's answer, +inf and ties included."""
    logits, k = case
    logits = logits.clone()
    if with_posinf:
        logits[:, :: max(1, logits.shape[1] // 3)] = float("inf")
    usable = ~torch.isnan(logits).any(dim=1) & (logits.float().amax(dim=1) > float("-inf"))
    first = ops.topk_indices(logits, k)[:, 0]
    assert torch.equal(first[usable], torch.argmax(logits, dim=-1)[usable])


@settings(max_examples=200, deadline=None)
@given(matrices(), st.booleans())
def test_the_rows_with_nothing_to_pick_are_unsamplable_rows_from_the_same_pass(case, on_cpu):
    """`topk_and_empty_rows` (a plain step's greedy rows): the top-k of `topk_indices`, and
    the rows `unsamplable_rows` finds without temperatures (a NaN, or all -inf), whether
    from the C++ pass's flags or torch's fallback."""
    from nanospec_server.sglang_plugin.requests.unsamplable_rows import unsamplable_rows

    logits, k = case
    if not on_cpu:  # the fallback other devices take: torch.topk and a second reduction
        logits = logits.to(torch.float16)
    top, empty = ops.topk_and_empty_rows(logits, k)
    assert torch.equal(empty, unsamplable_rows(logits, None))
    if on_cpu:
        assert torch.equal(top, ops.topk_indices(logits, k))
