"""The training loop: AdamW over the head's parameters, target features from the cache.

Precision (``precision.py``): fp32 master weights and optimizer state; with ``bf16``
the head runs under bf16 autocast and the frozen LM head is stored in bf16 too.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from nanospec_server.train.distill import DistilledRows
from nanospec_server.train.head import EagleHead
from nanospec_server.train.loss import LossParts, LossWeights, eagle_loss
from nanospec_server.train.precision import autocast
from nanospec_server.train.schedule import cosine_lr
from nanospec_server.train.target import SharedWeights


@dataclass(frozen=True)
class LoopConfig:
    steps: int
    batch_rows: int
    lr: float
    warmup_steps: int
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    eval_every: int = 0  # 0: only at the start and the end
    bf16: bool = False  # bf16 autocast (see precision.py)
    loss: LossWeights = field(default_factory=LossWeights)
    unroll_steps: int = 1  # training-time test: 1 is teacher forcing only (EAGLE-1)
    unroll_decay: float = 0.8  # weight of step j: decay**j (EAGLE-3's choice)
    accept_steps: int = 4  # chain length of the validation acceptance estimate
    accept_stride: int = 4  # validation draft starts: every N-th answer position


@dataclass
class LoopResult:
    train_loss: list[float]  # total loss per step
    evals: list[dict]  # {"step", "regression", "top1"} on the validation rows
    seconds: float
    tokens_per_second: float  # trained (masked-in) positions per second


def _step_inputs(rows: DistilledRows, shared: SharedWeights, device):
    """Teacher forcing: position i sees token i+1 and feature i, predicts feature i+1.

    Trained positions: from the last prompt token (whose pair predicts the answer's
    second token, the first one the draft guesses in SGLang) to the row's end.
    """
    width = max(2, int(rows.lengths.max()))  # padding past the longest row is not computed
    ids = rows.input_ids[:, :width].to(device)
    features = rows.hidden[:, :width].to(device, torch.float32)
    next_embeds = shared.embed[ids[:, 1:]].float()
    positions = torch.arange(ids.shape[1] - 1, device=device)
    first = (rows.prompt_lengths.to(device) - 1)[:, None]
    last = (rows.lengths.to(device) - 2)[:, None]
    mask = (positions[None] >= first) & (positions[None] <= last)
    return next_embeds, features[:, :-1], features[:, 1:], positions, mask


def started_at(mask: torch.Tensor, step: int) -> torch.Tensor:
    """Positions i whose unrolled step ``step`` started at a trained position i - step."""
    if step == 0:
        return mask
    shifted = torch.zeros_like(mask)
    shifted[:, step:] = mask[:, :-step]
    return mask & shifted


def unrolled_loss(
    head: EagleHead, inputs: tuple, shared: SharedWeights, cfg: LoopConfig, offset: int
) -> LossParts:
    """Teacher forcing (one step) or the training-time test's weighted sum over steps."""
    embeds, features, targets, positions, mask = inputs
    with autocast(cfg.bf16, features.device):
        if cfg.unroll_steps == 1:
            predicted = [head(embeds, features, positions)]
        else:
            predicted = head.unroll(embeds, features, positions, cfg.unroll_steps)
    parts = [
        eagle_loss(
            out.to(targets.dtype), targets, started_at(mask, step), shared.lm_head, cfg.loss, offset
        )
        for step, out in enumerate(predicted)
    ]
    weights = [cfg.unroll_decay**step for step in range(len(parts))]
    total = sum(w * p.total for w, p in zip(weights, parts, strict=True)) / sum(weights)
    first = parts[0]
    return LossParts(total, first.regression, first.classification, first.top1)


def chain_acceptance(
    head: EagleHead, inputs: tuple, shared: SharedWeights, cfg: LoopConfig
) -> tuple[float, int]:
    """Mean tokens per verification of a greedy chain draft of ``accept_steps`` tokens
    started at every ``accept_stride``-th answer position: 1 (the target's own token)
    plus the draft tokens accepted before the first miss.

    Exact for a chain, up to rounding: the unrolled head is fed the true next tokens,
    which are the drafted ones for as long as every earlier guess was right.
    """
    embeds, features, targets, positions, mask = inputs
    steps = cfg.accept_steps
    with autocast(cfg.bf16, features.device):
        predicted = head.unroll(embeds, features, positions, steps)
    starts = mask.nonzero()
    starts = starts[starts[:, 1] % cfg.accept_stride == 0]
    alive = torch.ones(len(starts), dtype=torch.bool, device=features.device)
    accepted = torch.zeros(len(starts), device=features.device)
    for step, out in enumerate(predicted):
        row, col = starts[:, 0], starts[:, 1] + step
        inside = col < mask.shape[1]
        col = col.clamp(max=mask.shape[1] - 1)
        inside &= mask[row, col]  # the row ended: nothing more to accept
        head_rows = shared.lm_head
        guess = (out[row, col].to(head_rows.dtype) @ head_rows.T).argmax(-1)
        truth = (targets[row, col].to(head_rows.dtype) @ head_rows.T).argmax(-1)
        alive &= inside & (guess == truth)
        accepted += alive.float()
    return 1.0 + float(accepted.mean()) if len(starts) else 1.0, len(starts)


@torch.no_grad()
def evaluate(head, rows: DistilledRows, shared, cfg: LoopConfig, device) -> dict:
    head.eval()
    totals = {"regression": 0.0, "top1": 0.0}
    batches = accept_sum = accept_count = 0
    # Every position counts for validation top-1 (stride 1), not just the sampled ones.
    weights = LossWeights(cfg.loss.regression, cfg.loss.classification, cls_stride=1)
    for start in range(0, len(rows.input_ids), cfg.batch_rows):
        inputs = _step_inputs(rows.select(slice(start, start + cfg.batch_rows)), shared, device)
        embeds, features, targets, positions, mask = inputs
        with autocast(cfg.bf16, device):
            predicted = head(embeds, features, positions).float()
        parts = eagle_loss(predicted, targets, mask, shared.lm_head, weights)
        totals["regression"] += parts.regression
        totals["top1"] += parts.top1
        batches += 1
        if cfg.accept_steps:
            accept, count = chain_acceptance(head, inputs, shared, cfg)
            accept_sum += accept * count
            accept_count += count
    head.train()
    result = {key: value / max(1, batches) for key, value in totals.items()}
    if accept_count:
        result[f"chain{cfg.accept_steps}_acceptance"] = accept_sum / accept_count
    return result


def train(
    head: EagleHead,
    train_rows: DistilledRows,
    val_rows: DistilledRows,
    shared: SharedWeights,
    cfg: LoopConfig,
    device: torch.device,
    generator: torch.Generator,
) -> LoopResult:
    count = len(train_rows.input_ids)
    optimizer = torch.optim.AdamW(
        head.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay
    )
    evals = [{"step": 0, **evaluate(head, val_rows, shared, cfg, device)}]
    losses: list[float] = []
    order = torch.randperm(count, generator=generator)
    cursor = trained_tokens = 0
    started = time.monotonic()
    bar = tqdm(range(cfg.steps), desc="train-eagle", unit="step")
    for step in bar:
        if cursor + cfg.batch_rows > len(order):  # next epoch, reshuffled
            order, cursor = torch.randperm(count, generator=generator), 0
        batch = order[cursor : cursor + cfg.batch_rows]
        cursor += cfg.batch_rows
        for group in optimizer.param_groups:
            group["lr"] = cosine_lr(step, cfg.steps, cfg.lr, cfg.warmup_steps)
        inputs = _step_inputs(train_rows.select(batch), shared, device)
        trained_tokens += int(inputs[-1].sum())
        offset = step % cfg.loss.cls_stride  # rotate the sampled positions across steps
        parts = unrolled_loss(head, inputs, shared, cfg, offset)
        if not math.isfinite(parts.total.item()):
            raise FloatingPointError(f"loss is {parts.total.item()} at step {step}")
        optimizer.zero_grad(set_to_none=True)
        parts.total.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), cfg.grad_clip)
        optimizer.step()
        losses.append(parts.total.item())
        bar.set_postfix(loss=f"{parts.total.item():.3f}", top1=f"{parts.top1:.2f}")
        if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.steps:
            evals.append({"step": step + 1, **evaluate(head, val_rows, shared, cfg, device)})
    seconds = time.monotonic() - started
    evals.append({"step": cfg.steps, **evaluate(head, val_rows, shared, cfg, device)})
    return LoopResult(losses, evals, seconds, trained_tokens / max(seconds, 1e-9))
