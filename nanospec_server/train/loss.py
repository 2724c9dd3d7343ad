"""EAGLE-1 training loss: feature regression plus a cheap token classification term.

* regression: smooth L1 between the predicted and the target's next feature, over
  every trained position (cheap: d numbers per position);
* classification: cross-entropy of the shared LM head over the predicted feature
  against the token the target itself would pick (argmax of the LM head over the
  true feature), which is what greedy verification accepts. The LM head is a
  [vocab, d] matmul (151936 x 896 for Qwen2.5-0.5B, ~8x the head's own cost per
  position), so it runs on every ``cls_stride``-th position only.

``mask`` [B, L] selects the trained positions: those whose next token is part of
the target's answer (padding and most of the prompt are left out).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class LossWeights:
    regression: float = 1.0
    classification: float = 0.1  # EAGLE-1's ratio
    cls_stride: int = 8


@dataclass
class LossParts:
    total: torch.Tensor
    regression: float
    classification: float
    top1: float  # fraction of sampled positions where draft argmax == target argmax


def eagle_loss(
    predicted: torch.Tensor,
    target: torch.Tensor,
    mask: torch.Tensor,
    lm_head: torch.Tensor,
    weights: LossWeights,
    offset: int = 0,
) -> LossParts:
    """predicted, target: [B, L, d] (fp32); mask: [B, L] bool; lm_head: [vocab, d]."""
    count = mask.sum().clamp(min=1)
    per_position = F.smooth_l1_loss(predicted, target, reduction="none").mean(-1)
    regression = (per_position * mask).sum() / count
    column = torch.arange(mask.shape[1], device=mask.device)
    sampled = mask & (column % weights.cls_stride == offset)
    if not sampled.any():  # rare: a short batch with no position at this offset
        sampled = mask
    pred_rows = predicted[sampled]
    with torch.no_grad():
        labels = (target[sampled].to(lm_head.dtype) @ lm_head.T).argmax(-1)
    logits = (pred_rows.to(lm_head.dtype) @ lm_head.T).float()
    classification = F.cross_entropy(logits, labels) if len(labels) else logits.sum()
    total = weights.regression * regression + weights.classification * classification
    top1 = (logits.argmax(-1) == labels).float().mean() if len(labels) else torch.tensor(0.0)
    return LossParts(total, regression.item(), classification.item(), top1.item())
