"""Rows of a sampling step that hold no token to sample, and a safe stand-in for them.

A row of final logits (after penalties, grammar mask, `min_new_tokens` masking and logit
bias) is unsamplable when softmax over it is no distribution: every entry is -inf (the
request's constraints mask every token), or an entry is NaN, or temperature scaling
overflows to +inf. SGLang's torch sampler then hands NaN probabilities to
`torch.multinomial`, which raises inside the scheduler and stops the server. Greedy rows
only fail when argmax has nothing to pick (all -inf or NaN). Pure torch, no SGLang import.
"""

from __future__ import annotations

import torch
from torch import Tensor


def unsamplable_rows(logits: Tensor, temperatures: Tensor | None) -> Tensor:
    """Bool [rows]: which rows of `logits` [rows, vocab] have no token to sample.

    `temperatures` [rows] or [rows, 1] for sampled rows as SGLang divides them (greedy rows
    in a mixed batch carry 1.0); None where every row is greedy (argmax).
    """
    if logits.numel() == 0:
        return torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
    if temperatures is None:
        # NaN > -inf is False, so NaN rows count too.
        return ~(logits.amax(dim=-1) > float("-inf"))
    scaled = logits / temperatures.reshape(-1, 1).to(logits.dtype)
    # softmax is a distribution exactly when the row's maximum is finite and no entry is
    # NaN; amax propagates NaN, so one reduction answers both.
    return ~torch.isfinite(scaled.amax(dim=-1))


def make_samplable(logits: Tensor, rows: Tensor) -> None:
    """Give `rows` a uniform distribution in place, so every sampler completes the step.
    Whatever token they then draw is never served: their requests are ended."""
    logits[rows] = 0.0
