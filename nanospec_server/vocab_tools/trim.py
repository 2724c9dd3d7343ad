"""Coverage-latency vocabulary trimming (Ben Shoham, 2026, arXiv 2603.05210).

A static draft vocabulary of the k most frequent answer tokens is chosen by

    k* = argmax_k U(k) = alpha * C(k) + (1 - alpha) * R(k)   subject to C(k) >= c_min,

where C(k) is the share of assistant-response tokens among the top k, and R(k) = 1 -
L(k) / L(V) the draft's latency saved against the full vocabulary V. L comes from the
draft's FLOPs per speculative round (backbone plus the LM head's k rows, for every token
the draft tree runs), optionally through a linear fit to times measured on this host
(`calibrate`). The search is optuna's Tree-structured Parzen Estimator, as in the paper.

Pure functions only: counting, curves, FLOPs and the optimiser; `trim_cli.py` reads files.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

DEFAULT_ALPHA = 0.5  # the paper's default coverage weight


# -- coverage -------------------------------------------------------------------------


@dataclass(frozen=True)
class CoverageCurve:
    """C(k) for every k: the ranked token ids and the answer tokens their prefixes cover."""

    ranked: list[int]  # always-kept ids first, then by count (ties by id)
    cumulative: np.ndarray  # cumulative[k] = answer tokens among ranked[:k]; [len(ranked) + 1]
    total: int  # answer tokens counted
    vocab_size: int | None = None  # the whole vocabulary covers everything

    def coverage(self, k: int) -> float:
        if self.vocab_size is not None and k >= self.vocab_size:
            return 1.0
        return float(self.cumulative[min(max(k, 0), len(self.ranked))]) / self.total


def coverage_curve(
    counts: Counter[int],
    always: Iterable[int] = (),
    evaluated: Counter[int] | None = None,
    vocab_size: int | None = None,
) -> CoverageCurve:
    """Tokens ranked by ``counts``; coverage counted over ``evaluated`` (default: the same
    tokens, in-sample as in the paper; held-out answers give an unbiased estimate)."""
    evaluated = counts if evaluated is None else evaluated
    total = sum(evaluated.values())
    if total == 0:
        raise ValueError("the corpus holds no answer tokens")
    kept = list(dict.fromkeys(always))
    pinned = set(kept)
    kept += sorted((t for t in counts if t not in pinned), key=lambda t: (-counts[t], t))
    cumulative = np.concatenate([[0], np.cumsum([evaluated.get(t, 0) for t in kept])])
    return CoverageCurve(kept, cumulative, total, vocab_size)


@dataclass(frozen=True)
class HeldOutCoverage:
    """C(k) by cross-fitting: for each fold, tokens ranked on the other folds' answers and
    counted on its own; the mean over folds. ``ranked`` (what a map keeps) uses all answers.

    In-sample, the top k of a small corpus covers it wholly as soon as k reaches the
    corpus's distinct tokens, which says nothing about the next answer."""

    ranked: list[int]
    folds: list[CoverageCurve]

    def coverage(self, k: int) -> float:
        return sum(f.coverage(k) for f in self.folds) / len(self.folds)


def held_out_coverage(
    per_answer: list[Counter[int]], folds: int, always: Iterable[int], vocab_size: int
) -> HeldOutCoverage:
    if len(per_answer) < folds:
        raise ValueError(f"{len(per_answer)} answers cannot make {folds} folds")
    parts = [sum(per_answer[f::folds], Counter()) for f in range(folds)]
    everything = sum(parts, Counter())
    curves = [coverage_curve(everything - part, always, part, vocab_size) for part in parts]
    return HeldOutCoverage(coverage_curve(everything, always).ranked, curves)


def count_tokens(tokenizer, answers: Iterable[str]) -> Counter[int]:
    counts: Counter[int] = Counter()
    for text in answers:
        counts.update(tokenizer.encode(text, add_special_tokens=False))
    return counts


# -- latency --------------------------------------------------------------------------


@dataclass(frozen=True)
class DraftShape:
    """What a draft step's FLOPs depend on (a Hugging Face decoder config)."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab_size: int
    eagle: bool  # an EAGLE head: an fc mixes [token embedding, target hidden] first

    @classmethod
    def from_config(cls, config: dict, vocab_size: int | None = None) -> DraftShape:
        heads = config["num_attention_heads"]
        architectures = " ".join(config.get("architectures") or [])
        return cls(
            hidden=config["hidden_size"],
            intermediate=config["intermediate_size"],
            layers=config["num_hidden_layers"],
            heads=heads,
            kv_heads=config.get("num_key_value_heads") or heads,
            head_dim=config.get("head_dim") or config["hidden_size"] // heads,
            vocab_size=vocab_size or config["vocab_size"],
            eagle="eagle" in architectures.lower(),
        )


@dataclass(frozen=True)
class TreeShape:
    """SGLang's draft tree: ``steps`` draft forwards per round, ``topk`` branches each."""

    steps: int = 4
    topk: int = 1

    @property
    def draft_tokens(self) -> int:
        # The first forward extends one position; each later one runs every branch.
        return 1 + (self.steps - 1) * self.topk


def backbone_flops(shape: DraftShape, context: int) -> float:
    """Multiply-adds x 2 for one token through the draft's layers at a KV context."""
    d, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    projections = d * q + 2 * d * kv + q * d
    mlp = 3 * d * shape.intermediate  # gate, up, down (SwiGLU)
    attention = 2 * context * q  # scores and the weighted sum
    fc = 2 * d * d if shape.eagle else 0
    return 2.0 * (shape.layers * (projections + mlp + attention) + fc)


def head_flops(shape: DraftShape, rows: int) -> float:
    return 2.0 * shape.hidden * rows


def round_flops(shape: DraftShape, tree: TreeShape, rows: int, context: int) -> float:
    """One speculative round of the draft: every tree token through backbone and head."""
    return tree.draft_tokens * (backbone_flops(shape, context) + head_flops(shape, rows))


@dataclass(frozen=True)
class LatencyModel:
    """ms = ms_per_forward * forwards + ms_per_gflop * GFLOPs. The default (no fixed cost,
    one ms per GFLOP) is the paper's: latency proportional to FLOPs."""

    ms_per_gflop: float = 1.0
    ms_per_forward: float = 0.0

    def round_ms(self, shape: DraftShape, tree: TreeShape, rows: int, context: int) -> float:
        flops = round_flops(shape, tree, rows, context)
        return self.ms_per_forward * tree.steps + self.ms_per_gflop * flops / 1e9


@dataclass(frozen=True)
class Calibration:
    model: LatencyModel
    points: list[dict]  # {"what", "gflops", "ms", "predicted_ms"} per measured part
    r2: float
    max_relative_error: float


def calibrate(points: list[tuple[str, float, float]]) -> Calibration:
    """Least squares of measured ms on (1, GFLOPs) over one-forward parts of a draft step:
    (label, GFLOPs of that forward, measured ms)."""
    gflops = np.array([p[1] for p in points])
    ms = np.array([p[2] for p in points])
    design = np.stack([np.ones_like(gflops), gflops], axis=1)
    (per_forward, per_gflop), *_ = np.linalg.lstsq(design, ms, rcond=None)
    predicted = design @ np.array([per_forward, per_gflop])
    residual = float(((ms - predicted) ** 2).sum())
    spread = float(((ms - ms.mean()) ** 2).sum())
    rows = [{"what": w, "gflops": g, "ms": m, "predicted_ms": float(p)}
            for (w, g, m), p in zip(points, predicted, strict=True)]  # fmt: skip
    return Calibration(
        LatencyModel(float(per_gflop), float(per_forward)),
        rows,
        r2=1.0 - residual / spread if spread else 1.0,
        max_relative_error=float(np.max(np.abs(predicted - ms) / ms)),
    )


# -- utility and the optimiser --------------------------------------------------------


def utility(coverage: float, latency_saved: float, alpha: float = DEFAULT_ALPHA) -> float:
    return alpha * coverage + (1.0 - alpha) * latency_saved


@dataclass
class Search:
    best_k: int | None  # None: no size met the constraint
    trials: list[dict] = field(default_factory=list)  # {"k", "utility", "feasible"}


def tpe_maximise(
    objective: Callable[[int], float],
    feasible: Callable[[int], bool],
    low: int,
    high: int,
    trials: int = 60,
    seed: int = 0,
    start: Iterable[int] = (),
) -> Search:
    """The integer k in [low, high] (log scale) with the largest ``objective`` among those
    ``feasible``, by optuna's TPE, which is told the constraint and samples away from it. ``start``
    sizes are evaluated first (e.g. a current default, so it is always compared)."""
    # deferred: imports optuna only when called
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed))
    for k in dict.fromkeys(start):
        study.enqueue_trial({"k": min(max(k, low), high)})
    seen: dict[int, tuple[float, bool]] = {}

    def run(trial) -> float:
        k = trial.suggest_int("k", low, high, log=True)
        if k not in seen:
            seen[k] = (objective(k), feasible(k))
        value, ok = seen[k]
        trial.set_constraint("coverage", 0.0 if ok else 1.0)  # > 0: infeasible, for TPE
        return value

    study.optimize(run, n_trials=trials)
    ok = [(value, -k, k) for k, (value, is_ok) in seen.items() if is_ok]
    best = max(ok)[2] if ok else None  # ties: the smaller vocabulary
    log = [{"k": t.params["k"], "utility": t.value, "feasible": seen[t.params["k"]][1]}
           for t in study.trials]  # fmt: skip
    return Search(best, log)


@dataclass(frozen=True)
class TrimProblem:
    """Everything `trim` needs: the coverage curve and the draft's latency model."""

    curve: CoverageCurve | HeldOutCoverage
    shape: DraftShape
    tree: TreeShape = TreeShape()
    context: int = 512
    latency: LatencyModel = LatencyModel()
    alpha: float = DEFAULT_ALPHA
    min_coverage: float = 0.0

    def latency_saved(self, k: int) -> float:
        full = self.latency.round_ms(self.shape, self.tree, self.shape.vocab_size, self.context)
        return 1.0 - self.latency.round_ms(self.shape, self.tree, k, self.context) / full

    def utility(self, k: int) -> float:
        return utility(self.curve.coverage(k), self.latency_saved(k), self.alpha)

    def feasible(self, k: int) -> bool:
        return self.curve.coverage(k) >= self.min_coverage

    def row(self, k: int) -> dict:
        return {"k": k, "coverage": self.curve.coverage(k), "latency_saved": self.latency_saved(k),
                "utility": self.utility(k), "feasible": self.feasible(k)}  # fmt: skip


def trim(problem: TrimProblem, trials: int = 60, seed: int = 0, low: int = 64) -> Search:
    """TPE over k in [low, V]; the full vocabulary is always a candidate."""
    high = problem.shape.vocab_size
    return tpe_maximise(problem.utility, problem.feasible, min(low, high), high, trials, seed,
                        start=[high])  # fmt: skip


def exhaustive_best(problem: TrimProblem, points: int = 2000, low: int = 64) -> int | None:
    """The same optimum by brute force on a log grid: a check on the TPE result only."""
    high = problem.shape.vocab_size
    grid = sorted({round(math.exp(x)) for x in np.linspace(math.log(low), math.log(high), points)})
    ok = [(problem.utility(k), -k, k) for k in grid if problem.feasible(k)]
    return max(ok)[2] if ok else None
