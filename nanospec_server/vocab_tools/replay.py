"""Offline replay of the candidate stream over the target's greedy outputs (no server).

Given a prompt, the target's greedy continuation and the target's top-k predictions at
every position, the stream is rebuilt as the serving path builds it (docs/design.md):
prefill appends the prompt tokens and then the top-K_pre predictions per prompt position;
each step emits ``step_tokens`` tokens (a fixed acceptance length), checks them against
the active vocabulary first (coverage: the share of emitted tokens the draft could have
proposed), then appends the step's accepted path and the top-K_ver predictions for the
emitted positions. Offline there is no draft, so rejected tree branches are not appended.

The window itself is `nanospec_server.vocab.DynamicVocab` on CPU, the serving code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nanospec_server.vocab import DynamicVocab, topk_tokens_in_chunks


@dataclass
class Sequence:
    prompt: list[int]
    output: list[int]
    # top[p] = the target's top-k predictions for position p + 1 of prompt + output
    top: torch.Tensor  # [len(prompt) + len(output) - 1, k] int64
    task: str = ""


@dataclass
class ReplayStats:
    emitted: int = 0
    covered: int = 0
    active_sum: int = 0
    steps: int = 0
    sizes: list[int] | None = None  # |I| per step (with trace=True)
    turnover: list[int] | None = None  # tokens that entered or left I at each step

    @property
    def coverage(self) -> float | None:
        return self.covered / self.emitted if self.emitted else None

    @property
    def mean_active(self) -> float | None:
        return self.active_sum / self.steps if self.steps else None

    def add(self, other: ReplayStats) -> None:
        self.emitted += other.emitted
        self.covered += other.covered
        self.active_sum += other.active_sum
        self.steps += other.steps


def replay(
    seq: Sequence,
    vocab_size: int,
    w_max: int,
    k_pre: int = 3,
    k_ver: int = 3,
    step_tokens: int = 1,
    use_prompt: bool = True,
    append_decoding: bool = True,
    always_active: tuple[int, ...] = (),
    trace: bool = False,
) -> ReplayStats:
    """One sequence through a fresh window. ``use_prompt=False`` is the ext-only ablation,
    ``append_decoding=False`` ctx-only."""
    vocab = DynamicVocab(torch.zeros(vocab_size, 1), num_slots=2, w_cap=w_max, w_max=w_max,
                         always_active=always_active, max_batch=1)  # fmt: skip
    slot = torch.tensor([1])
    n = len(seq.prompt)

    def append(tokens: list[int]) -> None:
        if tokens:
            vocab.append(slot, torch.tensor([tokens]))

    if use_prompt:
        append(seq.prompt)
        append(seq.top[:n, :k_pre].flatten().tolist() if k_pre else [])
    vocab.refresh(slot)
    stats = ReplayStats(sizes=[] if trace else None, turnover=[] if trace else None)
    members = _members(vocab) if trace else None
    for start in range(0, len(seq.output), step_tokens):
        emitted = seq.output[start : start + step_tokens]
        found = vocab.contains(slot, torch.tensor([emitted]))[0]
        stats.emitted += len(emitted)
        stats.covered += int(found.sum())
        stats.active_sum += int(vocab.active_size(slot)[0])
        stats.steps += 1
        if append_decoding:
            # Predictions for the emitted positions come from the positions before them.
            top = seq.top[n - 1 + start : n - 1 + start + len(emitted), :k_ver]
            append(emitted + (top.flatten().tolist() if k_ver else []))
            vocab.refresh(slot)
        if trace:
            now = _members(vocab)
            stats.sizes.append(int(vocab.active_size(slot)[0]))
            stats.turnover.append(len(now ^ members))
            members = now
    return stats


def _members(vocab: DynamicVocab) -> set[int]:
    row = vocab.window.members[1, : vocab.w_cap]
    return set(row[row >= 0].tolist())


def static_coverage(sequences: list[Sequence], ranked_ids: list[int], k: int) -> float | None:
    """Share of output tokens among the first ``k`` of a frequency-ranked token list."""
    kept = set(ranked_ids[:k])
    total = sum(len(s.output) for s in sequences)
    return sum(t in kept for s in sequences for t in s.output) / total if total else None


def target_topk(model, ids: list[int], k: int) -> torch.Tensor:
    """Top-k predictions at every position but the last: [len(ids) - 1, k]."""
    with torch.no_grad():
        hidden = model.model(torch.tensor([ids])).last_hidden_state[0, :-1]
    return topk_tokens_in_chunks(hidden, model.lm_head.weight, k)
