"""Torch reference implementations of the ops: they run everywhere and define the semantics.

Index arrays follow the "dump row" convention of nanospec_server.vocab: an entry pointing
at the last row of the destination is masked out.
"""

import torch
from torch import Tensor

from nanospec_server.ops import bitmap


def scatter_rows(
    dst: Tensor, dst_rows: Tensor, src: Tensor, src_rows: Tensor, compact: bool | None = None
) -> None:
    """``dst[dst_rows[i]] = src[src_rows[i]]`` for every i with dst_rows[i] != len(dst) - 1.

    ``compact`` (default: on CPU) copies only the kept rows, which needs their count on the
    host; otherwise shapes stay fixed and masked rows are copied into the dump row.
    """
    keep = dst_rows != dst.shape[0] - 1
    if dst.device.type == "cpu" if compact is None else compact:
        index = keep.nonzero().squeeze(1)
        dst_rows, src_rows = dst_rows[index], src_rows[index]
    else:  # fixed shapes: masked rows land in the dump row
        src_rows = torch.where(keep, src_rows, 0)
    dst.index_copy_(0, dst_rows, src.index_select(0, src_rows).to(dst.dtype))


def window_append(
    ring: Tensor,
    latest: Tensor,
    slots: Tensor,
    tokens: Tensor,
    positions: Tensor,
    in_ring: Tensor,
) -> None:
    """Write stream tokens into their slots' rings and keep the ring's ``latest`` flags.

    ring: [S, W_cap + 1] int32, latest: [S, W_cap + 1] bool (last column: dump);
    tokens, positions, in_ring: [B, L], ``in_ring`` marking the tokens that go into the
    ring (no two of a row to one cell). A cell whose token is among its row's appended
    tokens loses its flag (a later occurrence exists); an appended cell is flagged iff no
    later token of its row is the same. Sorting each row's tokens answers both with fixed
    shapes and O(L log L + W_cap log L) work per row.
    """
    length, w_cap = tokens.shape[1], ring.shape[1] - 1
    if length == 0:
        return
    keys = torch.where(in_ring, tokens, 2**62)  # 2**62: no ring token
    keys, order = torch.sort(keys, dim=1, stable=True)  # equal tokens keep column order
    followed = torch.zeros_like(in_ring)
    followed[:, :-1] = keys[:, 1:] == keys[:, :-1]  # a later occurrence in the append
    last_of_token = torch.empty_like(followed).scatter_(1, order, ~followed)
    old = ring[slots, :w_cap].to(torch.int64)
    at = torch.searchsorted(keys, old).clamp(max=length - 1)
    superseded = keys.gather(1, at) == old
    latest[slots, :w_cap] &= ~superseded
    rows = slots.unsqueeze(1).expand_as(tokens)
    cells = torch.where(in_ring, positions % w_cap, w_cap)
    ring[rows, cells] = tokens.to(ring.dtype)
    latest[rows, cells] = last_of_token
    latest[:, w_cap] = False


def packed_logits(hidden: Tensor, rows: Tensor, count: Tensor) -> Tensor:
    """float32 logits [N, R] of ``hidden`` [N, d] against ``rows`` [R, d]; -inf from row
    ``count`` (a 1-element tensor) on. Multiplies all R rows: slice first where R is known."""
    logits = (hidden.to(rows.dtype) @ rows.T).float()
    dead = torch.arange(rows.shape[0], device=rows.device) >= count
    return logits.masked_fill(dead, float("-inf"))


def packed_topk(
    hidden: Tensor,
    rows: Tensor,
    count: Tensor,
    ids: Tensor,
    in_set: Tensor,
    row_slots: Tensor,
    num_pinned: int,
    k: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """The k best packed rows of each hidden row's active vocabulary, and its log-sum-exp.

    Logits are ``hidden [N, d] @ rows[r]`` in float32. Row r is allowed for hidden row n
    when ``r < count``, ``ids[r] >= 0`` and either r is pinned (``r < num_pinned``) or
    bit ``ids[r]`` of ``in_set[row_slots[n]]`` is set (a packed bitmap, ``ops.bitmap``).
    Returns (top logits [N, k], packed rows [N, k], log-sum-exp [N]): the allowed entries
    ordered by logit, descending, ties broken by the lowest row (a stable sort). Where
    fewer than k rows are allowed the tail holds -inf with some valid row (unspecified); a
    row with none has log-sum-exp -inf.
    """
    logits = hidden.to(rows.dtype).float() @ rows.float().T
    r = torch.arange(rows.shape[0], device=rows.device)
    tokens = ids[: rows.shape[0]]
    member = bitmap.test(in_set, row_slots.to(torch.int64).unsqueeze(1), tokens.clamp(min=0))
    allowed = (r < count) & (tokens >= 0) & ((r < num_pinned) | member)
    logits = logits.masked_fill(~allowed, float("-inf"))
    if logits.shape[1] < k:  # fewer rows than k: pad with impossible entries (row 0)
        logits = torch.nn.functional.pad(logits, (0, k - logits.shape[1]), value=float("-inf"))
    values, order = torch.sort(logits, dim=1, descending=True, stable=True)
    top_rows = torch.where(order[:, :k] < rows.shape[0], order[:, :k], 0)
    return values[:, :k], top_rows, torch.logsumexp(logits, dim=1)
