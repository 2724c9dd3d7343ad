"""Training an EAGLE-3 head: the training-time test over the fused target features, with
a cross-entropy over the draft vocabulary against the target's own greedy tokens, and a
checkpoint that lets a run continue in a later one.

Labels: the rows are the target's greedy answers, so the token after position i+1 *is*
the target's argmax there (what greedy verification accepts); no LM-head pass over the
target's states is needed. Pair i (fed t_{i+1} and the target's states at i) learns
t_{i+2}, for i from the last prompt token to the third-last token of the row. A label
outside D cannot be drafted and is left out of the loss (as SpecForge masks it).

Each unrolled step j is weighted 0.8**j (EAGLE-3 / SpecForge). The LM head runs on every
``cls_stride``-th position (rotating offset) in training: over D it costs far more per
position than the decoder layer; validation uses every position.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from nanospec_server.train.distill import DistilledRows
from nanospec_server.train.eagle3_head import Eagle3Head
from nanospec_server.train.loop import started_at
from nanospec_server.train.precision import autocast
from nanospec_server.train.schedule import cosine_lr

CHECKPOINT = "checkpoint.pt"


@dataclass(frozen=True)
class Eagle3LoopConfig:
    steps: int
    batch_rows: int
    lr: float
    warmup_steps: int
    unroll_steps: int = 4  # training-time test steps (EAGLE-3 trains 7 on GPUs)
    unroll_decay: float = 0.8
    cls_stride: int = 4
    grad_clip: float = 0.5
    eval_every: int = 0  # 0: only at the start and the end
    bf16: bool = False
    accept_steps: int = 4  # chain length of the validation acceptance estimate
    accept_stride: int = 4
    checkpoint_every: int = 0  # 0: no checkpoint; else every N steps and at each eval


@dataclass
class Eagle3Batch:
    embeds: torch.Tensor  # [B, P, H]: e(t_{i+1})
    aux: torch.Tensor  # [B, P, k*H]: fused target states at i
    labels: torch.Tensor  # [B, P] draft id of t_{i+2}, -1 outside D or past the row
    tokens: torch.Tensor  # [B, P] token id of t_{i+2} (0 past the row)
    positions: torch.Tensor  # [P]
    mask: torch.Tensor  # [B, P] trained pairs (answer positions)


def batch_inputs(
    rows: DistilledRows, embed: torch.Tensor, draft_of: torch.Tensor, device
) -> Eagle3Batch:
    width = max(3, int(rows.lengths.max()))
    ids = rows.input_ids[:, :width].to(device)
    pairs = width - 1
    tokens = torch.zeros(len(ids), pairs, dtype=torch.long, device=device)
    tokens[:, : pairs - 1] = ids[:, 2:]
    positions = torch.arange(pairs, device=device)
    first = (rows.prompt_lengths.to(device) - 1)[:, None]
    last = (rows.lengths.to(device) - 3)[:, None]
    mask = (positions[None] >= first) & (positions[None] <= last)
    labels = torch.where(mask, draft_of.to(device)[tokens], -1)
    return Eagle3Batch(
        embeds=embed[ids[:, 1:]].float(),
        aux=rows.hidden[:, :pairs].to(device, torch.float32),
        labels=labels,
        tokens=tokens,
        positions=positions,
        mask=mask,
    )


def unrolled_loss(
    head: Eagle3Head, batch: Eagle3Batch, cfg: Eagle3LoopConfig, offset: int
) -> tuple[torch.Tensor, float]:
    """The weighted cross-entropy over the unrolled steps, and step 0's top-1."""
    with autocast(cfg.bf16, batch.aux.device):
        outputs = head.unroll(batch.embeds, batch.aux, batch.positions, cfg.unroll_steps)
    column = torch.arange(batch.mask.shape[1], device=batch.mask.device)
    sampled = column % cfg.cls_stride == offset
    total, weights, top1 = 0.0, 0.0, 0.0
    for step, out in enumerate(outputs):
        chosen = started_at(batch.mask, step) & sampled & (batch.labels >= 0)
        weight = cfg.unroll_decay**step
        weights += weight
        if not chosen.any():
            continue
        with autocast(cfg.bf16, batch.aux.device):
            logits = head.logits(out[chosen]).float()
        labels = batch.labels[chosen]
        total = total + weight * F.cross_entropy(logits, labels)
        if step == 0:
            top1 = float((logits.argmax(-1) == labels).float().mean())
    return total / weights, top1


@torch.no_grad()
def evaluate(
    head: Eagle3Head, rows: DistilledRows, embed, draft_ids, draft_of, cfg: Eagle3LoopConfig,
    device,
) -> dict:  # fmt: skip
    """Top-1 of step 0 over every answer pair (a label outside D counts as a miss), and
    ``chainN_acceptance``: tokens per verification of a greedy N-token chain draft started
    at every ``accept_stride``-th answer position (1 + guesses right before the first miss;
    exact for a chain, as the unrolled head is fed the drafted tokens while they are right).
    """
    head.eval()
    hits = pairs = accepted = starts_seen = 0.0
    draft_ids = draft_ids.to(device)
    for start in range(0, len(rows.input_ids), cfg.batch_rows):
        batch = batch_inputs(rows.select(slice(start, start + cfg.batch_rows)), embed, draft_of,
                             device)  # fmt: skip
        with autocast(cfg.bf16, device):
            outputs = head.unroll(batch.embeds, batch.aux, batch.positions, cfg.accept_steps)
            guesses = [draft_ids[head.logits(out).float().argmax(-1)] for out in outputs]
        right = [guess == batch.tokens for guess in guesses]
        hits += float((right[0] & batch.mask).sum())
        pairs += float(batch.mask.sum())
        starts = batch.mask.nonzero()
        starts = starts[starts[:, 1] % cfg.accept_stride == 0]
        alive = torch.ones(len(starts), dtype=torch.bool, device=device)
        for step, hit in enumerate(right):
            row, col = starts[:, 0], starts[:, 1] + step
            inside = col < batch.mask.shape[1]
            col = col.clamp(max=batch.mask.shape[1] - 1)
            alive &= inside & batch.mask[row, col] & hit[row, col]
            accepted += float(alive.sum())
        starts_seen += len(starts)
    head.train()
    return {
        "top1": hits / max(pairs, 1.0),
        f"chain{cfg.accept_steps}_acceptance": 1.0 + accepted / max(starts_seen, 1.0),
    }


@dataclass
class Eagle3LoopResult:
    train_loss: list[float]
    evals: list[dict]  # {"step", "train_tokens", "top1", "chainN_acceptance"}
    seconds: float
    tokens_per_second: float


def _save(path: Path, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)  # a run killed mid-write keeps the previous checkpoint


def train(
    head: Eagle3Head,
    train_rows: DistilledRows,
    val_rows: DistilledRows,
    embed: torch.Tensor,
    draft_ids: torch.Tensor,
    cfg: Eagle3LoopConfig,
    device: torch.device,
    generator: torch.Generator,
    checkpoint: Path | None = None,
    fingerprint: str = "",
) -> Eagle3LoopResult:
    """Train ``head`` in place. With ``checkpoint``, a file there with the same
    ``fingerprint`` (the recipe and data) is resumed from, and the state is written back
    every ``checkpoint_every`` steps and at each evaluation."""
    vocab_size = embed.shape[0]
    draft_of = torch.full((vocab_size,), -1, dtype=torch.long)
    draft_of[draft_ids] = torch.arange(len(draft_ids))
    trainable = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    count = len(train_rows.input_ids)

    def run_eval(step: int, tokens: int) -> dict:
        scores = evaluate(head, val_rows, embed, draft_ids, draft_of, cfg, device)
        return {"step": step, "train_tokens": tokens, **scores}

    state = None
    if checkpoint is not None and checkpoint.is_file():
        state = torch.load(checkpoint, map_location="cpu", weights_only=False)
        if state.get("fingerprint") != fingerprint:
            state = None  # another recipe or other data: start over
    if state is not None:
        head.load_state_dict(state["head"])
        optimizer.load_state_dict(state["optimizer"])
        generator.set_state(state["generator"])
        first_step, order, cursor = state["step"], state["order"], state["cursor"]
        losses, evals, trained = state["losses"], state["evals"], state["trained_tokens"]
        seconds_before = state["seconds"]
    else:
        first_step, cursor, trained, seconds_before = 0, 0, 0, 0.0
        order = torch.randperm(count, generator=generator)
        losses, evals = [], [run_eval(0, 0)]

    def save(step: int) -> None:
        if checkpoint is None:
            return
        _save(checkpoint, {
            "fingerprint": fingerprint, "head": head.state_dict(),
            "optimizer": optimizer.state_dict(), "generator": generator.get_state(),
            "step": step, "order": order, "cursor": cursor, "losses": losses,
            "evals": evals, "trained_tokens": trained,
            "seconds": seconds_before + time.monotonic() - started,
        })  # fmt: skip

    started = time.monotonic()
    bar = tqdm(range(first_step, cfg.steps), desc="train-eagle3", unit="step",
               initial=first_step, total=cfg.steps)  # fmt: skip
    for step in bar:
        if cursor + cfg.batch_rows > len(order):  # next epoch, reshuffled
            order, cursor = torch.randperm(count, generator=generator), 0
        picked = order[cursor : cursor + cfg.batch_rows]
        cursor += cfg.batch_rows
        for group in optimizer.param_groups:
            group["lr"] = cosine_lr(step, cfg.steps, cfg.lr, cfg.warmup_steps)
        batch = batch_inputs(train_rows.select(picked), embed, draft_of, device)
        trained += int(batch.mask.sum())
        loss, top1 = unrolled_loss(head, batch, cfg, step % cfg.cls_stride)
        if not isinstance(loss, torch.Tensor):  # no label in D at this offset: nothing to learn
            continue
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"loss is {loss} at step {step}")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, cfg.grad_clip)
        optimizer.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{loss.item():.3f}", top1=f"{top1:.2f}")
        done = step + 1
        if cfg.eval_every and done % cfg.eval_every == 0 and done < cfg.steps:
            evals.append(run_eval(done, trained))
            save(done)
        elif cfg.checkpoint_every and done % cfg.checkpoint_every == 0:
            save(done)
    if not evals or evals[-1]["step"] != cfg.steps:
        evals.append(run_eval(cfg.steps, trained))
    save(cfg.steps)
    seconds = seconds_before + time.monotonic() - started
    return Eagle3LoopResult(losses, evals, seconds, trained / max(seconds, 1e-9))
