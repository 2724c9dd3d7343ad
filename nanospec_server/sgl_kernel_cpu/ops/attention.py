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

Math runs in float32, one query token at a time over exactly the keys it sees (see
``_attend_row``: that is what makes speculative greedy output bit-identical to plain
decoding); outputs are written in place.
"""

from __future__ import annotations

import torch

__all__ = ["decode_attention", "extend_attention"]


def _gathered(
    buffer: torch.Tensor, slots: torch.Tensor, scale: float, own_rows: torch.Tensor | None = None
) -> torch.Tensor:
    """Cache rows ``slots`` as one float32 ``[len(slots) (+ own), Hkv, D]``, the fp8 cache
    scale undone, then ``own_rows`` (a step's own K or V, unscaled) when given. Written
    into one buffer: a one-token verify that concatenated its prefix with its own row
    copied the prefix twice per layer, where a decode step copies it once."""
    cached = slots.numel()
    own = 0 if own_rows is None else own_rows.shape[0]
    out = torch.empty((cached + own, *buffer.shape[1:]), dtype=torch.float32)
    if buffer.dtype == torch.float32:
        torch.index_select(buffer, 0, slots, out=out[:cached])
    else:
        out[:cached].copy_(buffer.index_select(0, slots))
    if scale != 1.0:
        out[:cached].mul_(scale)
    if own_rows is not None:
        out[cached:].copy_(own_rows.reshape(own, *buffer.shape[1:]))
    return out


def _attend_row(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sm_scale: float,
    logit_cap: float,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """Softmax attention of one query token over exactly the keys it sees, in order.

    q: [H, D] float32; k: [nk, Hkv, D] and v: [nk, Hkv, Dv], contiguous. Returns [H, Dv].
    Decode and extend both call this with the same shapes for the same position, which is
    what makes a verify (or prefill) row bit-identical to decoding that position: no
    masked-out keys take part in the reductions, and no other row shares the matmuls.
    """
    num_heads, num_kv_heads = q.shape[0], k.shape[1]
    # Grouped-query heads as a batch of [group, D] queries per KV head: no K/V copies.
    q = q.view(num_kv_heads, num_heads // num_kv_heads, -1)
    scores = torch.matmul(q, k.permute(1, 2, 0)) * sm_scale  # [Hkv, group, nk]
    if logit_cap > 0:
        scores = logit_cap * torch.tanh(scores / logit_cap)
    if sinks is not None:
        # The sink is one more "key" per head with no value: it takes softmax mass only.
        sink_col = sinks.to(torch.float32).view(*scores.shape[:2], 1)
        probs = torch.softmax(torch.cat([scores, sink_col], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, v.permute(1, 0, 2)).reshape(num_heads, -1)


def _attend_last_tokens(
    q: torch.Tensor,
    out: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    key_scale: float,
    value_scale: float,
    req_to_token: torch.Tensor,
    reqs: list[int],
    lens: list[int],
    sliding_window_size: int,
    sm_scale: float,
    logit_cap: float,
    sinks: torch.Tensor | None,
    own: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """Row i of ``q`` ([n, H, D] float32) is the last token of request i: it attends the
    sequence's last ``sliding_window_size`` keys (all if <= 0), and ``out[i]`` gets the
    result. The token's own K/V come from row i of ``own`` when given (an extend), else
    from the cache (a decode, which stored them there): the same keys either way."""
    for i, seq_len in enumerate(lens):
        begin = max(0, seq_len - sliding_window_size) if sliding_window_size > 0 else 0
        cached = req_to_token[reqs[i], begin : seq_len if own is None else seq_len - 1]
        cached = cached.to(torch.int64)
        own_k, own_v = (None, None) if own is None else (own[0][i : i + 1], own[1][i : i + 1])
        k = _gathered(k_buffer, cached, key_scale, own_k)
        v = _gathered(v_buffer, cached, value_scale, own_v)
        out[i].copy_(_attend_row(q[i], k, v, sm_scale, logit_cap, sinks).to(out.dtype))


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
    _attend_last_tokens(
        q_all, out, k_cache, v_cache, key_scale, value_scale, req_to_token,
        req_pool_indices.tolist(), seq_lens.tolist(), sliding_window_size, sm_scale, logit_cap,
        sinks,
    )  # fmt: skip


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
    n = len(ext_lens)
    # one token per request, rows in request order (as SGLang lays a verify out)
    one_token_each = n > 0 and ext_lens == [1] * n and starts == list(range(n))
    own_kv_given = k_extend is not None and v_extend is not None
    # causal, or a tree mask of 1x1 blocks that show each row itself (not an encoder's rows,
    # which take no sliding window)
    if tree_mask is None:
        sees_prefix_and_itself = is_causal
    else:
        sees_prefix_and_itself = bool(tree_mask[:n].all())
    if one_token_each and own_kv_given and sees_prefix_and_itself:
        # A one-token verify (depth 0 of adaptive speculation) or prefill: each row is its
        # request's last token, computed as a decode step computes it, with the batch's
        # per-row work done once (the general loop below repeats it per row)
        _attend_last_tokens(
            q_extend.to(torch.float32), o_extend, k_buffer, v_buffer, key_scale, value_scale,
            req_to_token, reqs, lens, sliding_window_size, sm_scale, logit_cap, sinks,
            own=(k_extend, v_extend),
        )  # fmt: skip
        return
    mask_offset = 0
    for i in range(len(lens)):
        seq_len, ext_len, start = int(lens[i]), int(ext_lens[i]), int(starts[i])
        if ext_len == 0:
            continue
        prefix_len = seq_len - ext_len
        row = req_to_token[reqs[i]]
        q = q_extend[start : start + ext_len].to(torch.float32)
        if k_extend is not None and v_extend is not None:
            cached = row[:prefix_len].to(torch.int64)
            k = _gathered(k_buffer, cached, key_scale, k_extend[start : start + ext_len])
            v = _gathered(v_buffer, cached, value_scale, v_extend[start : start + ext_len])
        else:  # KV-shared layers: the new tokens' K/V are in the cache too
            cached = row[:seq_len].to(torch.int64)
            k, v = _gathered(k_buffer, cached, key_scale), _gathered(v_buffer, cached, value_scale)
        tree = None
        if tree_mask is not None:
            block = tree_mask[mask_offset : mask_offset + ext_len * ext_len]
            mask_offset += ext_len * ext_len
            tree = block.view(ext_len, ext_len).to(torch.bool)
        windowed = sliding_window_size > 0 and (is_causal or tree is not None)
        prefix_keys = torch.arange(prefix_len) if tree is not None else None
        out = o_extend[start : start + ext_len]
        for j in range(ext_len):
            # Each query row attends to exactly the keys a one-token decode of its position
            # would see, in position order, through the same call decode makes.
            if tree is not None:  # the prefix, then the row's ancestors and itself
                seen = prefix_len + tree[j].nonzero().squeeze(1)
                keys = torch.cat([prefix_keys, seen])
                if windowed:
                    keys = keys[-sliding_window_size:]
                k_row, v_row = k.index_select(0, keys), v.index_select(0, keys)
            else:
                end = prefix_len + j + 1 if is_causal else seq_len
                begin = max(0, end - sliding_window_size) if windowed else 0
                k_row, v_row = k[begin:end], v[begin:end]
            o = _attend_row(q[j], k_row, v_row, sm_scale, logit_cap, sinks)
            out[j].copy_(o.to(out.dtype))
