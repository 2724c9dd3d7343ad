"""How deep to draft this step: the depth that maximises goodput under a per-host cost model.

The rule is SmartSpec's (Liu et al., "Optimizing Speculative Decoding for Serving LLMs
Using Goodput", 2024): for a batch of ``b`` requests, pick the draft depth ``k`` (0 turns
drafting off for the step) that maximises the expected tokens emitted per second,

    goodput(b, k) = b * E[tokens | k] / T(b, k),

where ``E[tokens | k] = 1 + p + ... + p^k`` for a per-position acceptance rate ``p``
(measured, see ``AcceptanceEstimate``) and ``T(b, k)`` is the wall time of one step on
this host (``StepCostModel``, fitted from live timings). Unlike a fixed batch-size
threshold (SGLang's ``--speculative-adaptive`` buckets, vLLM's ``disable_by_batch_size``),
the break-even batch size moves with the measured acceptance and with the host: a draft
that is always right keeps drafting at batch sizes where a poor one stops.

No SGLang import: ``sglang_plugin/spec/adaptive.py`` wires this into SGLang's step loop.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

if TYPE_CHECKING:
    from nanospec_server.adaptive.depth_policy import StepRecord

# T(b, k) = c0 + c1*b + c2*k + c3*b*k: a fixed cost per step, a cost per request (the
# verify of its root token and the draft extend), a cost per draft step (weights read once
# per step whatever the batch) and a cost per drafted token (compute that grows with both).
FEATURES = 4


def step_features(batch_size: int, depth: int) -> np.ndarray:
    return np.array([1.0, batch_size, depth, batch_size * depth])


@dataclass
class StepCostModel:
    """Least squares over the most recent ``window`` timed steps (a host's speed drifts
    with its load, so old timings age out), fitted to the median time of each (batch size,
    depth) seen: on a shared host single steps stall for whole scheduler slices, and a
    median shrugs those off where a mean would chase them.

    Ready once two depths are timed ``min_samples`` times each: the policy times the cheap
    depth (0) and the deep one that often, each after its warm-up step, and probes keep
    refining them. With the deep depth timed once, one stalled timing (10x) tilted the
    line until every drafting depth looked slow, and nothing retimed it (probes visit
    neighbours): the default pair stayed at depth 0 at concurrency 1 for hundreds of
    steps. The median of three shrugs off one stall, for two more deep steps in a
    server's life. While one batch size is all it has seen, the minimum-norm solution
    still predicts exactly there and spreads its guess for other sizes over the per-step
    and per-request terms."""

    window: int = 256
    min_samples: int = 3
    samples: deque = field(default_factory=deque)
    warmed: set = field(default_factory=set)  # depths whose first step has run
    _coef: np.ndarray | None = None

    def observe(self, batch_size: int, depth: int, seconds: float) -> None:
        """The first step at each depth is a warm-up, not a timing: it pays one-time costs
        (first kernel calls, allocations; seconds for a bf16 draft on a CPU), and a
        single such timing of the deep depth kept a fresh server at depth 0 for hundreds
        of steps, its probes climbing one depth at a time."""
        if depth not in self.warmed:
            self.warmed.add(depth)
            return
        self.samples.append((batch_size, depth, seconds))
        while len(self.samples) > self.window:
            self.samples.popleft()
        self._coef = None

    def timings_per_depth(self) -> dict[int, int]:
        counts: dict[int, int] = {}
        for _, k, _ in self.samples:
            counts[k] = counts.get(k, 0) + 1
        return counts

    def largest_batch_timed(self, depth: int) -> int:
        """The largest batch size with a timing at this depth (0 if none)."""
        return max((b for b, k, _ in self.samples if k == depth), default=0)

    @property
    def ready(self) -> bool:
        counts = self.timings_per_depth()
        return sum(1 for n in counts.values() if n >= self.min_samples) >= 2

    def coefficients(self) -> np.ndarray:
        if self._coef is None:
            cells: dict[tuple[int, int], list[float]] = {}
            for b, k, t in self.samples:
                cells.setdefault((b, k), []).append(t)
            x = np.stack([step_features(b, k) for b, k in cells])
            y = np.array([float(np.median(times)) for times in cells.values()])
            self._coef = np.linalg.lstsq(x, y, rcond=None)[0]
        return self._coef

    def predict(self, batch_size: int, depth: int) -> float:
        """Seconds for one step; never below a microsecond (a fit on noisy timings can
        extrapolate below zero far from the data)."""
        return max(float(step_features(batch_size, depth) @ self.coefficients()), 1e-6)


@dataclass
class AcceptanceEstimate:
    """Per-position acceptance ``p`` of the draft, with exponential forgetting.

    A request that drafted ``k`` tokens and had ``a`` accepted made ``a`` successes and,
    if ``a < k``, one failure: the maximum-likelihood ``p`` of a geometric acceptance
    truncated at ``k`` is successes / (successes + failures), whatever the ``k`` of each
    step. For a top-k > 1 tree it is the tree's effective per-depth rate. Starts at the
    prior (1 success in 2 trials: p = 0.5)."""

    decay: float = 0.98  # per observed step
    successes: float = 1.0
    trials: float = 2.0

    def observe(self, accepted: list[int], depth: int) -> None:
        if depth <= 0 or not accepted:
            return  # nothing was drafted: no evidence about the draft
        failures = sum(1 for a in accepted if a < depth)
        self.successes = self.decay * self.successes + sum(accepted)
        self.trials = self.decay * self.trials + sum(accepted) + failures

    @property
    def rate(self) -> float:
        return self.successes / self.trials

    def expected_tokens(self, depth: int) -> float:
        """Tokens a request emits in one step at this depth (the bonus token included)."""
        p = self.rate
        return sum(p**i for i in range(depth + 1))


@dataclass(frozen=True)
class Decision:
    depth: int
    reason: str  # "pinned", "fixed", "explore", "probe", "goodput" or "hold"
    goodput: dict[int, float]  # predicted tokens/s per candidate depth (empty if unknown)


@dataclass
class GoodputPolicy:
    """Chooses each step's depth among ``candidates`` (sorted, 0 = plain decoding).

    - Until the cost model is ready it explores: the shallowest candidate (plain decoding
      at 0, what a busy server wants anyway) ``min_samples`` times, then the deepest as
      often, each after its warm-up step. A fresh server thus spends ``min_samples`` + 1
      expensive steps on the full depth, not as many per depth; the linear model spans the
      depths between, probes refine them.
    - Then it takes the depth of highest predicted goodput, switching away from the
      current one only for a gain of ``min_gain`` (noise would otherwise flap it).
    - Every ``probe_every`` steps it runs one step at a neighbouring depth, so the cost
      model and, from depth 0, the acceptance estimate stay current.
    - A batch larger than any timed at depth 0 runs at depth 0 first (a probe): the cheap
      step that a growing load most likely wants, and the timing that tells the fit how
      a request's cost grows without drafts.
    - Off (``enabled`` False), it drafts at the deepest candidate: the fixed behaviour.
    """

    name: ClassVar[str] = "goodput"
    candidates: list[int]
    min_gain: float = 0.03
    probe_every: int = 32
    enabled: bool = True
    cost: StepCostModel = field(default_factory=StepCostModel)
    acceptance: AcceptanceEstimate = field(default_factory=AcceptanceEstimate)
    pinned: int | None = None  # a depth every step runs at (a live setting), if any
    steps: int = 0
    settled: int | None = None  # the last depth chosen on goodput (probes aside)
    _probe_up: bool = True

    def __post_init__(self) -> None:
        if not self.candidates or any(k < 0 for k in self.candidates):
            raise ValueError(f"candidate depths must be non-negative, got {self.candidates}")
        self.candidates = sorted(set(self.candidates))

    @property
    def deepest(self) -> int:
        return self.candidates[-1]

    def goodput(self, batch_size: int, depth: int) -> float:
        """Predicted tokens per second of a step at this depth (cost model ready)."""
        tokens = batch_size * self.acceptance.expected_tokens(depth)
        return tokens / self.cost.predict(batch_size, depth)

    def choose(self, batch_size: int) -> Decision:
        self.steps += 1
        if fixed := self._fixed():
            return fixed
        if not self.cost.ready:
            return Decision(self._explore_depth(), "explore", {})
        predicted = {k: self.goodput(batch_size, k) for k in self.candidates}
        shallowest = self.candidates[0]
        if batch_size > self.cost.largest_batch_timed(shallowest):
            # The fit cannot split a per-request cost between depths it has timed at
            # smaller batches only: time the cheap depth at this size before trusting it.
            return Decision(shallowest, "probe", predicted)
        best = _argmax(predicted)
        held = self.settled
        if held is None or predicted[best] > predicted[held] * (1 + self.min_gain):
            chosen, reason = best, "goodput"
        else:
            chosen, reason = held, "hold"
        self.settled = chosen
        if self.steps % self.probe_every == 0:
            return Decision(self._neighbour(chosen), "probe", predicted)
        return Decision(chosen, reason, predicted)

    def predicted_best(self, batch_size: int) -> int | None:
        """The depth a fresh decision would take at this batch size (no hysteresis, no
        probe, no state changed): the pinned or fixed depth, else the highest predicted
        goodput; None while the cost model is not ready."""
        if fixed := self._fixed():
            return fixed.depth
        if not self.cost.ready:
            return None
        return _argmax({k: self.goodput(batch_size, k) for k in self.candidates})

    def observe_step(self, record: StepRecord) -> None:
        if record.seconds is not None:
            self.cost.observe(record.batch_size, record.depth, record.seconds)

    def observe_acceptance(self, accepted: list[int], depth: int) -> None:
        self.acceptance.observe(accepted, depth)

    def published(self) -> dict[str, Any]:
        ready = self.cost.ready
        return {
            "pinned_depth": self.pinned,
            "acceptance_rate": self.acceptance.rate,
            "cost_model_ready": ready,
            "cost_model_ms": [round(1000 * float(c), 4) for c in self.cost.coefficients()]
            if ready
            else None,
        }

    def _fixed(self) -> Decision | None:
        """The decision that needs no prediction: the pinned depth, or the deepest while
        the policy is off (or has one candidate)."""
        if self.pinned is not None:
            return Decision(self.pinned, "pinned", {})
        if not self.enabled or len(self.candidates) == 1:
            return Decision(self.deepest, "fixed", {})
        return None

    def _explore_depth(self) -> int:
        """The shallowest depth until it has ``min_samples`` timings, then the deepest."""
        shallowest = self.candidates[0]
        if self.cost.timings_per_depth().get(shallowest, 0) < self.cost.min_samples:
            return shallowest
        return self.deepest

    def _neighbour(self, depth: int) -> int:
        """The next candidate up or down (alternating; up from 0, down from the deepest)."""
        index = self.candidates.index(depth)
        go_up = index == 0 or (self._probe_up and index < len(self.candidates) - 1)
        self._probe_up = not self._probe_up
        return self.candidates[index + 1 if go_up else index - 1]


def _argmax(predicted: dict[int, float]) -> int:
    """The depth of highest predicted goodput, the shallower on a tie."""
    return max(predicted, key=lambda k: (predicted[k], -k))
