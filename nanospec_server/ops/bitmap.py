"""Packed per-slot token bitmaps: V bits per row, stored as int32 words.

Token v of row s is bit ``v % 32`` of word ``bitmap[s, v // 32]``; on a little-endian
machine that is bit ``v % 8`` of byte ``v // 8`` of the row, which is how the torch code
below reads and writes it (as uint8, whose additions wrap by definition). The Triton
kernels and the C++ loops use the word layout directly.
"""

import torch
from torch import Tensor

BITS = 32


def words_for(vocab_size: int) -> int:
    return (vocab_size + BITS - 1) // BITS


def empty(num_rows: int, vocab_size: int, device: torch.device) -> Tensor:
    return torch.zeros(num_rows, words_for(vocab_size), dtype=torch.int32, device=device)


def pack(dense: Tensor) -> Tensor:
    """int32 words [S, words_for(n)] of a dense bool [S, n] (for tests and callers that
    build a membership by hand)."""
    rows, n = dense.shape
    bits = torch.zeros(rows, words_for(n) * BITS, dtype=torch.bool, device=dense.device)
    bits[:, :n] = dense
    weights = 2 ** torch.arange(8, device=dense.device, dtype=torch.int32)
    bytes_ = (bits.view(rows, -1, 8).to(torch.int32) * weights).sum(-1).to(torch.uint8)
    return bytes_.view(torch.int32)


def test(bitmap: Tensor, rows: Tensor, tokens: Tensor) -> Tensor:
    """bool: bit ``tokens[...]`` of row ``rows[...]`` (broadcast together; tokens >= 0)."""
    row_bytes = bitmap.view(torch.uint8)
    tokens = tokens.to(torch.int64)
    byte = row_bytes[rows, tokens // 8].to(torch.int32)
    return (byte >> (tokens % 8).to(torch.int32)) & 1 != 0


def flip(bitmap: Tensor, rows: Tensor, tokens: Tensor, mask: Tensor) -> None:
    """Flip the bits of ``tokens[b, j]`` in row ``rows[b]`` where ``mask[b, j]``.

    The masked tokens of one row must be distinct, and each bit must be known to be
    clear (set it) or set (clear it) by the caller's own bookkeeping; then flipping is
    adding or subtracting its power of two, which one scatter_add does for a whole batch.
    """
    row_bytes = bitmap.view(torch.uint8)
    tokens = tokens.to(torch.int64).clamp(min=0)
    was = test(bitmap, rows.unsqueeze(1), tokens)
    power = 1 << (tokens % 8)
    # +power sets a clear bit; 256 - power (mod 256) clears a set one. 0 where masked.
    delta = torch.where(was, 256 - power, power).masked_fill(~mask, 0).to(torch.uint8)
    flat = rows.unsqueeze(1) * row_bytes.shape[1] + tokens // 8
    row_bytes.view(-1).scatter_add_(0, flat.flatten(), delta.flatten())
