"""Plain-PyTorch sgl_kernel stand-ins vs independent references on seeded random inputs.

Attention is checked against ``torch.nn.functional.scaled_dot_product_attention`` (and a
hand-written softmax where SDPA cannot express the op: logit cap, sinks); tree and
cache-location ops against pure-Python loops over lists.
"""

from __future__ import annotations

import math
import random

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from nanospec_server.sgl_kernel_cpu import ops as cpu_ops
from nanospec_server.sgl_kernel_cpu import shim as cpu_shim

SEEDS = range(6)


def _may_register() -> bool:
    """Defining sgl_kernel ops in this process would break a later import of a real
    sgl_kernel (duplicate schemas), so only do it where the shim itself would be used."""
    return not torch.cuda.is_available() and not cpu_shim.real_sgl_kernel_loads()


def _verify_tree_greedy():
    if _may_register():
        cpu_ops.register_ops()
        return torch.ops.sgl_kernel.verify_tree_greedy_cpu
    return cpu_ops.verify_tree_greedy


# ----------------------------------------------------------------------------- helpers


def _paged_cache(rng: torch.Generator, num_slots: int, hkv: int, d: int, dv: int):
    k = torch.randn(num_slots, hkv, d, generator=rng)
    v = torch.randn(num_slots, hkv, dv, generator=rng)
    return k, v


def _req_table(rng: random.Random, seq_lens: list[int], pool_len: int, num_slots: int):
    """A req_to_token table whose used cells hold distinct random slots (slot 0 unused)."""
    num_reqs = len(seq_lens) + 2
    table = torch.zeros(num_reqs, pool_len, dtype=torch.int32)
    slots = list(range(1, num_slots))
    rng.shuffle(slots)
    req_ids = rng.sample(range(num_reqs), len(seq_lens))
    for req, n in zip(req_ids, seq_lens, strict=True):
        table[req, :n] = torch.tensor(slots[:n], dtype=torch.int32)
        slots = slots[n:]
    return table, torch.tensor(req_ids, dtype=torch.int64)


def _sdpa(q, k, v, visible, scale):
    """q [nq,H,D], k/v [nk,Hkv,*], visible [nq,nk] bool -> [nq,H,Dv] via SDPA."""
    group = q.shape[1] // k.shape[1]
    qh = q.permute(1, 0, 2).unsqueeze(0)
    kh = k.repeat_interleave(group, dim=1).permute(1, 0, 2).unsqueeze(0)
    vh = v.repeat_interleave(group, dim=1).permute(1, 0, 2).unsqueeze(0)
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=visible, scale=scale)
    return out.squeeze(0).permute(1, 0, 2)


def _loop_softmax_attention(q, k, v, visible, scale, cap, sinks):
    """Scalar-ish reference: per head and query, explicit capped scores and softmax."""
    nq, h, _ = q.shape
    group = h // k.shape[1]
    out = torch.zeros(nq, h, v.shape[2], dtype=torch.float64)
    for qi in range(nq):
        for hi in range(h):
            kv_h = hi // group
            logits, values = [], []
            for ki in range(k.shape[0]):
                if not visible[qi, ki]:
                    continue
                s = float(torch.dot(q[qi, hi].double(), k[ki, kv_h].double())) * scale
                if cap > 0:
                    s = cap * math.tanh(s / cap)
                logits.append(s)
                values.append(v[ki, kv_h].double())
            top = max(logits + ([float(sinks[hi])] if sinks is not None else []))
            weights = [math.exp(s - top) for s in logits]
            denom = sum(weights) + (math.exp(float(sinks[hi]) - top) if sinks is not None else 0.0)
            for w, val in zip(weights, values, strict=True):
                out[qi, hi] += w / denom * val
    return out.float()


# ----------------------------------------------------------------------------- attention


@pytest.mark.parametrize("seed", SEEDS)
def test_decode_attention_matches_sdpa(seed: int) -> None:
    rng = torch.Generator().manual_seed(seed)
    prng = random.Random(seed)
    h, hkv = prng.choice([(4, 4), (4, 2), (8, 1)])
    d, dv = prng.choice([(16, 16), (8, 8)])
    bs = prng.randint(1, 4)
    seq_lens = [prng.randint(1, 20) for _ in range(bs)]
    window = prng.choice([0, 0, 3, 7])
    num_slots, pool_len = 128, 32
    k_cache, v_cache = _paged_cache(rng, num_slots, hkv, d, dv)
    table, reqs = _req_table(prng, seq_lens, pool_len, num_slots)
    q = torch.randn(bs, h, d, generator=rng)
    new_k = torch.randn(bs, hkv, d, generator=rng)
    new_v = torch.randn(bs, hkv, dv, generator=rng)
    loc = torch.stack(
        [table[r, n - 1].long() for r, n in zip(reqs.tolist(), seq_lens, strict=True)]
    )
    expect_k, expect_v = k_cache.clone(), v_cache.clone()
    expect_k[loc], expect_v[loc] = new_k, new_v

    out = torch.empty(bs, h, dv)
    scale = 1.0 / math.sqrt(d)
    cpu_ops.decode_attention(
        q, k_cache, v_cache, 1.0, 1.0, out, new_k, new_v, loc,
        torch.empty(bs, h, 8, dv + 1), table, reqs, torch.tensor(seq_lens), scale, 0.0,
        False, window, None, None,
    )  # fmt: skip
    assert torch.equal(k_cache, expect_k) and torch.equal(v_cache, expect_v)
    for i, (req, n) in enumerate(zip(reqs.tolist(), seq_lens, strict=True)):
        slots = table[req, :n].long()
        visible = torch.ones(1, n, dtype=torch.bool)
        if window > 0:
            visible[0, : max(0, n - window)] = False
        ref = _sdpa(q[i : i + 1], expect_k[slots], expect_v[slots], visible, scale)
        torch.testing.assert_close(out[i : i + 1], ref, atol=1e-5, rtol=1e-5)


def test_decode_attention_logit_cap_sinks_and_fp8_scale() -> None:
    rng = torch.Generator().manual_seed(11)
    prng = random.Random(11)
    h, hkv, d = 4, 2, 8
    seq_lens = [5, 9]
    k_cache, v_cache = _paged_cache(rng, 64, hkv, d, d)
    table, reqs = _req_table(prng, seq_lens, 16, 64)
    q = torch.randn(2, h, d, generator=rng) * 3
    sinks = torch.randn(h, generator=rng)
    out = torch.empty(2, h, d)
    cpu_ops.decode_attention(
        q, k_cache, v_cache, 0.5, 2.0, out, None, None, None, torch.empty(0), table, reqs,
        torch.tensor(seq_lens), 0.4, 2.5, False, 0, None, sinks,
    )  # fmt: skip
    for i, (req, n) in enumerate(zip(reqs.tolist(), seq_lens, strict=True)):
        slots = table[req, :n].long()
        ref = _loop_softmax_attention(
            q[i : i + 1], k_cache[slots] * 0.5, v_cache[slots] * 2.0,
            torch.ones(1, n, dtype=torch.bool), 0.4, 2.5, sinks,
        )  # fmt: skip
        torch.testing.assert_close(out[i : i + 1], ref, atol=1e-5, rtol=1e-5)


def _extend_case(seed: int, with_tree: bool):
    rng = torch.Generator().manual_seed(100 + seed)
    prng = random.Random(100 + seed)
    h, hkv = prng.choice([(4, 4), (4, 2), (6, 1)])
    d = prng.choice([8, 16])
    bs = prng.randint(1, 3)
    ext = [prng.randint(1, 6) for _ in range(bs)]
    if with_tree:
        ext = [4] * bs
    prefix = [prng.randint(0, 10) for _ in range(bs)]
    seq_lens = [p + e for p, e in zip(prefix, ext, strict=True)]
    k_cache, v_cache = _paged_cache(rng, 128, hkv, d, d)
    table, reqs = _req_table(prng, seq_lens, 24, 128)
    total = sum(ext)
    q = torch.randn(total, h, d, generator=rng)
    k_ext = torch.randn(total, hkv, d, generator=rng)
    v_ext = torch.randn(total, hkv, d, generator=rng)
    starts = [sum(ext[:i]) for i in range(bs)]
    return h, d, ext, prefix, seq_lens, k_cache, v_cache, table, reqs, q, k_ext, v_ext, starts


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("causal", [True, False])
def test_extend_attention_matches_sdpa(seed: int, causal: bool) -> None:
    h, d, ext, prefix, seq_lens, k_cache, v_cache, table, reqs, q, k_ext, v_ext, starts = (
        _extend_case(seed, with_tree=False)
    )
    window = random.Random(seed).choice([0, 2, 5]) if causal else 0
    out = torch.empty_like(q)
    scale = 0.3
    cpu_ops.extend_attention(
        q, k_ext, v_ext, out, k_cache, v_cache, 1.0, 1.0, table, reqs, torch.tensor(seq_lens),
        torch.tensor(ext, dtype=torch.int32), torch.tensor(starts, dtype=torch.int32), max(ext),
        scale, 0.0, False, window, None, None, None, causal,
    )  # fmt: skip
    for i, req in enumerate(reqs.tolist()):
        p, e, s = prefix[i], ext[i], starts[i]
        pre = table[req, :p].long()
        k = torch.cat([k_cache[pre], k_ext[s : s + e]])
        v = torch.cat([v_cache[pre], v_ext[s : s + e]])
        q_pos = torch.arange(p, p + e).view(-1, 1)
        k_pos = torch.arange(p + e).view(1, -1)
        visible = k_pos <= q_pos if causal else torch.ones(e, p + e, dtype=torch.bool)
        if window > 0:
            visible &= q_pos - k_pos < window
        ref = _sdpa(q[s : s + e], k, v, visible, scale)
        torch.testing.assert_close(out[s : s + e], ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seed", SEEDS[:3])
def test_extend_attention_tree_mask_and_cached_kv(seed: int) -> None:
    """Verify-style call: QLEN_ONLY tree mask, new K/V read from the cache (k_extend None)."""
    h, d, ext, prefix, seq_lens, k_cache, v_cache, table, reqs, q, _, _, starts = _extend_case(
        seed, with_tree=True
    )
    # Tree 0 -> {1, 2}, 1 -> {3}: row = query, col = visible draft token.
    block = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    bs = len(ext)
    tree_mask = torch.cat([block.flatten()] * bs + [torch.ones(16, dtype=torch.bool)])
    out = torch.empty_like(q)
    cpu_ops.extend_attention(
        q, None, None, out, k_cache, v_cache, 1.0, 1.0, table, reqs, torch.tensor(seq_lens),
        torch.tensor(ext), torch.tensor(starts), 4, 0.25, 3.0, False, 0, None, None,
        tree_mask, True,
    )  # fmt: skip
    for i, req in enumerate(reqs.tolist()):
        slots = table[req, : seq_lens[i]].long()
        visible = torch.cat([torch.ones(4, prefix[i], dtype=torch.bool), block], dim=1)
        ref = _loop_softmax_attention(
            q[starts[i] : starts[i] + 4], k_cache[slots], v_cache[slots], visible, 0.25, 3.0, None
        )
        torch.testing.assert_close(out[starts[i] : starts[i] + 4], ref, atol=1e-5, rtol=1e-5)


def _decode_row(q_row, k_cache, v_cache, slots: torch.Tensor, window: int) -> torch.Tensor:
    """A one-token decode of ``q_row`` [1, H, D] over the cache ``slots``, keys in order."""
    table = slots.to(torch.int32).view(1, -1)
    out = torch.empty_like(q_row)
    cpu_ops.decode_attention(
        q_row, k_cache, v_cache, 1.0, 1.0, out, None, None, None, torch.empty(0), table,
        torch.zeros(1, dtype=torch.int64), torch.tensor([slots.numel()]), 0.3, 0.0, False,
        window, None, None,
    )  # fmt: skip
    return out


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("with_tree", [False, True])
def test_every_extend_row_is_bitwise_a_decode(seed: int, with_tree: bool) -> None:
    """What makes speculative greedy output bit-identical to plain decoding: a verify row
    (tree mask) or a prefill row computes exactly what decoding that position computes."""
    h, d, ext, prefix, seq_lens, k_cache, v_cache, table, reqs, q, k_ext, v_ext, starts = (
        _extend_case(seed, with_tree)
    )
    window = 0 if with_tree else random.Random(seed).choice([0, 3])
    # SGLang stores the new K/V into the cache before it calls extend attention.
    for i, req in enumerate(reqs.tolist()):
        new_slots = table[req, prefix[i] : seq_lens[i]].long()
        k_cache[new_slots] = k_ext[starts[i] : starts[i] + ext[i]]
        v_cache[new_slots] = v_ext[starts[i] : starts[i] + ext[i]]
    block = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    tree_mask = torch.cat([block.flatten()] * len(ext)) if with_tree else None
    out = torch.empty_like(q)
    cpu_ops.extend_attention(
        q, k_ext, v_ext, out, k_cache, v_cache, 1.0, 1.0, table, reqs, torch.tensor(seq_lens),
        torch.tensor(ext), torch.tensor(starts), max(ext), 0.3, 0.0, False, window, None,
        None, tree_mask, True,
    )  # fmt: skip
    for i, req in enumerate(reqs.tolist()):
        row = table[req].long()
        for j in range(ext[i]):
            seen = block[j].nonzero().squeeze(1) if with_tree else torch.arange(j + 1)
            slots = torch.cat([row[: prefix[i]], row[prefix[i] + seen]])
            q_row = q[starts[i] + j : starts[i] + j + 1]
            decoded = _decode_row(q_row, k_cache, v_cache, slots, window)
            assert torch.equal(out[starts[i] + j], decoded[0])


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("with_tree", [True, False])
@pytest.mark.parametrize("window", [0, 4])
def test_one_token_extend_is_bitwise_a_decode(seed: int, with_tree: bool, window: int) -> None:
    """Depth 0 of adaptive speculation: a verify of one token per request under a tree
    mask (its 1x1 blocks), or a one-token prefill, computes exactly what a decode step
    computes, a sliding window included."""
    gen = torch.Generator().manual_seed(seed)
    prng = random.Random(seed)
    heads, kv_heads, dim, slots_total = 4, 2, 8, 96
    seq_lens = [prng.randint(1, 20) for _ in range(prng.randint(1, 5))]
    k_cache = torch.randn(slots_total, kv_heads, dim, generator=gen)
    v_cache = torch.randn(slots_total, kv_heads, dim, generator=gen)
    table = torch.stack([torch.randperm(slots_total, generator=gen)[:24] for _ in seq_lens])
    reqs = torch.arange(len(seq_lens))
    q = torch.randn(len(seq_lens), heads, dim, generator=gen)
    new = table[reqs, torch.tensor(seq_lens) - 1].long()  # the verified token's slot
    k_ext, v_ext = k_cache[new].clone(), v_cache[new].clone()
    ones = torch.ones(len(seq_lens), dtype=torch.int64)
    verified = torch.empty_like(q)
    cpu_ops.extend_attention(
        q, k_ext, v_ext, verified, k_cache, v_cache, 1.0, 1.0, table, reqs,
        torch.tensor(seq_lens), ones, torch.arange(len(seq_lens)), 1, 0.3, 0.0, False, window,
        None, None, torch.ones(len(seq_lens), dtype=torch.bool) if with_tree else None, True,
    )  # fmt: skip
    decoded = torch.empty_like(q)
    cpu_ops.decode_attention(
        q, k_cache, v_cache, 1.0, 1.0, decoded, None, None, None, torch.empty(0), table, reqs,
        torch.tensor(seq_lens), 0.3, 0.0, False, window, None, None,
    )  # fmt: skip
    assert torch.equal(verified, decoded)


# ----------------------------------------------------------------------------- cache locations


@pytest.mark.parametrize("seed", SEEDS)
def test_assign_req_to_token_pool_and_extend_cache_locs(seed: int) -> None:
    prng = random.Random(seed)
    num_reqs, pool_len = 6, 40
    bs = prng.randint(1, 5)
    reqs = prng.sample(range(num_reqs), bs)
    starts = [prng.randint(0, 20) for _ in range(bs)]
    ends = [s + prng.randint(0, 15) for s in starts]
    total = sum(e - s for s, e in zip(starts, ends, strict=True))
    locs = [prng.randint(1, 999) for _ in range(total)]
    table = torch.full((num_reqs, pool_len), -7, dtype=torch.int32)

    expect = [[-7] * pool_len for _ in range(num_reqs)]
    k = 0
    for r, s, e in zip(reqs, starts, ends, strict=True):
        for pos in range(s, e):
            expect[r][pos] = locs[k]
            k += 1
    args = (torch.tensor(reqs), table, torch.tensor(starts), torch.tensor(ends))
    cpu_ops.assign_req_to_token_pool(*args, torch.tensor(locs, dtype=torch.int64), pool_len)
    assert table.tolist() == expect

    out = torch.full((total,), -1, dtype=torch.int64)
    cpu_ops.assign_extend_cache_locs(*args, out, pool_len)
    assert out.tolist() == locs


@pytest.mark.parametrize("seed", SEEDS)
def test_assign_draft_cache_locs_and_draft_decode_metadata(seed: int) -> None:
    prng = random.Random(seed)
    topk, steps = prng.choice([(1, 3), (2, 3), (3, 2)])
    num_reqs, pool_len, bs = 5, 30, prng.randint(1, 4)
    reqs = prng.sample(range(num_reqs), bs)
    seq_lens = [prng.randint(1, 12) for _ in range(bs)]
    rows = [[prng.randint(0, 500) for _ in range(pool_len)] for _ in range(num_reqs)]
    table = torch.tensor(rows, dtype=torch.int32)

    out = torch.zeros(bs * topk * steps, dtype=torch.int64)
    cpu_ops.assign_draft_cache_locs_contiguous(
        torch.tensor(reqs), table, torch.tensor(seq_lens), out, pool_len, topk, steps
    )
    expect = []
    for r, n in zip(reqs, seq_lens, strict=True):
        expect += rows[r][n : n + topk * steps]
    assert out.tolist() == expect

    meta = cpu_ops.build_draft_decode_metadata(
        table, torch.tensor(reqs), torch.tensor(seq_lens), topk, steps, pool_len
    )
    assert meta.shape == (bs * topk, pool_len) and meta.dtype == table.dtype
    draft = out.view(bs, topk, steps).tolist()
    for i, (r, n) in enumerate(zip(reqs, seq_lens, strict=True)):
        for b in range(topk):
            want = rows[r][:n] + draft[i][b] + [0] * (pool_len - n - steps)
            assert meta[i * topk + b].tolist() == want


def test_copy_all_layer_kv_cache_overlapping() -> None:
    gen = torch.Generator().manual_seed(3)
    bufs = [torch.randn(20, 2, 4, generator=gen), torch.randint(0, 9, (20, 3), dtype=torch.int8)]
    src, tgt = [1, 2, 3, 7], [2, 3, 4, 0]  # overlapping chain: reads must precede writes
    check_kv_moves(bufs, src, tgt)


def check_kv_moves(bufs: list[torch.Tensor], src: list[int], tgt: list[int]) -> None:
    """The kernel's moves of rows src -> tgt in every buffer equal the plain
    read-all-then-write-all reference's."""
    before = [b.clone() for b in bufs]
    ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.uint64)
    strides = torch.tensor([b.stride(0) * b.element_size() for b in bufs])
    cpu_ops.copy_all_layer_kv_cache(ptrs, strides, torch.tensor(tgt), torch.tensor(src))
    for b, old in zip(bufs, before, strict=True):
        want = old.clone()
        for s, t in zip(src, tgt, strict=True):
            want[t] = old[s]
        assert torch.equal(b, want)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 12), st.floats(0.0, 1.0))
def test_copy_all_layer_kv_cache_with_rows_in_place(seed: int, n: int, in_place: float) -> None:
    """Moves of a row onto itself (skipped) mixed with real moves, distinct targets: the
    result is the plain read-all-then-write-all reference's."""
    gen = torch.Generator().manual_seed(seed)
    prng = random.Random(seed)
    bufs = [torch.randn(32, 3, generator=gen), torch.randint(0, 9, (32, 5), dtype=torch.int8)]
    tgt = prng.sample(range(32), n)
    src = [t if prng.random() < in_place else prng.randrange(32) for t in tgt]
    check_kv_moves(bufs, src, tgt)


# ----------------------------------------------------------------------------- spec tree


def _random_eagle_draft(prng: random.Random, topk: int, steps: int, n: int):
    """parent_list / selected_index rows as EAGLE's multi-step top-k draft produces them.

    Candidate numbering: step 0 has ``topk`` candidates; step s >= 1 has ``topk * topk``
    (beam j, child m -> topk + (s-1)*topk^2 + j*topk + m). parent_list = [-1] followed by
    each later step's chosen beams. Scores multiply down the tree so the top n-1 set
    is closed under parents.
    """
    score = {c: prng.random() for c in range(topk)}
    beams = sorted(score, key=score.get, reverse=True)[:topk]
    parent_list = [-1]
    for s in range(1, steps):
        parent_list += beams
        base = topk + (s - 1) * topk * topk
        new = {}
        for j, beam in enumerate(beams):
            for m in range(topk):
                new[base + j * topk + m] = score[beam] * prng.uniform(0.1, 1.0)
        score.update(new)
        beams = sorted(new, key=new.get, reverse=True)[:topk]
    chosen = sorted(sorted(score, key=score.get, reverse=True)[: n - 1])
    return parent_list, chosen


def _ref_tree(parent_list, selected, topk, steps, n, seq_len, b):
    """Plain reference: parents by front-to-back search, children sorted, ancestors walked."""
    parent = [None] * n
    for node in range(1, n):
        slot = selected[node - 1] // topk
        if slot == 0:
            parent[node] = 0
            continue
        want = parent_list[slot]
        for pos in range(n - 1):
            if selected[pos] == want:
                parent[node] = pos + 1
                break
    children = [[c for c in range(1, n) if parent[c] == p] for p in range(n)]
    nxt = [ch[0] if ch else -1 for ch in children]
    sib = [-1] * n
    for ch in children:
        for a, c in zip(ch, ch[1:], strict=False):
            sib[a] = c
    mask, pos = [], []
    for x in range(n):
        row = [0] * n
        row[0] = 1
        cur, depth = x, 0
        while cur not in (0, None) and depth < steps:
            row[cur] = 1
            depth += 1
            cur = parent[cur]
        mask.append(row)
        pos.append(seq_len + depth)
    return mask, pos, [b * n + i for i in range(n)], nxt, sib


@pytest.mark.parametrize("seed", range(12))
def test_build_tree_matches_reference(seed: int) -> None:
    prng = random.Random(seed)
    topk, steps = [(1, 3), (2, 3), (4, 3), (3, 4)][seed % 4]
    n = prng.randint(2, min(topk + (steps - 1) * topk * topk, 8) + 1)
    if topk == 1:
        n = steps + 1
    bs = prng.randint(1, 3)
    drafts = [_random_eagle_draft(prng, topk, steps, n) for _ in range(bs)]
    if seed % 3 == 0 and n > 2:
        # Drop a parent from the selection: orphans must be skipped the same way.
        pl, sel = drafts[0]
        unused = [c for c in range(topk + (steps - 1) * topk * topk) if c not in sel]
        if unused:
            drafts[0] = (pl, sorted(sel[1:] + [prng.choice(unused)]))
    parent_list = torch.tensor([d[0] for d in drafts], dtype=torch.int64)
    selected = torch.tensor([d[1] for d in drafts], dtype=torch.int64)
    seq_lens = torch.tensor([prng.randint(1, 9) for _ in range(bs)], dtype=torch.int64)

    for mode in (cpu_ops.spec_tree.TREE_MASK_QLEN_ONLY, cpu_ops.spec_tree.TREE_MASK_FULL):
        full_len = int(seq_lens.sum()) * n + bs * n * n
        mask = torch.ones(bs * n * n if mode == 1 else full_len, dtype=torch.bool)
        positions = torch.empty(bs * n, dtype=torch.int64)
        retrieve = torch.full((3, bs, n), -1, dtype=torch.int64)
        cpu_ops.build_tree_kernel_efficient(
            parent_list, selected, seq_lens, mask, positions, retrieve[0], retrieve[1],
            retrieve[2], topk, steps, n, mode,
        )  # fmt: skip
        offset = 0
        for b in range(bs):
            ref_mask, ref_pos, ref_idx, ref_next, ref_sib = _ref_tree(
                drafts[b][0], drafts[b][1], topk, steps, n, int(seq_lens[b]), b
            )
            assert positions[b * n : (b + 1) * n].tolist() == ref_pos
            assert retrieve[0, b].tolist() == ref_idx
            assert retrieve[1, b].tolist() == ref_next
            assert retrieve[2, b].tolist() == ref_sib
            if mode == 1:
                got = mask[b * n * n : (b + 1) * n * n].view(n, n).int().tolist()
                assert got == ref_mask
            else:
                width = int(seq_lens[b]) + n
                rows = mask[offset : offset + n * width].view(n, width)
                offset += n * width
                assert rows[:, : int(seq_lens[b])].all()
                assert rows[:, int(seq_lens[b]) :].int().tolist() == ref_mask


def _ref_verify(cand, nxt, sib, ridx, target, max_accept):
    """Walk children in sibling order; accept the first whose token equals the target."""
    accept = [ridx[0]]
    preds = {}
    node = 0
    while len(accept) < max_accept:
        want = target[accept[-1]]
        child = nxt[node]
        matched = None
        while child != -1:
            if cand[child] == want:
                matched = child
                break
            child = sib[child]
        if matched is None:
            break
        preds[accept[-1]] = want
        accept.append(ridx[matched])
        node = matched
    preds[accept[-1]] = target[accept[-1]]
    return accept, preds


@pytest.mark.parametrize("seed", range(12))
def test_verify_tree_greedy_matches_reference(seed: int) -> None:
    prng = random.Random(seed)
    topk, steps = [(1, 3), (2, 3), (3, 2), (2, 4)][seed % 4]
    n = steps + 1 if topk == 1 else prng.randint(3, 8)
    bs = prng.randint(1, 4)
    drafts = [_random_eagle_draft(prng, topk, steps, n) for _ in range(bs)]
    retrieve = torch.full((3, bs, n), -1, dtype=torch.int64)
    cpu_ops.build_tree_kernel_efficient(
        torch.tensor([d[0] for d in drafts]), torch.tensor([d[1] for d in drafts]),
        torch.full((bs,), 5), torch.ones(bs * n * n, dtype=torch.bool),
        torch.empty(bs * n, dtype=torch.int64), retrieve[0], retrieve[1], retrieve[2],
        topk, steps, n, 1,
    )  # fmt: skip
    vocab = 4  # tiny vocabulary so that matches (acceptances) are frequent
    cand = [[prng.randrange(vocab) for _ in range(n)] for _ in range(bs)]
    target = [prng.randrange(vocab) for _ in range(bs * n)]
    max_accept = steps + 1
    predicts = torch.full((bs * n,), -5, dtype=torch.int32)
    accept_index = torch.full((bs, max_accept), -1, dtype=torch.int32)
    accept_num = torch.zeros(bs, dtype=torch.int32)
    # Through the dispatcher where allowed, with sgl_kernel's keyword names, as SGLang calls it.
    _verify_tree_greedy()(
        predicts=predicts, accept_index=accept_index, accept_token_num=accept_num,
        candidates=torch.tensor(cand), retrive_index=retrieve[0],
        retrive_next_token=retrieve[1], retrive_next_sibling=retrieve[2],
        target_predict=torch.tensor(target).view(bs, n),
    )  # fmt: skip
    want_preds = [-5] * (bs * n)
    for b in range(bs):
        accept, preds = _ref_verify(
            cand[b], retrieve[1, b].tolist(), retrieve[2, b].tolist(), retrieve[0, b].tolist(),
            target, max_accept,
        )  # fmt: skip
        assert accept_index[b].tolist() == accept + [-1] * (max_accept - len(accept))
        assert int(accept_num[b]) == len(accept) - 1
        for row, tok in preds.items():
            want_preds[row] = tok
    assert predicts.tolist() == want_preds


@pytest.mark.parametrize("seed", SEEDS)
def test_fill_bonus_tokens_and_accept_out_cache_loc(seed: int) -> None:
    prng = random.Random(seed)
    bs, width = prng.randint(1, 5), prng.randint(1, 5)
    tokens = [[prng.randrange(1000) for _ in range(width)] for _ in range(bs)]
    lens = [prng.randint(1, width) for _ in range(bs)]
    bonus = torch.zeros(bs, dtype=torch.int32)
    cpu_ops.fill_bonus_tokens(torch.tensor(tokens), torch.tensor(lens), bonus, width)
    assert bonus.tolist() == [tokens[i][lens[i] - 1] for i in range(bs)]

    out_cache_loc = [prng.randrange(10_000) for _ in range(bs * width)]
    accept_index = [[i * width + j if j < lens[i] else -1 for j in range(width)] for i in range(bs)]
    result = torch.full((bs * width,), -9, dtype=torch.int64)
    cpu_ops.fill_accept_out_cache_loc(
        torch.tensor(accept_index, dtype=torch.int32), torch.tensor(out_cache_loc), result
    )
    kept = [out_cache_loc[x] for row in accept_index for x in row if x != -1]
    assert result.tolist() == kept + [-9] * (bs * width - len(kept))


def test_all_ops_registered_under_sgl_kernel() -> None:
    if not _may_register():
        pytest.skip("a real sgl_kernel or CUDA is present; the shim is not used here")
    cpu_ops.register_ops()
    assert cpu_ops.register_ops() == []  # idempotent
    for name in cpu_ops.OPS:
        assert hasattr(torch.ops.sgl_kernel, name), name
    # Its presence would make SGLang believe the AMX weight-packing kernels exist.
    assert "convert_weight_packed" not in cpu_ops.OPS
