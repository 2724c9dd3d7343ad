"""Top-k / top-p renormalisation of probability rows: stand-ins for the
``top_k_renorm_prob`` / ``top_p_renorm_prob`` ops that SGLang's sampling verify calls and
that only exist on CUDA/ROCm/NPU.

The cut rules follow SGLang's torch-native sampler (the one plain decoding uses on CPU), so
speculative sampling targets the same truncated distribution as plain sampling:

* top-k: keep the ``k`` largest probabilities of the row (ties: lower token id first),
* top-p: walking the row in descending order, drop every token whose preceding mass
  already exceeds ``p``,

then divide by the kept mass. Rows whose value is out of range (``k <= 0`` or ``k >= vocab``,
``p >= 1``) are kept whole.
"""

from __future__ import annotations

import torch

__all__ = ["top_k_renorm_prob", "top_p_renorm_prob"]


def _per_row(value: torch.Tensor | float | int, rows: int, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return (
            value.reshape(-1).to(dtype).expand(rows)
            if value.numel() == 1
            else value.reshape(-1).to(dtype)
        )
    return torch.full((rows,), value, dtype=dtype)


def _sorted_desc(probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # stable: among equal probabilities the lower token id ranks first, as argmax picks it
    # (top_k = 1 is how SGLang encodes greedy rows inside a sampling batch).
    return torch.sort(probs, dim=-1, descending=True, stable=True)


def _renormalise_kept(probs: torch.Tensor, order: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """Zero the tokens not kept (``kept`` is in sorted order) and rescale rows to sum 1."""
    sorted_probs = torch.gather(probs, -1, order) * kept
    out = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return out / out.sum(dim=-1, keepdim=True)


def top_k_renorm_prob(probs: torch.Tensor, top_ks: torch.Tensor | int) -> torch.Tensor:
    """Keep each row's ``top_ks[row]`` most likely tokens, renormalised (new tensor)."""
    rows, vocab = probs.shape
    k = _per_row(top_ks, rows, torch.int64).to(probs.device)
    k = torch.where((k <= 0) | (k > vocab), torch.full_like(k, vocab), k)
    _, order = _sorted_desc(probs)
    rank = torch.arange(vocab, device=probs.device).unsqueeze(0)
    return _renormalise_kept(probs, order, rank < k.unsqueeze(-1))


def top_p_renorm_prob(probs: torch.Tensor, top_ps: torch.Tensor | float) -> torch.Tensor:
    """Keep each row's nucleus of mass ``top_ps[row]``, renormalised (new tensor)."""
    rows, _ = probs.shape
    p = _per_row(top_ps, rows, probs.dtype).to(probs.device)
    sorted_probs, order = _sorted_desc(probs)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    return _renormalise_kept(probs, order, mass_before <= p.unsqueeze(-1))
