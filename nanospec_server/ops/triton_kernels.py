"""Triton versions of the ops (same semantics as ``reference.py``).

They run on CUDA tensors, and on CPU tensors under ``TRITON_INTERPRET=1`` (tests).
"""

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _scatter_rows_kernel(
    dst, dst_rows, src, src_rows, hidden, dst_stride, src_stride, dump_row, BLOCK: tl.constexpr
):
    i = tl.program_id(0)
    out_row = tl.load(dst_rows + i)
    if out_row != dump_row:  # masked entries cost one load
        in_row = tl.load(src_rows + i)
        for start in range(0, hidden, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < hidden
            values = tl.load(src + in_row * src_stride + cols, mask=mask)
            tl.store(dst + out_row * dst_stride + cols, values, mask=mask)


def scatter_rows(dst: Tensor, dst_rows: Tensor, src: Tensor, src_rows: Tensor) -> None:
    assert dst.dtype == src.dtype and dst.stride(1) == 1 and src.stride(1) == 1
    count = dst_rows.numel()
    if count:
        block = min(1024, triton.next_power_of_2(dst.shape[1]))
        _scatter_rows_kernel[(count,)](
            dst,
            dst_rows,
            src,
            src_rows,
            dst.shape[1],
            dst.stride(0),
            src.stride(0),
            dst.shape[0] - 1,
            BLOCK=block,
        )


@triton.jit
def _ring_supersede_kernel(
    ring, latest, slots, tokens, in_ring, length, ring_stride, w_cap,
    BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr,
):  # fmt: skip
    """Program (row b, block of ring cells): a cell whose token is among row b's appended
    tokens loses its ``latest`` flag (cells about to be overwritten too: no matter)."""
    b = tl.program_id(0)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    inside = c < w_cap
    state = tl.load(slots + b) * ring_stride
    old = tl.load(ring + state + c, mask=inside, other=-1).to(tl.int64)
    hit = tl.zeros((BLOCK_C,), tl.int32)
    for first in range(0, length, BLOCK_T):
        t = first + tl.arange(0, BLOCK_T)
        keep = (t < length) & (tl.load(in_ring + b * length + t, mask=t < length, other=0) != 0)
        token = tl.load(tokens + b * length + t, mask=keep, other=0)
        token = tl.where(keep, token, -2)  # -2: matches no cell (stale cells hold >= 0)
        same = (old[:, None] == token[None, :]).to(tl.int32)
        hit = tl.maximum(hit, tl.max(same, axis=1))
    flag = tl.load(latest + state + c, mask=inside, other=0)
    tl.store(latest + state + c, tl.where(hit > 0, 0, flag).to(tl.int8), mask=inside)


@triton.jit
def _ring_write_kernel(
    ring, latest, slots, tokens, positions, in_ring, length, ring_stride, w_cap,
    BLOCK_T: tl.constexpr,
):  # fmt: skip
    """Program (row b, block of appended tokens): write them into the ring, each flagged
    iff no later token of the row is the same. Runs after ``_ring_supersede_kernel``."""
    b = tl.program_id(0)
    i = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    keep = (i < length) & (tl.load(in_ring + b * length + i, mask=i < length, other=0) != 0)
    state = tl.load(slots + b) * ring_stride
    token = tl.load(tokens + b * length + i, mask=keep, other=-2)
    position = tl.load(positions + b * length + i, mask=keep, other=0)
    later = tl.zeros((BLOCK_T,), tl.int32)
    for first in range(tl.program_id(1) * BLOCK_T, length, BLOCK_T):
        j = first + tl.arange(0, BLOCK_T)
        j_keep = (j < length) & (tl.load(in_ring + b * length + j, mask=j < length, other=0) != 0)
        other = tl.load(tokens + b * length + j, mask=j_keep, other=0)
        other = tl.where(j_keep, other, -3)
        same = (token[:, None] == other[None, :]) & (j[None, :] > i[:, None])
        later = tl.maximum(later, tl.max(same.to(tl.int32), axis=1))
    cell = state + position % w_cap
    tl.store(ring + cell, token.to(tl.int32), mask=keep)
    tl.store(latest + cell, (later == 0).to(tl.int8), mask=keep)


def window_append(
    ring: Tensor,
    latest: Tensor,
    slots: Tensor,
    tokens: Tensor,
    positions: Tensor,
    in_ring: Tensor,
) -> None:
    """``reference.window_append`` in two launches: flags of superseded cells (grid rows x
    cell blocks), then the new cells (grid rows x token blocks). Fixed grid for a given
    [B, L]: graph-capturable."""
    assert ring.is_contiguous() and latest.is_contiguous() and ring.dtype == torch.int32
    batch, length = tokens.shape
    if batch * length == 0:
        return
    w_cap = ring.shape[1] - 1
    slots, tokens = slots.contiguous(), tokens.to(torch.int64).contiguous()
    in_ring = in_ring.to(torch.int8).contiguous()
    flags = latest.view(torch.int8)
    block_c, block_t = 128, 64
    _ring_supersede_kernel[(batch, triton.cdiv(w_cap, block_c))](
        ring, flags, slots, tokens, in_ring, length, ring.shape[1], w_cap,
        BLOCK_C=block_c, BLOCK_T=block_t,
    )  # fmt: skip
    _ring_write_kernel[(batch, triton.cdiv(length, block_t))](
        ring, flags, slots, tokens, positions.contiguous(), in_ring, length, ring.shape[1],
        w_cap, BLOCK_T=block_t,
    )  # fmt: skip


@triton.jit
def _packed_logits_kernel(
    hidden, rows, count, out, n_rows, n_cols, hidden_size, stride_h, stride_r, stride_o,
    BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    live = tl.load(count)
    acc = tl.full((BLOCK_N, BLOCK_R), float("-inf"), dtype=tl.float32)
    # Tiles past the live row count read no weight: the buffer's capacity costs nothing.
    if tl.program_id(0) * BLOCK_R < live:
        acc = tl.zeros((BLOCK_N, BLOCK_R), dtype=tl.float32)
        for start in range(0, hidden_size, BLOCK_D):
            d = start + tl.arange(0, BLOCK_D)
            h_mask = (n[:, None] < n_rows) & (d[None, :] < hidden_size)
            h = tl.load(hidden + n[:, None] * stride_h + d[None, :], mask=h_mask, other=0.0)
            w_mask = (r[:, None] < live) & (d[None, :] < hidden_size)
            w = tl.load(rows + r[:, None] * stride_r + d[None, :], mask=w_mask, other=0.0)
            acc += tl.dot(h, tl.trans(w))
        acc = tl.where(r[None, :] < live, acc, float("-inf"))
    mask = (n[:, None] < n_rows) & (r[None, :] < n_cols)
    tl.store(out + n[:, None] * stride_o + r[None, :], acc, mask=mask)


def packed_logits(hidden: Tensor, rows: Tensor, count: Tensor) -> Tensor:
    """float32 logits [N, R] of hidden [N, d] against rows[:count]; -inf past ``count``."""
    n_rows, hidden_size = hidden.shape
    capacity = rows.shape[0]
    hidden = hidden.to(rows.dtype).contiguous()
    block_r, block_d = 64, 64
    block_n = max(16, min(64, triton.next_power_of_2(n_rows)))
    out = torch.empty(n_rows, capacity, dtype=torch.float32, device=rows.device)
    grid = (triton.cdiv(capacity, block_r), triton.cdiv(n_rows, block_n))
    _packed_logits_kernel[grid](
        hidden, rows, count, out, n_rows, capacity, hidden_size, hidden.stride(0),
        rows.stride(0), out.stride(0), BLOCK_N=block_n, BLOCK_R=block_r, BLOCK_D=block_d,
    )  # fmt: skip
    return out


@triton.jit
def _bit(token):
    """(word offset, int32 mask) of a token's bit in a packed bitmap row (ops.bitmap)."""
    return token >> 5, tl.full(token.shape, 1, tl.int32) << (token & 31).to(tl.int32)


@triton.jit
def _window_refresh_kernel(
    ring, latest, length, members, in_set, slots, free_list,
    enter_tokens, enter, leave_tokens, leave, enter_list, leave_list, list_lengths,
    w_max, w_cap, ring_stride, words_stride, BLOCK: tl.constexpr,
):  # fmt: skip
    """One program per slot: WindowState.refresh_reference in four passes over the slot's
    W_cap ring cells and table entries, with barriers between:
    1. window tokens (flagged cells in the window): clear their bits, and those whose bit
       was clear enter;
    2. members whose bit is still set left: free their entries;
    3. the free entries, in order;
    4. set the bits of every window token; the k-th entering one takes free entry k.
    Besides the masks, it writes the leaving and entering tokens compacted, in mask order
    (``leave_list[b, :n_leave]``, ``enter_list[b, :n_enter]``, ``list_lengths[b] =
    (n_enter, n_leave)``): the union kernel then visits only tokens that changed.
    ``w_max`` holds one per slot. Bits of one word are changed by atomics: distinct
    tokens of a row can share a word."""
    b = tl.program_id(0)
    slot = tl.load(slots + b)
    end = tl.load(length + slot)
    start = tl.maximum(end - tl.load(w_max + b), 0)
    state = slot * ring_stride  # ring, latest and members share the [S, W_cap + 1] layout
    bits = in_set + slot * words_stride
    out = b * w_cap
    # 1. Window tokens: clear members' bits; the others enter.
    for first in range(0, w_cap, BLOCK):
        c = first + tl.arange(0, BLOCK)
        inside = c < w_cap
        back = ((end - 1 - c) % w_cap + w_cap) % w_cap  # floor modulo, as in torch
        position = end - 1 - back
        token = tl.load(ring + state + c, mask=inside, other=0).to(tl.int64)
        flagged = tl.load(latest + state + c, mask=inside, other=0) != 0
        in_window = inside & flagged & (position >= start)
        word, bit = _bit(token)
        old = tl.atomic_and(bits + word, ~bit, mask=in_window)
        new = in_window & ((old & bit) == 0)
        tl.store(enter_tokens + out + c, token, mask=inside)
        tl.store(enter + out + c, new.to(tl.int8), mask=inside)
    tl.debug_barrier()
    # 2. Leave: members whose bit is still set are not in the window.
    left = 0
    for first in range(0, w_cap, BLOCK):
        j = first + tl.arange(0, BLOCK)
        inside = j < w_cap
        token = tl.load(members + state + j, mask=inside, other=-1).to(tl.int64)
        held = token >= 0
        safe = tl.where(held, token, 0)
        word, bit = _bit(safe)
        # Clearing every member's bit is a no-op for those of the window (already clear);
        # the old word tells which were still set. Atomics only: no cached word is read.
        old = tl.atomic_and(bits + word, ~bit, mask=held)
        gone = held & ((old & bit) != 0)
        tl.store(leave_tokens + out + j, safe, mask=inside)
        tl.store(leave + out + j, gone.to(tl.int8), mask=inside)
        tl.store(members + state + j, tl.full([BLOCK], -1, tl.int32), mask=gone)
        gone_rank = left + tl.cumsum(gone.to(tl.int32), 0) - 1
        tl.store(leave_list + out + gone_rank, safe, mask=gone)
        left += tl.sum(gone.to(tl.int32), 0)
    tl.debug_barrier()
    # 3. The free table entries, in order.
    free_seen = 0
    for first in range(0, w_cap, BLOCK):
        j = first + tl.arange(0, BLOCK)
        inside = j < w_cap
        free = inside & (tl.load(members + state + j, mask=inside, other=0) < 0)
        rank = free_seen + tl.cumsum(free.to(tl.int32), 0) - 1
        tl.store(free_list + out + rank, j.to(tl.int64), mask=free)
        free_seen += tl.sum(free.to(tl.int32), 0)
    tl.debug_barrier()
    # 4. The new sets' bits; entering tokens take the free entries in order.
    entered = 0
    for first in range(0, w_cap, BLOCK):
        c = first + tl.arange(0, BLOCK)
        inside = c < w_cap
        back = ((end - 1 - c) % w_cap + w_cap) % w_cap
        position = end - 1 - back
        token = tl.load(ring + state + c, mask=inside, other=0).to(tl.int64)
        flagged = tl.load(latest + state + c, mask=inside, other=0) != 0
        in_window = inside & flagged & (position >= start)
        word, bit = _bit(token)
        tl.atomic_or(bits + word, bit, mask=in_window)
        new = tl.load(enter + out + c, mask=inside, other=0) != 0
        rank = entered + tl.cumsum(new.to(tl.int32), 0) - 1
        entry = tl.load(free_list + out + rank, mask=new, other=0)
        tl.store(members + state + entry, token.to(tl.int32), mask=new)
        tl.store(enter_list + out + rank, token, mask=new)
        entered += tl.sum(new.to(tl.int32), 0)
    tl.store(list_lengths + 2 * b, entered)
    tl.store(list_lengths + 2 * b + 1, left)


def window_refresh(
    ring: Tensor, latest: Tensor, length: Tensor, members: Tensor, in_set: Tensor,
    slots: Tensor, w_max: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor, tuple[Tensor, Tensor, Tensor]]:  # fmt: skip
    """WindowState.refresh in one launch: updates ``members``/``in_set`` of ``slots`` and
    returns the diff (enter_tokens, enter, leave_tokens, leave), each [B, W_cap], and the
    same changes compacted: (enter_list, leave_list [B, W_cap], lengths [B, 2] int32)."""
    assert ring.is_contiguous() and members.is_contiguous() and in_set.is_contiguous()
    assert in_set.dtype == torch.int32 and members.dtype == ring.dtype == torch.int32
    assert w_max.shape == slots.shape and w_max.dtype == torch.int64 and w_max.is_contiguous()
    batch, w_cap = len(slots), ring.shape[1] - 1
    device = ring.device
    enter_tokens = torch.empty(batch, w_cap, dtype=torch.int64, device=device)
    leave_tokens = torch.empty(batch, w_cap, dtype=torch.int64, device=device)
    enter = torch.empty(batch, w_cap, dtype=torch.int8, device=device)
    leave = torch.empty(batch, w_cap, dtype=torch.int8, device=device)
    free_list = torch.empty(batch, w_cap, dtype=torch.int64, device=device)
    enter_list = torch.empty(batch, w_cap, dtype=torch.int64, device=device)
    leave_list = torch.empty(batch, w_cap, dtype=torch.int64, device=device)
    lengths = torch.zeros(batch, 2, dtype=torch.int32, device=device)
    if batch:
        _window_refresh_kernel[(batch,)](
            ring, latest.view(torch.int8), length, members, in_set, slots.contiguous(),
            free_list, enter_tokens, enter, leave_tokens, leave, enter_list, leave_list, lengths,
            w_max, w_cap, ring.shape[1], in_set.shape[1],
            BLOCK=min(1024, triton.next_power_of_2(max(w_cap, 16))),
        )  # fmt: skip
    compact = (enter_list, leave_list, lengths)
    return enter_tokens, enter.bool(), leave_tokens, leave.bool(), compact


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
        word, bit = _bit(tl.where(held, token, 0))
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


@triton.jit
def _changed_tokens(
    enter_list, leave_list, list_start, list_end, p, batch, w_cap, LISTS: tl.constexpr
):
    """Entry p of the changed-token list: every slot's entering tokens (slot order, then
    mask order), then every slot's leaving tokens. Lists q < batch are slot q's enters,
    the others slot q - batch's leaves. Returns (token, +1/-1, valid)."""
    valid = p < tl.max(list_end, axis=0)
    q = tl.sum((p[:, None] >= list_end[None, :]).to(tl.int32), axis=1)
    at_q = tl.arange(0, LISTS)[None, :] == q[:, None]
    start = tl.sum(tl.where(at_q, list_start[None, :], 0), axis=1)
    rank = p - start
    entering = q < batch
    slot = tl.where(entering, q, q - batch)
    at = slot.to(tl.int64) * w_cap + rank
    enter_token = tl.load(enter_list + at, mask=valid & entering, other=0)
    leave_token = tl.load(leave_list + at, mask=valid & ~entering, other=0)
    return tl.where(entering, enter_token, leave_token), tl.where(entering, 1, -1), valid


@triton.jit
def _union_apply_kernel(
    enter_list, leave_list, list_lengths, batch, w_cap,
    ref, owner, row_of, ids, row_token_ids, count, dropped, overflows,
    kind, gone_row, destinations, copy_dst, copy_src, copies, capacity,
    LISTS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """UnionHead.apply_reference's bookkeeping in one program, over the changed tokens
    only (the compact lists of the window refresh). Passes, with barriers between:
    0. reference counts (+1 enter, -1 leave) and the first entry of each token;
    1. per first entry: gone (its count fell to 0, it had a row: free the row) or new
       (its count rose from 0 and it has no row);
    2. destinations in order: holes below the new count, then rows [old, new count);
    3. the k-th new token takes destination k, or is refused when none is left;
    4. live rows stranded in [new count, old count) take the next destinations.
    Row copies are listed in ``copy_dst/copy_src`` (new: weight rows, then moves: buffer
    rows); ``copies`` = (new, moved) for the copy kernel."""
    BIG: tl.constexpr = 2**62
    dump_row = capacity
    q = tl.arange(0, LISTS)
    # list_lengths is [enter, leave] per slot; reorder to (all enters, all leaves): list q < batch is slot q's enters.
    lengths = tl.load(
        list_lengths + tl.where(q < batch, 2 * q, 2 * (q - batch) + 1), mask=q < 2 * batch, other=0
    )
    list_end = tl.cumsum(lengths, 0)
    list_start = list_end - lengths
    total = tl.max(list_end, axis=0)
    # 0. Counts, and the first entry of each token (lowest list position).
    for first in range(0, total, BLOCK):
        p = first + tl.arange(0, BLOCK)
        token, delta, valid = _changed_tokens(
            enter_list, leave_list, list_start, list_end, p, batch, w_cap, LISTS
        )
        tl.atomic_add(ref + token, delta.to(tl.int32), mask=valid)
        tl.atomic_min(owner + token, p.to(tl.int64), mask=valid)
    tl.debug_barrier()
    # 1. Gone and new tokens; free the rows of gone ones.
    n_gone = 0
    n_new = 0
    for first in range(0, total, BLOCK):
        p = first + tl.arange(0, BLOCK)
        token, delta, valid = _changed_tokens(
            enter_list, leave_list, list_start, list_end, p, batch, w_cap, LISTS
        )
        is_first = valid & (tl.load(owner + token, mask=valid, other=-1) == p)
        after = tl.load(ref + token, mask=is_first, other=0)
        row = tl.load(row_of + token, mask=is_first, other=-1)
        gone = is_first & (row >= 0) & (after == 0)
        new = is_first & (row < 0) & (after > 0)
        tl.store(kind + p, tl.where(gone, 1, tl.where(new, 2, 0)).to(tl.int8), mask=valid)
        tl.store(gone_row + p, row, mask=valid)
        tl.store(owner + token, tl.full([BLOCK], BIG, tl.int64), mask=is_first)
        tl.store(ids + row, tl.full([BLOCK], -1, tl.int64), mask=gone)
        tl.store(row_token_ids + row, tl.zeros([BLOCK], tl.int64), mask=gone)
        tl.store(row_of + token, tl.full([BLOCK], -1, tl.int64), mask=gone)
        n_gone += tl.sum(gone.to(tl.int32), 0)
        n_new += tl.sum(new.to(tl.int32), 0)
    tl.debug_barrier()
    old_count = tl.load(count)
    new_count = tl.minimum(old_count - n_gone + n_new, capacity)
    # 2. Destinations: holes below the new count (list order), then growth rows.
    holes = 0
    for first in range(0, total, BLOCK):
        p = first + tl.arange(0, BLOCK)
        valid = p < total
        row = tl.load(gone_row + p, mask=valid, other=0)
        hole = valid & (tl.load(kind + p, mask=valid, other=0) == 1) & (row < new_count)
        rank = holes + tl.cumsum(hole.to(tl.int32), 0) - 1
        tl.store(destinations + rank, row, mask=hole)
        holes += tl.sum(hole.to(tl.int32), 0)
    grow = tl.maximum(new_count - old_count, 0)
    for first in range(0, grow, BLOCK):
        s = first + tl.arange(0, BLOCK)
        tl.store(destinations + holes + s, old_count + s, mask=s < grow)
    available = holes + grow
    tl.debug_barrier()
    # 3. New tokens take destinations in order; past the capacity they are refused.
    seen = 0
    admitted_total = 0
    for first in range(0, total, BLOCK):
        p = first + tl.arange(0, BLOCK)
        token, delta, valid = _changed_tokens(
            enter_list, leave_list, list_start, list_end, p, batch, w_cap, LISTS
        )
        new = valid & (tl.load(kind + p, mask=valid, other=0) == 2)
        rank = seen + tl.cumsum(new.to(tl.int32), 0) - 1
        admitted = new & (rank < available)
        row = tl.load(destinations + rank, mask=admitted, other=dump_row)
        tl.store(ids + row, token, mask=admitted)
        tl.store(row_token_ids + row, token, mask=admitted)
        tl.store(row_of + token, row, mask=admitted)
        tl.store(copy_dst + rank, row, mask=admitted)
        tl.store(copy_src + rank, token, mask=admitted)
        seen += tl.sum(new.to(tl.int32), 0)
        admitted_total += tl.sum(admitted.to(tl.int32), 0)
    tl.debug_barrier()
    # 4. Live rows in [new count, old count) move down into the remaining holes.
    moved = 0
    for first in range(new_count, old_count, BLOCK):
        r = first + tl.arange(0, BLOCK)
        in_range = r < old_count
        token = tl.load(ids + r, mask=in_range, other=-1)
        live = in_range & (token >= 0)
        rank = moved + tl.cumsum(live.to(tl.int32), 0) - 1
        row = tl.load(destinations + seen + rank, mask=live, other=dump_row)
        tl.store(ids + row, token, mask=live)
        tl.store(row_token_ids + row, token, mask=live)
        tl.store(row_of + token, row, mask=live)
        tl.store(ids + r, tl.full([BLOCK], -1, tl.int64), mask=live)
        tl.store(row_token_ids + r, tl.zeros([BLOCK], tl.int64), mask=live)
        tl.store(copy_dst + admitted_total + rank, row, mask=live)
        tl.store(copy_src + admitted_total + rank, r.to(tl.int64), mask=live)
        moved += tl.sum(live.to(tl.int32), 0)
    refused = seen - admitted_total
    tl.store(count, new_count)
    tl.store(dropped, tl.load(dropped) + refused.to(tl.int64))
    tl.store(overflows, tl.load(overflows) + (refused > 0).to(tl.int64))
    tl.store(copies, admitted_total)
    tl.store(copies + 1, moved)


@triton.jit
def _copy_listed_rows_kernel(
    buf, weight, copy_dst, copy_src, copies, hidden, buf_stride, weight_stride,
    PROGRAMS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """The union kernel's row copies: entries [0, new) from the weight, then [new, new +
    moved) within the buffer (sources >= new count > every destination: no overlap).
    A fixed grid strides over the device-side number of copies."""
    n_new = tl.load(copies)
    n_all = n_new + tl.load(copies + 1)
    for i in range(tl.program_id(0), n_all, PROGRAMS):
        dst_row = tl.load(copy_dst + i)
        src_row = tl.load(copy_src + i)
        for start in range(0, hidden, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < hidden
            if i < n_new:
                values = tl.load(weight + src_row * weight_stride + cols, mask=mask)
            else:
                values = tl.load(buf + src_row * buf_stride + cols, mask=mask)
            tl.store(buf + dst_row * buf_stride + cols, values, mask=mask)


def union_apply(
    enter_list: Tensor, leave_list: Tensor, list_lengths: Tensor,
    ref: Tensor, owner: Tensor, row_of: Tensor, ids: Tensor, row_token_ids: Tensor,
    count: Tensor, dropped: Tensor, overflows: Tensor, buf: Tensor, weight: Tensor,
) -> None:  # fmt: skip
    """UnionHead.apply_reference over the compact diff of ``window_refresh``: bookkeeping
    in one single-program launch (it touches only changed tokens), row copies in a second.
    Keeps ``row_token_ids`` (= ids clamped at 0) up to date as well. Graph-capturable."""
    batch, w_cap = enter_list.shape
    capacity, device = buf.shape[0] - 1, buf.device
    entries = 2 * batch * w_cap
    kind = torch.empty(max(entries, 1), dtype=torch.int8, device=device)
    gone_row = torch.empty(max(entries, 1), dtype=torch.int64, device=device)
    destinations = torch.empty(entries + 1, dtype=torch.int64, device=device)
    copy_dst = torch.empty(entries + capacity + 1, dtype=torch.int64, device=device)
    copy_src = torch.empty_like(copy_dst)
    copies = torch.zeros(2, dtype=torch.int32, device=device)
    if batch == 0:
        return
    lists = triton.next_power_of_2(2 * batch)
    _union_apply_kernel[(1,)](
        enter_list, leave_list, list_lengths, batch, w_cap,
        ref, owner, row_of, ids, row_token_ids, count, dropped, overflows,
        kind, gone_row, destinations, copy_dst, copy_src, copies, capacity,
        LISTS=lists, BLOCK=max(16, min(256, 16384 // lists)),
    )  # fmt: skip
    programs = 128
    _copy_listed_rows_kernel[(programs,)](
        buf, weight, copy_dst, copy_src, copies, buf.shape[1], buf.stride(0), weight.stride(0),
        PROGRAMS=programs, BLOCK=min(1024, triton.next_power_of_2(buf.shape[1])),
    )  # fmt: skip
