"""Paged attention over SGLang's token-indexed KV cache, in plain PyTorch.

Stand-ins for sgl_kernel's ``decode_attention_cpu`` and ``extend_attention_cpu``
as SGLang's ``IntelAMXAttnBackend`` calls them. Layout conventions:

* ``k_cache``/``v_cache``: ``[num_slots, num_kv_heads, head_dim]`` (one row per token slot).
* ``req_to_token[req, pos]`` is the cache slot of token ``pos`` of request ``req``.
* Query heads map onto KV heads in contiguous groups (GQA/MQA).
* ``sliding_window_size``: the backend passes ``layer.sliding_window_size + 1``, i.e. the
  number of visible keys counting the query's own position; ``<= 0`` means no window.
* ``logit_cap > 0`` applies ``cap * tanh(score / cap)`` before the softmax.
* ``sinks`` (per query head) is an extra logit that only joins the softmax denominator.

Math runs in float32 one request at a time; outputs are written in place.
"""

from __future__ import annotations

import torch

__all__ = ["decode_attention", "extend_attention"]


def _dequant(buf: torch.Tensor, scale: float) -> torch.Tensor:
    """Rows of a KV buffer as float32, undoing the fp8 cache scale when there is one."""
    out = buf.to(torch.float32)
    if scale != 1.0:
        out = out * scale
    return out


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    visible: torch.Tensor | None,
    sm_scale: float,
    logit_cap: float,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """Softmax attention for one request.

    q: [nq, H, D] float32; k: [nk, Hkv, D]; v: [nk, Hkv, Dv]; visible: [nq, nk] bool or None.
    Returns [nq, H, Dv] float32.
    """
    num_heads, num_kv_heads = q.shape[1], k.shape[1]
    group = num_heads // num_kv_heads
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    # [H, nq, nk]
    scores = torch.einsum("qhd,khd->hqk", q, k) * sm_scale
    if logit_cap > 0:
        scores = logit_cap * torch.tanh(scores / logit_cap)
    if visible is not None:
        scores = scores.masked_fill(~visible.unsqueeze(0), float("-inf"))
    if sinks is not None:
        # The sink is one more "key" per head with no value: it takes softmax mass only.
        sink_col = sinks.to(torch.float32).view(num_heads, 1, 1).expand(-1, scores.shape[1], 1)
        probs = torch.softmax(torch.cat([scores, sink_col], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    # A row with no visible key (only possible through an odd mask) gives NaN; make it zero.
    probs = torch.nan_to_num(probs, nan=0.0)
    return torch.einsum("hqk,khd->qhd", probs, v)


def _window_visible(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int) -> torch.Tensor:
    """[nq, nk] bool: key within the last ``window`` positions up to and including the query."""
    dist = q_pos.view(-1, 1) - k_pos.view(1, -1)
    return dist < window


def decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    key_scale: float,
    value_scale: float,
    output: torch.Tensor,
    key: torch.Tensor | None,
    value: torch.Tensor | None,
    loc: torch.Tensor | None,
    attn_logits: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    logit_cap: float,
    is_cross_attn: bool,
    sliding_window_size: int,
    encoder_lens: torch.Tensor | None,
    sinks: torch.Tensor | None,
) -> None:
    """One new query token per request attends to its whole cached sequence.

    When ``key``/``value`` are given they are this step's K/V; they are stored into the
    cache at ``loc`` first (seq_lens already counts the new token). ``attn_logits`` is the
    real kernel's split-K scratch buffer and is not used here.
    """
    del attn_logits, encoder_lens  # scratch of the fused kernel; cross-attn is rejected below
    if is_cross_attn:
        raise NotImplementedError("nanospec CPU shim: cross-attention is not supported")
    if key is not None and value is not None:
        if loc is None:
            raise ValueError("decode_attention: key/value given without cache locations")
        slots = loc.to(torch.int64)
        k_cache[slots] = key.reshape(-1, *k_cache.shape[1:]).to(k_cache.dtype)
        v_cache[slots] = value.reshape(-1, *v_cache.shape[1:]).to(v_cache.dtype)

    num_seqs = seq_lens.shape[0]
    num_heads = query.shape[1]
    q_all = query.reshape(num_seqs, num_heads, -1).to(torch.float32)
    out = output.view(num_seqs, num_heads, -1)
    lens = seq_lens.tolist()
    reqs = req_pool_indices.tolist()
    for i in range(num_seqs):
        seq_len = int(lens[i])
        start = 0
        if sliding_window_size > 0:
            start = max(0, seq_len - sliding_window_size)
        slots = req_to_token[reqs[i], start:seq_len].to(torch.int64)
        k = _dequant(k_cache[slots], key_scale)
        v = _dequant(v_cache[slots], value_scale)
        o = _attend(q_all[i : i + 1], k, v, None, sm_scale, logit_cap, sinks)
        out[i].copy_(o[0].to(out.dtype))


def extend_attention(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor | None,
    v_extend: torch.Tensor | None,
    o_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    key_scale: float,
    value_scale: float,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    max_len_extend: int | None,
    sm_scale: float,
    logit_cap: float,
    is_cross_attn: bool,
    sliding_window_size: int,
    encoder_lens: torch.Tensor | None,
    sinks: torch.Tensor | None,
    tree_mask: torch.Tensor | None,
    is_causal: bool,
) -> None:
    """Several new tokens per request attend to the cached prefix plus themselves.

    Request ``i`` owns query rows ``extend_start_loc[i] : + extend_seq_lens[i]``; its first
    ``seq_lens[i] - extend_seq_lens[i]`` tokens are the cached prefix (always visible, up
    to the sliding window). The new tokens' K/V come from ``k_extend``/``v_extend`` or,
    when those are None (KV-shared layers), from the cache.

    ``tree_mask`` (speculative verify) is the QLEN_ONLY layout: per request an
    ``[extend_len, extend_len]`` bool block, row = query, col = key, blocks laid out
    back to back. A query's tree depth (row count minus one) sets its position for the
    sliding window.
    """
    del max_len_extend, encoder_lens  # only sizes the fused kernel's tiles
    if is_cross_attn:
        raise NotImplementedError("nanospec CPU shim: cross-attention is not supported")
    lens = seq_lens.tolist()
    ext_lens = extend_seq_lens.tolist()
    starts = extend_start_loc.tolist()
    reqs = req_pool_indices.tolist()
    mask_offset = 0
    for i in range(len(lens)):
        seq_len, ext_len, start = int(lens[i]), int(ext_lens[i]), int(starts[i])
        if ext_len == 0:
            continue
        prefix_len = seq_len - ext_len
        row = req_to_token[reqs[i]]
        q = q_extend[start : start + ext_len].to(torch.float32)
        prefix_slots = row[:prefix_len].to(torch.int64)
        k_pre = _dequant(k_buffer[prefix_slots], key_scale)
        v_pre = _dequant(v_buffer[prefix_slots], value_scale)
        if k_extend is not None and v_extend is not None:
            k_new = k_extend[start : start + ext_len].to(torch.float32)
            v_new = v_extend[start : start + ext_len].to(torch.float32)
        else:
            new_slots = row[prefix_len:seq_len].to(torch.int64)
            k_new = _dequant(k_buffer[new_slots], key_scale)
            v_new = _dequant(v_buffer[new_slots], value_scale)
        k = torch.cat([k_pre, k_new.reshape(ext_len, *k_pre.shape[1:])], dim=0)
        v = torch.cat([v_pre, v_new.reshape(ext_len, *v_pre.shape[1:])], dim=0)

        device = q.device
        prefix_vis = torch.ones(ext_len, prefix_len, dtype=torch.bool, device=device)
        if tree_mask is not None:
            block = tree_mask[mask_offset : mask_offset + ext_len * ext_len]
            mask_offset += ext_len * ext_len
            new_vis = block.view(ext_len, ext_len).to(torch.bool)
            new_pos = prefix_len + new_vis.sum(dim=1) - 1
        elif is_causal:
            new_vis = torch.ones(ext_len, ext_len, dtype=torch.bool, device=device).tril()
            new_pos = prefix_len + torch.arange(ext_len, device=device)
        else:
            new_vis = torch.ones(ext_len, ext_len, dtype=torch.bool, device=device)
            new_pos = prefix_len + torch.arange(ext_len, device=device)
        visible = torch.cat([prefix_vis, new_vis], dim=1)
        if sliding_window_size > 0 and (is_causal or tree_mask is not None):
            k_pos = torch.cat([torch.arange(prefix_len, device=device), new_pos])
            visible &= _window_visible(new_pos, k_pos, sliding_window_size)

        o = _attend(q, k, v, visible, sm_scale, logit_cap, sinks)
        o_extend[start : start + ext_len].copy_(o.to(o_extend.dtype))
