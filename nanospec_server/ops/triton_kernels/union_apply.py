"""``union_apply``: UnionHead.apply's bookkeeping and row copies. Semantics: ``ops/reference.py``."""

import torch
import triton
import triton.language as tl
from torch import Tensor


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
