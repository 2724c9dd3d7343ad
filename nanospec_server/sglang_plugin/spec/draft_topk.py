"""The draft loop's top-k, fused into the packed head: no [N, capacity] logits on CUDA.

In SGLang's EAGLE draft loop (`EagleDraftWorker.draft_forward`) each step's draft logits
become (probs, column ids) through `renorm_draft_probs` + `fast_topk` (topk > 1) or
`draft_topk1_postprocess` (topk = 1, CUDA), and columns become token ids through
`hot_token_id`, which our draft worker points at the packed head's row -> token map. Over
the packed head with fixed shapes that would softmax and scan all `capacity` columns.

On the fused path the packed head's `quant_method` (`packed_head.PackedTopkMethod`) runs
`DynamicVocab.packed_topk` instead: one kernel multiplies, masks and selects over the live
row tiles only. It returns a *carrier* in place of the logits, [N, 2k] float32: the k
probabilities, best first, then their packed rows (as floats; exact below 2**24). AROUND
hooks on those three SGLang functions (installed by `scheduler_hooks.py`) recognise the
carrier by identity and hand back its probabilities and rows; SGLang's `hot_token_id`
lookup then maps rows to token ids as before. Every other tensor goes to SGLang's own
function untouched. Identity is checked in Python, so it holds when SGLang captures the
draft loop into a CUDA graph: replay runs the kernels recorded for the carrier's path.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from nanospec_server import seams


class DraftTopk:
    """The latest carrier, and the probabilities the renorm hook derived from it."""

    def __init__(self) -> None:
        self.carrier: Tensor | None = None
        self.probs: Tensor | None = None

    def make_carrier(self, probs: Tensor, rows: Tensor) -> Tensor:
        self.carrier = torch.cat([probs.float(), rows.float()], dim=1)
        self.probs = None
        return self.carrier

    def is_carrier(self, tensor: object) -> bool:
        return tensor is not None and tensor is self.carrier

    def split(self, carrier: Tensor) -> tuple[Tensor, Tensor]:
        k = carrier.shape[1] // 2
        return carrier[:, :k], carrier[:, k:].to(torch.int64)


DRAFT_TOPK = DraftTopk()


def renorm_draft_probs_hook(original: Callable, next_token_logits, *args, **kwargs):
    """The draft distribution: for a carrier, its k probabilities (already exact)."""
    if not DRAFT_TOPK.is_carrier(next_token_logits):
        return original(next_token_logits, *args, **kwargs)
    DRAFT_TOPK.probs, _ = DRAFT_TOPK.split(next_token_logits)
    return DRAFT_TOPK.probs


def fast_topk_hook(original: Callable, values, topk, dim, *args, **kwargs):
    """Top-k of the carrier's probabilities: they are sorted already; their ids are rows."""
    if values is None or values is not DRAFT_TOPK.probs:
        return original(values, topk, dim, *args, **kwargs)
    _, rows = DRAFT_TOPK.split(DRAFT_TOPK.carrier)
    return values[:, :topk], rows[:, :topk]


def draft_topk1_postprocess_hook(
    original: Callable,
    next_token_logits,
    positions,
    draft_tokens=None,
    draft_token_column: int = 0,
):
    """SGLang's topk = 1 step on CUDA: argmax, probability 1, positions advanced."""
    if not DRAFT_TOPK.is_carrier(next_token_logits):
        return original(next_token_logits, positions, draft_tokens, draft_token_column)
    if draft_tokens is not None:  # SGLang writes token ids there only without hot_token_id
        raise RuntimeError("nanospec: the fused draft top-k needs SGLang's hot_token_id path")
    _, rows = DRAFT_TOPK.split(next_token_logits)
    positions.add_(1)
    return torch.ones_like(rows[:, :1], dtype=torch.float32), rows[:, :1].contiguous()


def register_hooks() -> None:
    """AROUND hooks on the three SGLang functions that turn draft logits into top-k."""
    seams.hook(seams.RENORM_DRAFT_PROBS, renorm_draft_probs_hook)
    seams.hook(seams.FAST_TOPK, fast_topk_hook)
    seams.hook(seams.DRAFT_TOPK1_POSTPROCESS, draft_topk1_postprocess_hook)
