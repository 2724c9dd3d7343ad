"""``packed_topk``: fused GEMM and running top-k over the packed rows. Semantics: ``ops/reference.py``."""

import torch
import triton
import triton.language as tl
from torch import Tensor

from nanospec_server.ops.triton_kernels.bitmap import word_and_bit


@triton.jit
def _take_best(values, rows, best_v, best_r, taken, K: tl.constexpr, SENTINEL: tl.constexpr):
    """Merge candidates (values, rows) into the sorted best list (best_v, best_r): K rounds,
    each taking the largest value left, ties to the lowest row. ``taken`` marks the list's
    columns. Rows equal to SENTINEL are not candidates."""
    new_v = tl.full(best_v.shape, float("-inf"), tl.float32)
    new_r = tl.full(best_r.shape, SENTINEL, tl.int32)
    for j in tl.static_range(K):
        v = tl.maximum(
            tl.max(tl.where(rows < SENTINEL, values, float("-inf")), axis=1),
            tl.max(tl.where(best_r < SENTINEL, best_v, float("-inf")), axis=1),
        )
        from_tile = tl.min(tl.where((values == v[:, None]) & (rows < SENTINEL), rows, SENTINEL), 1)
        from_best = tl.min(
            tl.where((best_v == v[:, None]) & (best_r < SENTINEL), best_r, SENTINEL), 1
        )
        row = tl.minimum(from_tile, from_best)
        new_v = tl.where(taken == j, v[:, None], new_v)
        new_r = tl.where(taken == j, row[:, None], new_r)
        rows = tl.where(rows == row[:, None], SENTINEL, rows)
        best_r = tl.where(best_r == row[:, None], SENTINEL, best_r)
    return new_v, new_r


@triton.jit
def _packed_topk_partial_kernel(
    hidden, rows, count, ids, in_set, row_slots, part_v, part_r, part_m, part_s,
    n_rows, hidden_size, num_pinned, stride_h, stride_r, words_stride,
    SPLITS: tl.constexpr, K: tl.constexpr, KP: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Program (split, n-block): the row tiles split, split + SPLITS, ... below the live
    count. Per hidden row: the best K (logit, row) pairs seen and an online log-sum-exp
    (running max m, sum s of exp(logit - m)). Tiles at or past the count are never
    visited: the loop bound is the device-side count, the grid is fixed."""
    SENTINEL: tl.constexpr = 2**31 - 1
    split = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < n_rows
    live = tl.load(count).to(tl.int32)
    slot = tl.load(row_slots + n, mask=n_ok, other=0)
    taken = tl.arange(0, KP)[None, :]
    best_v = tl.full((BLOCK_N, KP), float("-inf"), tl.float32)
    best_r = tl.full((BLOCK_N, KP), SENTINEL, tl.int32)
    m = tl.full((BLOCK_N,), float("-inf"), tl.float32)
    s = tl.zeros((BLOCK_N,), tl.float32)
    for tile in range(split, tl.cdiv(live, BLOCK_R), SPLITS):
        r = tile * BLOCK_R + tl.arange(0, BLOCK_R)
        r_ok = r < live
        acc = tl.zeros((BLOCK_N, BLOCK_R), dtype=tl.float32)
        for start in range(0, hidden_size, BLOCK_D):
            d = start + tl.arange(0, BLOCK_D)
            d_ok = d < hidden_size
            h = tl.load(
                hidden + n[:, None] * stride_h + d[None, :],
                mask=n_ok[:, None] & d_ok[None, :],
                other=0.0,
            )
            w = tl.load(
                rows + r[:, None] * stride_r + d[None, :],
                mask=r_ok[:, None] & d_ok[None, :],
                other=0.0,
            )
            acc += tl.dot(h, tl.trans(w))
        token = tl.load(ids + r, mask=r_ok, other=-1)
        held = token >= 0
        word, bit = word_and_bit(tl.where(held, token, 0))
        member = tl.load(
            in_set + slot[:, None].to(tl.int64) * words_stride + word[None, :],
            mask=n_ok[:, None] & held[None, :], other=0,
        ) & bit[None, :]  # fmt: skip
        allowed = (r_ok & held)[None, :] & ((r < num_pinned)[None, :] | (member != 0))
        x = tl.where(allowed, acc, float("-inf"))
        m_new = tl.maximum(m, tl.max(x, axis=1))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - shift) + tl.sum(tl.exp(x - shift[:, None]), axis=1)
        m = m_new
        tile_rows = tl.zeros((BLOCK_N, BLOCK_R), tl.int32) + r[None, :]
        best_v, best_r = _take_best(x, tile_rows, best_v, best_r, taken, K, SENTINEL)
    out = n[:, None] * (SPLITS * KP) + split * KP + taken
    tl.store(part_v + out, best_v, mask=n_ok[:, None])
    tl.store(part_r + out, best_r, mask=n_ok[:, None])
    tl.store(part_m + n * SPLITS + split, m, mask=n_ok)
    tl.store(part_s + n * SPLITS + split, s, mask=n_ok)


@triton.jit
def _packed_topk_merge_kernel(
    part_v, part_r, part_m, part_s, top_v, top_r, lse, n_rows, capacity,
    SPLITS: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Per hidden row: the best K of the SPLITS partial lists, and the combined
    log-sum-exp. Rows never filled (fewer than K allowed) come out as row 0."""
    SENTINEL: tl.constexpr = 2**31 - 1
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < n_rows
    c = tl.arange(0, SPLITS * KP)[None, :]
    values = tl.load(
        part_v + n[:, None] * (SPLITS * KP) + c, mask=n_ok[:, None], other=float("-inf")
    )
    rows = tl.load(part_r + n[:, None] * (SPLITS * KP) + c, mask=n_ok[:, None], other=SENTINEL)
    taken = tl.arange(0, KP)[None, :]
    best_v = tl.full((BLOCK_N, KP), float("-inf"), tl.float32)
    best_r = tl.full((BLOCK_N, KP), SENTINEL, tl.int32)
    best_v, best_r = _take_best(values, rows, best_v, best_r, taken, K, SENTINEL)
    best_r = tl.where(best_r < capacity, best_r, 0)
    out = n[:, None] * K + taken
    tl.store(top_v + out, best_v, mask=n_ok[:, None] & (taken < K))
    tl.store(top_r + out, best_r.to(tl.int64), mask=n_ok[:, None] & (taken < K))
    split = tl.arange(0, SPLITS)[None, :]
    m = tl.load(part_m + n[:, None] * SPLITS + split, mask=n_ok[:, None], other=float("-inf"))
    s = tl.load(part_s + n[:, None] * SPLITS + split, mask=n_ok[:, None], other=0.0)
    top = tl.max(m, axis=1)
    shift = tl.where(top == float("-inf"), 0.0, top)
    total = tl.sum(s * tl.exp(m - shift[:, None]), axis=1)
    log_total = tl.log(tl.where(total > 0, total, 1.0))
    tl.store(lse + n, tl.where(total > 0, shift + log_total, float("-inf")), mask=n_ok)


def packed_topk(
    hidden: Tensor, rows: Tensor, count: Tensor, ids: Tensor, in_set: Tensor,
    row_slots: Tensor, num_pinned: int, k: int, splits: int = 64,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """``reference.packed_topk`` in two launches: a split GEMM + running top-k over the
    live row tiles (fixed grid; tiles past the device-side ``count`` are skipped), then a
    merge of the splits. Graph-capturable: no host read, shapes depend on N, k only."""
    n_rows, hidden_size = hidden.shape
    capacity, device = rows.shape[0], rows.device
    assert rows.stride(1) == 1 and in_set.is_contiguous() and in_set.dtype == torch.int32
    assert k >= 1
    hidden = hidden.to(rows.dtype).contiguous()
    block_r, block_d = 64, 64
    block_n = max(16, min(64, triton.next_power_of_2(max(n_rows, 1))))
    splits = triton.next_power_of_2(max(1, min(splits, triton.cdiv(capacity, block_r))))
    kp = triton.next_power_of_2(max(k, 2))
    part_v = torch.empty(n_rows, splits, kp, dtype=torch.float32, device=device)
    part_r = torch.empty(n_rows, splits, kp, dtype=torch.int32, device=device)
    part_m = torch.empty(n_rows, splits, dtype=torch.float32, device=device)
    part_s = torch.empty(n_rows, splits, dtype=torch.float32, device=device)
    top_v = torch.empty(n_rows, k, dtype=torch.float32, device=device)
    top_r = torch.empty(n_rows, k, dtype=torch.int64, device=device)
    lse = torch.empty(n_rows, dtype=torch.float32, device=device)
    if n_rows == 0:
        return top_v, top_r, lse
    _packed_topk_partial_kernel[(splits, triton.cdiv(n_rows, block_n))](
        hidden, rows, count, ids, in_set, row_slots.to(torch.int64).contiguous(),
        part_v, part_r, part_m, part_s, n_rows, hidden_size, num_pinned,
        hidden.stride(0), rows.stride(0), in_set.shape[1],
        SPLITS=splits, K=k, KP=kp, BLOCK_N=block_n, BLOCK_R=block_r, BLOCK_D=block_d,
    )  # fmt: skip
    merge_block = 16
    _packed_topk_merge_kernel[(triton.cdiv(n_rows, merge_block),)](
        part_v, part_r, part_m, part_s, top_v, top_r, lse, n_rows, capacity,
        SPLITS=splits, K=k, KP=kp, BLOCK_N=merge_block,
    )  # fmt: skip
    return top_v, top_r, lse
