"""The hybrid prior's size k by the trimming method (`nanospec vocab prior-k`).

The same utility as `vocab_tools/trim.py`, U(k) = alpha * C(k) + (1 - alpha) * R(k) with
C(k) >= c_min, searched by the same TPE, but each term is what serving does:

- C(k): the share of the target's next tokens that window ∪ prior holds, replayed
  offline through the serving window (`vocab_tools/replay.py`) over the target's own answers
  with its top-K predictions (the candidate stream as the runtime appends it).
- R(k): 1 - L(k) / L(V), where L is the backbone's measured time (`bench latency`) plus
  the LM head's time measured here at the rows actually computed: the mean |I ∪ P| of
  the replay, not k.

The streams `NANOSPEC_RECORD_STREAMS` records (`sglang_plugin/stats/stream_recorder.py`) hold
what was appended (draft tree, verify top-K) but not which tree tokens the target took,
so the target's next token cannot be read back from them; the replay rebuilds the same
stream from the target's outputs, where the next token is known.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from nanospec_server.vocab_tools.replay import ReplayStats, Sequence, replay
from nanospec_server.vocab_tools.timing import head_topk, median_ms
from nanospec_server.vocab_tools.trim import DEFAULT_ALPHA, Search, tpe_maximise, utility

ROW_QUANTUM = 64  # head times are measured per 64 rows: nearby sizes cost the same


def union_replay(
    sequences: list[Sequence], vocab_size: int, w_max: int, pinned: list[int], step_tokens: int
) -> ReplayStats:
    total = ReplayStats()
    for seq in sequences:
        total.add(replay(seq, vocab_size, w_max, step_tokens=step_tokens,
                         always_active=tuple(dict.fromkeys(pinned))))  # fmt: skip
    return total


@dataclass
class HeadTimer:
    """The LM head's median ms (logits, softmax, top-8) over its first ``rows`` rows."""

    weight: torch.Tensor
    repeats: int = 7
    measured: dict[int, float] = field(default_factory=dict)

    def __call__(self, rows: float) -> float:
        size = min(self.weight.shape[0], max(ROW_QUANTUM, round(rows / ROW_QUANTUM) * ROW_QUANTUM))
        if size not in self.measured:
            hidden = torch.randn(1, self.weight.shape[1], dtype=self.weight.dtype)
            block = self.weight[:size].contiguous()
            with torch.no_grad():
                head_topk(hidden, block)  # warm
                self.measured[size] = median_ms(lambda: head_topk(hidden, block), self.repeats)
        return self.measured[size]


@dataclass
class PriorProblem:
    sequences: list[Sequence]
    ranked_prior: list[int]  # vocab_tools/prior.ranked_tokens
    eos: list[int]
    vocab_size: int
    backbone_ms: float
    head_ms: Callable[[float], float]
    w_max: int = 3072
    step_tokens: int = 3
    alpha: float = DEFAULT_ALPHA
    min_coverage: float = 0.0
    rows: dict[int, dict] = field(default_factory=dict)

    def evaluate(self, k: int) -> dict:
        if k not in self.rows:
            stats = union_replay(self.sequences, self.vocab_size, self.w_max,
                                 self.eos + self.ranked_prior[:k], self.step_tokens)  # fmt: skip
            full = self.backbone_ms + self.head_ms(self.vocab_size)
            ms = self.backbone_ms + self.head_ms(stats.mean_active)
            saved = 1.0 - ms / full
            self.rows[k] = {"k": k, "coverage": stats.coverage, "mean_rows": stats.mean_active,
                            "step_ms": ms, "latency_saved": saved,
                            "utility": utility(stats.coverage, saved, self.alpha)}  # fmt: skip
        return self.rows[k]

    def search(self, high: int, trials: int, seed: int, start: list[int]) -> Search:
        result = tpe_maximise(lambda k: self.evaluate(k)["utility"],
                              lambda k: self.evaluate(k)["coverage"] >= self.min_coverage,
                              1, high, trials, seed, start=start)  # fmt: skip
        window_only = self.evaluate(0)  # k = 0 lies off the log scale: compared directly
        best = self.evaluate(result.best_k) if result.best_k is not None else None
        if window_only["coverage"] >= self.min_coverage and (
            best is None or window_only["utility"] > best["utility"]
        ):
            result.best_k = 0
        return result
