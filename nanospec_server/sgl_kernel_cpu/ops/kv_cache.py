"""Cache-location bookkeeping ops (req_to_token table, KV slot copies), in plain PyTorch.

Stand-ins for sgl_kernel's CPU ops with the same argument order SGLang's callers use.
All of them mutate an output argument in place and return nothing, except
``build_draft_decode_metadata`` which returns a new table.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator

import torch

__all__ = [
    "assign_req_to_token_pool",
    "assign_extend_cache_locs",
    "assign_draft_cache_locs_contiguous",
    "copy_all_layer_kv_cache",
    "build_draft_decode_metadata",
]


def assign_req_to_token_pool(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Scatter: ``req_to_token[req_i, start_i:end_i] = out_cache_loc[packed run i]``.

    Runs for consecutive requests are packed back to back in ``out_cache_loc``.
    """
    del pool_len  # the row stride; implied by req_to_token's shape here
    for req, start, end, packed in _packed_runs(req_pool_indices, start_offset, end_offset):
        req_to_token[req, start:end] = out_cache_loc[packed].to(req_to_token.dtype)


def assign_extend_cache_locs(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Gather: ``out_cache_loc[packed run i] = req_to_token[req_i, start_i:end_i]``."""
    del pool_len
    for req, start, end, packed in _packed_runs(req_pool_indices, start_offset, end_offset):
        out_cache_loc[packed] = req_to_token[req, start:end].to(out_cache_loc.dtype)


def _packed_runs(
    req_pool_indices: torch.Tensor, start_offset: torch.Tensor, end_offset: torch.Tensor
) -> Iterator[tuple[int, int, int, slice]]:
    """(request row, start, end, its slice of the packed buffer) for each non-empty run."""
    offset = 0
    rows = zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist(), strict=True)
    for req, start, end in rows:
        n = int(end) - int(start)
        if n <= 0:
            continue
        yield req, int(start), int(end), slice(offset, offset + n)
        offset += n


def assign_draft_cache_locs_contiguous(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
    topk: int,
    num_cols: int,
) -> None:
    """Copy each request's ``topk * num_cols`` slots starting at its ``seq_len`` into
    ``out_cache_loc[i * topk * num_cols : (i + 1) * topk * num_cols]``."""
    del pool_len
    width = topk * num_cols
    for i, (req, seq_len) in enumerate(
        zip(req_pool_indices.tolist(), seq_lens.tolist(), strict=True)
    ):
        out_cache_loc[i * width : (i + 1) * width] = req_to_token[
            req, seq_len : seq_len + width
        ].to(out_cache_loc.dtype)


def _byte_rows(address: int, row_bytes: int, num_rows: int) -> torch.Tensor:
    """A writable ``[num_rows, row_bytes]`` uint8 view of raw host memory at ``address``."""
    raw = (ctypes.c_uint8 * (row_bytes * num_rows)).from_address(address)
    return torch.frombuffer(raw, dtype=torch.uint8).view(num_rows, row_bytes)


def copy_all_layer_kv_cache(
    data_ptrs: torch.Tensor,
    strides: torch.Tensor,
    tgt_loc: torch.Tensor,
    src_loc: torch.Tensor,
) -> None:
    """For every buffer (one per layer and K/V), copy row ``src_loc[j]`` to ``tgt_loc[j]``.

    Buffers arrive as raw data pointers with their row stride in bytes (that is how SGLang's
    pool hands them to the fused kernel). All source rows are read before any target row is
    written, so overlapping source/target sets are safe.

    A row moved onto itself is left alone: after a verify the accepted root (and at
    depth 0 of adaptive speculation, every row) is already in place, and copying it over
    every layer is a visible share of a one-token verify step. Targets are distinct,
    so no other move writes such a row, and moves reading it read the same bytes.
    """
    src = src_loc.to(torch.int64)
    tgt = tgt_loc.to(torch.int64)
    moved = tgt != src
    if not bool(moved.all()):
        src, tgt = src[moved], tgt[moved]
    if tgt.numel() == 0:
        return
    num_rows = int(torch.maximum(src.max(), tgt.max()).item()) + 1
    for address, row_bytes in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        rows = _byte_rows(int(address), int(row_bytes), num_rows)
        rows[tgt] = rows[src].clone()


def build_draft_decode_metadata(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    num_steps: int,
    pool_len: int,
) -> torch.Tensor:
    """Per-branch token tables for multi-step draft decoding.

    Returns ``[bs * topk, pool_len]`` (row ``i * topk + k`` is branch ``k`` of request ``i``):
    the request's prefix ``req_to_token[req, :seq_len]`` followed by the branch's own draft
    slots. The draft slots were laid out ``[topk, num_steps]`` per request right after the
    prefix (see ``assign_draft_cache_locs_contiguous``), so branch ``k`` step ``s`` lives at
    column ``seq_len + k * num_steps + s`` of the request's row. Unused columns are zero.
    """
    bs = seq_lens.shape[0]
    out = torch.zeros((bs * topk, pool_len), dtype=req_to_token.dtype, device=req_to_token.device)
    for i, (req, seq_len) in enumerate(
        zip(req_pool_indices.tolist(), seq_lens.tolist(), strict=True)
    ):
        row = req_to_token[req]
        for k in range(topk):
            dst = out[i * topk + k]
            dst[:seq_len] = row[:seq_len]
            draft_start = seq_len + k * num_steps
            dst[seq_len : seq_len + num_steps] = row[draft_start : draft_start + num_steps]
    return out
