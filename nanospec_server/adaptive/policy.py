"""How deep to draft this step: the depth that maximises goodput under a per-host cost model.

The rule is SmartSpec's (Liu et al., "Optimizing Speculative Decoding for Serving LLMs
Using Goodput", 2024): for a batch of ``b`` requests, pick the draft depth ``k`` (0 turns
drafting off for the step) that maximises the expected tokens emitted per second,

    goodput(b, k) = sum over the batch's requests of E[tokens | k, p_i] / T(b, k),

where ``E[tokens | k, p] = 1 + p + ... + p^k`` for a per-position acceptance rate ``p``
(measured per request, see ``RequestAcceptance``) and ``T(b, k)`` is the wall time of one step on
this host (``StepCostModel``, fitted from live timings). Unlike a fixed batch-size
threshold (SGLang's ``--speculative-adaptive`` buckets, vLLM's ``disable_by_batch_size``),
the break-even batch size moves with the measured acceptance and with the host: a draft
that is always right keeps drafting at batch sizes where a poor one stops.

No SGLang import: ``sglang_plugin/spec/adaptive.py`` wires this into SGLang's step loop.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

if TYPE_CHECKING:
    from nanospec_server.adaptive.depth_policy import CatchUpDebt, StepRecord

# T(b, k) = c0 + c1*b + c2*k + c3*b*k: a fixed cost per step, a cost per request (the
# verify of its root token and the draft extend), a cost per draft step (weights read once
# per step whatever the batch) and a cost per drafted token (compute that grows with both).
FEATURES = 4

# The cells a timed step falls in: a speculative step (verify, draft extend, at any depth),
# a depth-0 step on SGLang's plain decode path, and a plain step that also ran the draft's
# extend over the tokens it missed before a drafting step (its own token at least: a catch-up),
# timed apart so that neither inflates the other.
# They are named as the paths a step takes (`depth_policy.py`).
VERIFY_CELL, PLAIN_CELL, CATCH_UP_CELL = "verify", "plain", "plain-catch-up"
PRICED_CATCH_UP = 32  # positions a catch-up step runs, at least, to price one position
BRACKET_SPAN = 2  # timed batch sizes at most this far apart price the sizes between them


def step_features(batch_size: int, depth: int) -> np.ndarray:
    return np.array([1.0, batch_size, depth, batch_size * depth])


def plain_features(batch_size: int) -> np.ndarray:
    return np.array([1.0, batch_size])


@dataclass
class StepCostModel:
    """Least squares over the median time of each (batch size, depth, path) timed, each
    over its most recent ``window`` timings: a host's speed drifts with its load, so old
    timings age out, but only behind newer ones of the same batch size, depth and path. A
    depth the policy visits rarely (a drafting depth probed every 512 steps under a steady
    load at depth 0) keeps its timings however many steps run at another (losing them
    would send the model back to exploring: a catch-up and deep steps at a large batch),
    and a long load at large batches does not erase the small ones (a line fitted to
    large batches alone extrapolates a small batch's step far off). On a
    shared host single steps stall for whole scheduler slices; a median shrugs those off
    where a mean would chase them.

    Speculative steps fit ``T(b, k)``; depth-0 steps on the plain decode path fit their own
    line ``T0(b) = a0 + a1*b`` (a plain step is not a verify of one token: a different
    attention path and sampler), which ``predict(b, 0)`` answers with once it has them.
    Catch-up steps are kept apart (``catch_up_ms``): a switch from depth 0 to drafting pays
    one, which the policy weighs against what drafting wins (``seconds_per_position``),
    not the per-step fit.

    Ready once two depths are timed ``min_samples`` times each: the policy times the cheap
    depth (0) and the deep one that often, each after its warm-up step, and probes keep
    refining them. With the deep depth timed once, one stalled timing (10x) tilted the
    line until every drafting depth looked slow, and nothing retimed it (probes visit
    neighbours): the default pair stayed at depth 0 at concurrency 1 for hundreds of
    steps. The median of three shrugs off one stall, for two more deep steps in a
    server's life. While one batch size is all it has seen, the minimum-norm solution
    still predicts exactly there and spreads its guess for other sizes over the per-step
    and per-request terms. The fit is cached and redone every ``refit_every`` timings."""

    window: int = 16  # timings per (batch size, depth, path)
    min_samples: int = 3
    refit_every: int = 8
    _timings: dict = field(default_factory=dict)  # (b, depth, cell) -> deque of seconds
    # (depth, cell) -> the batch sizes timed min_samples times there, sorted
    _timed_sizes: dict = field(default_factory=dict)
    catch_ups: deque = field(default_factory=lambda: deque(maxlen=32))  # (b, seconds, positions)
    draft_extends: deque = field(default_factory=lambda: deque(maxlen=32))  # (seconds, positions)
    warmed: set = field(default_factory=set)  # (depth, cell) whose first step has run
    _coef: np.ndarray | None = None
    _plain_coef: np.ndarray | None = None
    _since_fit: int = 0
    # Asked several times a step: kept until a timing changes them.
    _medians: dict = field(default_factory=dict)  # (b, depth, cell) -> median seconds
    _counts: dict[int, int] | None = None  # timings per depth

    def observe(
        self,
        batch_size: int,
        depth: int,
        seconds: float,
        cell: str = VERIFY_CELL,
        caught_up: int = 0,
    ) -> None:
        """The first step at each depth (and cell) is a warm-up, not a timing: it pays
        one-time costs (first kernel calls, allocations; seconds for a bf16 draft on a CPU),
        and a single such timing of the deep depth kept a fresh server at depth 0 for
        hundreds of steps, its probes climbing one depth at a time. ``caught_up``: the
        positions a catch-up step ran the draft over."""
        if (depth, cell) not in self.warmed:
            self.warmed.add((depth, cell))
            return
        self._add_timing((batch_size, depth, cell), seconds)
        if cell == CATCH_UP_CELL and caught_up > 0:
            self.catch_ups.append((batch_size, seconds, caught_up))
        self._since_fit += 1
        if self._since_fit >= self.refit_every:  # both fits, lazily, at their next use
            self._coef = self._plain_coef = None
            self._since_fit = 0

    def _add_timing(self, key: tuple[int, int, str], seconds: float) -> None:
        """One timing of the cell ``key`` (batch size, depth, path); its batch size counts
        as timed there once it holds ``min_samples``."""
        timings = self._timings.setdefault(key, deque(maxlen=self.window))
        timings.append(seconds)
        if len(timings) == self.min_samples:
            insort(self._timed_sizes.setdefault(key[1:], []), key[0])
        self._medians.pop(key, None)
        self._counts = None

    @property
    def samples(self) -> list[tuple[int, int, float, str]]:
        """Every timing kept: (batch size, depth, seconds, cell)."""
        return [(b, k, t, cell) for (b, k, cell), timings in self._timings.items() for t in timings]

    def timings_per_depth(self) -> dict[int, int]:
        # By cell, not by timing, and kept until the next timing: the policy asks this
        # several times a step, and a server that has seen every batch size holds
        # thousands of timings.
        if self._counts is None:
            counts: dict[int, int] = {}
            for (_, k, cell), timings in self._timings.items():
                if cell != CATCH_UP_CELL:
                    counts[k] = counts.get(k, 0) + len(timings)
            self._counts = counts
        return self._counts

    def _median(self, key: tuple[int, int, str]) -> float:
        if key not in self._medians:
            self._medians[key] = float(np.median(self._timings[key]))
        return self._medians[key]

    def timed_depths(self) -> set[int]:
        """The depths timed ``min_samples`` times: those a prediction may be trusted at."""
        return {k for k, n in self.timings_per_depth().items() if n >= self.min_samples}

    def cell_priced(self, batch_size: int, depth: int) -> bool:
        """Whether ``predict`` prices this step from timings of its own depth and path (a
        depth-0 step: its plain cell, where plain steps run): its own cell timed
        ``min_samples`` times, or two so timed that bracket its batch size (`_bracket`)."""
        cells = (PLAIN_CELL, VERIFY_CELL) if depth == 0 else (VERIFY_CELL,)
        return any(
            self._timed(batch_size, depth, cell) or self._bracket(batch_size, depth, cell)
            for cell in cells
        )

    def _timed(self, batch_size: int, depth: int, cell: str) -> bool:
        return len(self._timings.get((batch_size, depth, cell), ())) >= self.min_samples

    def _bracket(self, batch_size: int, depth: int, cell: str) -> tuple[int, int] | None:
        """The nearest batch sizes below and above ``batch_size`` whose cells of this depth
        and path are timed, if the larger is at most ``BRACKET_SPAN`` times the smaller:
        close enough that the line between their medians prices the sizes between (a
        draining load visits every size from its peak down; timing each by probes cost a
        drafting step per size for what its neighbours already tell)."""
        sizes = self._timed_sizes.get((depth, cell), [])
        index = bisect_left(sizes, batch_size)
        if index == 0 or index == len(sizes):
            return None
        below, above = sizes[index - 1], sizes[index]
        if above == batch_size or above > BRACKET_SPAN * below:
            return None
        return below, above

    def largest_batch_timed(self, depth: int) -> int:
        """The largest batch size with a timing at this depth (0 if none)."""
        timed = (b for b, k, cell in self._timings if k == depth and cell != CATCH_UP_CELL)
        return max(timed, default=0)

    @property
    def ready(self) -> bool:
        return len(self.timed_depths()) >= 2

    def coefficients(self) -> np.ndarray:
        """``T(b, k)``'s, fitted to the speculative steps (to every step while none
        is timed at a drafting depth: the line then only has depth 0)."""
        if self._coef is None:
            verify = [(b, k, t) for b, k, t, cell in self.samples if cell == VERIFY_CELL]
            fitted = verify or [(b, k, t) for b, k, t, cell in self.samples]
            self._coef = _least_squares(fitted, step_features, FEATURES)
        return self._coef

    def plain_coefficients(self) -> np.ndarray | None:
        """``T0(b)``'s, fitted to the plain depth-0 steps; None if none is timed."""
        if self._plain_coef is None:
            plain = [(b, 0, t) for b, k, t, cell in self.samples if cell == PLAIN_CELL]
            if plain:
                self._plain_coef = _least_squares(plain, lambda b, _: plain_features(b), 2)
        return self._plain_coef

    def predict(self, batch_size: int, depth: int) -> float:
        """Seconds for one step: the median of its own (batch size, depth) cell where that
        is timed ``min_samples`` times, else the line between the medians of the timed
        cells that bracket its batch size (`_bracket`), else the fit's; never below a
        microsecond (a fit on noisy timings can extrapolate below zero far from the data).
        A host's step cost is not linear in the batch and the depth everywhere (a CPU with
        AMX decodes batch 1 to 8 in about the same time): a line through every cell can
        miss a timed cell by a third, enough to keep a batch at depth 0 where drafting pays."""
        plain = self.plain_coefficients() if depth == 0 else None
        cell = PLAIN_CELL if plain is not None else VERIFY_CELL
        key = (batch_size, depth, cell)
        if self._timed(*key):
            return max(self._median(key), 1e-6)
        if bracket := self._bracket(*key):
            low, high = bracket
            share = (batch_size - low) / (high - low)
            at_low, at_high = self._median((low, depth, cell)), self._median((high, depth, cell))
            return max(at_low + share * (at_high - at_low), 1e-6)
        if plain is not None:
            return max(float(plain_features(batch_size) @ plain), 1e-6)
        return max(float(step_features(batch_size, depth) @ self.coefficients()), 1e-6)

    def timings(self) -> dict[str, list[dict[str, Any]]]:
        """What a calibration keeps (`adaptive/calibration.py`'s ``CostTimings``): each
        cell timed ``min_samples`` times, at its median, and the catch-ups and draft
        extends that price a caught-up position."""
        cells = [
            {"batch_size": b, "depth": k, "path": cell, "seconds": self._median((b, k, cell))}
            for b, k, cell in sorted(self._timings)
            if self._timed(b, k, cell)
        ]
        catch_ups = [{"batch_size": b, "seconds": t, "positions": n} for b, t, n in self.catch_ups]
        extends = [{"seconds": t, "positions": n} for t, n in self.draft_extends]
        return {"cells": cells, "catch_ups": catch_ups, "draft_extends": extends}

    def calibrate(self, timings: dict[str, list[dict[str, Any]]]) -> None:
        """Start from a calibration's ``timings``: each cell's median as ``min_samples``
        timings (the live ones outvote it from the ``min_samples + 1``-th on, and push it
        out of the window), and its catch-ups and draft extends. The first live step at
        each depth and path is still a warm-up: its one-time costs are this process's."""
        for cell in timings["cells"]:
            for _ in range(self.min_samples):
                self._add_timing((cell["batch_size"], cell["depth"], cell["path"]), cell["seconds"])
        for catch_up in timings["catch_ups"]:
            self.catch_ups.append(
                (catch_up["batch_size"], catch_up["seconds"], catch_up["positions"])
            )
        for extend in timings["draft_extends"]:
            self.draft_extends.append((extend["seconds"], extend["positions"]))
        self._coef = self._plain_coef = None

    def catch_up_ms(self) -> float | None:
        """The median catch-up step, in milliseconds (None: none timed)."""
        times = [
            t for (_, _, cell), ts in self._timings.items() if cell == CATCH_UP_CELL for t in ts
        ]
        return round(1000 * float(np.median(times)), 3) if times else None

    def observe_draft_extend(self, positions: int, seconds: float) -> None:
        """A draft extend timed alone (a prefill's, ``positions`` long)."""
        if positions >= PRICED_CATCH_UP:
            self.draft_extends.append((seconds, positions))

    def seconds_per_position(self) -> float:
        """What the draft's catch-up costs per position: the median, over the timed
        catch-up steps of at least ``PRICED_CATCH_UP`` positions, of their time beyond a
        plain step of their batch size per position caught up (a short catch-up is mostly
        the draft forward's fixed cost, and its excess over a plain step is within a plain
        step's noise: priced per position, it made a catch-up of thousands look cheap).
        Until one is timed, the median per position of the draft's prefills (the same
        extend over a prompt, timed alone); before any, what the speculative fit prices a
        drafted token at (``c3``: a draft forward of one token and the target's verify of
        it, several times a catch-up's position: it kept a server from catching up where
        drafting would have repaid it)."""
        per_position = [
            max(t - self.predict(b, 0), 0.0) / n
            for b, t, n in self.catch_ups
            if n >= PRICED_CATCH_UP
        ]
        if not per_position:
            per_position = [t / n for t, n in self.draft_extends]
        if per_position:
            return float(np.median(per_position))
        return float(self.coefficients()[3])


def _least_squares(samples: list[tuple[int, int, float]], features, width: int) -> np.ndarray:
    """The fit to each (batch size, depth) cell's median time, every coefficient
    non-negative: a step never gets cheaper with more requests or more drafts, and a
    negative per-request cost fitted to noise turned into steps predicted cheap at batch
    sizes beyond those timed. A feature whose coefficient comes out negative is dropped and
    the rest refitted (at most ``width`` rounds)."""
    cells: dict[tuple[int, int], list[float]] = {}
    for b, k, t in samples:
        cells.setdefault((b, k), []).append(t)
    if not cells:
        return np.zeros(width)
    x = np.stack([features(b, k) for b, k in cells])
    y = np.array([float(np.median(times)) for times in cells.values()])
    kept = np.ones(width, dtype=bool)
    coef = np.zeros(width)
    for _ in range(width):
        coef = np.zeros(width)
        coef[kept] = np.linalg.lstsq(x[:, kept], y, rcond=None)[0]
        if (coef >= 0).all():
            break
        kept &= coef > 0
    return np.clip(coef, 0.0, None)


@dataclass
class AcceptanceEstimate:
    """Per-position acceptance ``p`` of the draft, with exponential forgetting.

    A request that drafted ``k`` tokens and had ``a`` accepted made ``a`` successes and,
    if ``a < k``, one failure: the maximum-likelihood ``p`` of a geometric acceptance
    truncated at ``k`` is successes / (successes + failures), whatever the ``k`` of each
    step. For a top-k > 1 tree it is the tree's effective per-depth rate. Starts at the
    prior (1 success in 2 trials: p = 0.5).

    It forgets by request-step, not by batch step: a step of ``b`` requests ages the
    evidence ``b`` times, so the estimate answers to the requests drafting now within a few
    steps at any batch size. Forgetting once per step let a load of 16 requests build a
    memory of ~800 trials; 8 requests that then drafted with almost nothing accepted took
    some 50 steps at depth 1-2 (each ~1.5 plain steps) to pull it below break-even."""

    decay: float = 0.98  # per observed request-step
    successes: float = 1.0
    trials: float = 2.0

    def observe(self, accepted: list[int], depth: int) -> None:
        if depth <= 0 or not accepted:
            return  # nothing was drafted: no evidence about the draft
        failures = sum(1 for a in accepted if a < depth)
        forget = self.decay ** len(accepted)
        self.successes = forget * self.successes + sum(accepted)
        self.trials = forget * self.trials + sum(accepted) + failures

    @property
    def rate(self) -> float:
        return self.successes / self.trials


def expected_tokens(rates: Sequence[float], depth: int) -> float:
    """Tokens a batch whose requests accept at ``rates`` emits in one step at this depth
    (each request's bonus token included)."""
    p = np.asarray(rates, dtype=float)
    return float(np.sum(p[:, None] ** np.arange(depth + 1)))


@dataclass
class RequestAcceptance:
    """Each request's own acceptance rate, shrunk towards what a new request accepts.

    Requests differ far more than a step's noise (on one batch of chat prompts the same
    draft had 3 of 30 and 45 of 86 draft tokens accepted), and a server-wide rate answers
    for the requests that drafted most: a well-predicted request drafting deep adds four or
    five trials a step, a badly predicted one at depth 1 adds one. Priced at the server's
    rate, four requests that had nothing accepted drafted 23 more steps (each ~1.4 plain
    steps) before the rate fell below break-even. Here a request's rate is its own
    successes and trials (aged per step it drafts) over ``prior_trials`` trials at the
    new-request rate: the mean of the own rates of the ``recent`` requests that drafted
    last, each shrunk towards the server-wide rate (which stands alone before any)."""

    prior_trials: float = 2.0
    decay: float = 0.95  # per step the request drafted: a reply changes what it is writing
    recent: int = 32
    remembered: int = 512  # requests kept, the last to draft first out
    _own: OrderedDict = field(default_factory=OrderedDict)  # rid -> (successes, trials)

    def observe(self, request_ids: Sequence[str], accepted: Sequence[int], depth: int) -> None:
        if depth <= 0:
            return
        for rid, a in zip(request_ids, accepted, strict=True):
            successes, trials = self._own.pop(rid, (0.0, 0.0))
            self._own[rid] = (
                self.decay * successes + a,
                self.decay * trials + a + (1 if a < depth else 0),
            )
        while len(self._own) > self.remembered:
            self._own.popitem(last=False)

    def new_request_rate(self, server_rate: float) -> float:
        recent = self._recent_rates(server_rate)
        return float(np.mean(recent)) if recent else server_rate

    def upper_rate(self, server_rate: float, quantile: float) -> float:
        """The ``quantile`` of the recent requests' own rates: what a new request accepts
        if it is among the better ones (the server-wide rate before any drafted)."""
        recent = self._recent_rates(server_rate)
        return float(np.quantile(recent, quantile)) if recent else server_rate

    def _recent_rates(self, server_rate: float) -> list[float]:
        """The own rates of the ``recent`` requests that drafted last, each shrunk towards
        the server-wide rate."""
        last = islice(reversed(self._own.values()), self.recent)
        return [self._shrunk(s, t, server_rate) for s, t in last]

    def drafted(self, request_id: str) -> bool:
        """Whether the request has a rate of its own (it drafted, and is remembered)."""
        return request_id in self._own

    def rates(self, request_ids: Sequence[str], server_rate: float) -> list[float]:
        """Each request's rate (a request that has not drafted: the new-request rate)."""
        prior = self.new_request_rate(server_rate)
        return [self._shrunk(*self._own.get(rid, (0.0, 0.0)), prior) for rid in request_ids]

    def _shrunk(self, successes: float, trials: float, prior: float) -> float:
        return (successes + self.prior_trials * prior) / (trials + self.prior_trials)


@dataclass(frozen=True)
class Decision:
    depth: int
    # "pinned", "fixed", "explore", "explore-later", "probe", "goodput", "hold",
    # "catch-up-cost", "probe-timed", "probe-beyond-drafting", "probe-own-rate"
    reason: str
    goodput: dict[int, float]  # predicted tokens/s per candidate depth (empty if unknown)


@dataclass
class GoodputPolicy:
    """Chooses each step's depth among ``candidates`` (sorted, 0 = plain decoding).

    - Until the cost model is ready it explores: the shallowest candidate (plain decoding
      at 0, what a busy server wants anyway) ``min_samples`` times, then the deepest as
      often, then the shallowest drafting depth as often, each after its warm-up step.
      Two drafting depths split a verify's fixed cost from a draft step's; one leaves the
      fit guessing (a minimum-norm split that priced depth 1 at 40% of depth 3).
      It times the drafting depths only at batch sizes up to ``explore_max_batch`` and
      runs larger batches at depth 0 meanwhile (reason ``explore-later``): a fresh
      server's first burst of 8 spent nine drafting steps at 1.5-2.5 plain steps each,
      and the catch-up of every prompt before them, on timings a batch of one or two
      takes at a fraction of that cost (bursts drain to one).
    - Then it takes the depth of highest predicted goodput among the depths it trusts
      (timed, or between two timed drafting depths, at a batch size no larger than a
      drafting step was timed at: never one the fit extrapolates to), switching away from the
      current one only for a gain of ``min_gain`` (``min_gain_leaving_plain`` from depth 0)
      seen on ``confirm_steps`` decisions in a row: the depth does not flip at a threshold,
      step after step. Back to depth 0 needs no margin, only the confirmations: the band
      lies above plain decoding (drafting is held while it is predicted to win by less than
      ``min_gain_leaving_plain``), never below it. With a band both ways, a batch that had
      settled on drafting at its tail (batch 1-3, where a depth-1 step costs 1.1-1.2 plain
      steps) held depth 1 when the next burst filled it to 8 (1.3 plain steps) at 0.28
      acceptance: predicted 1.5% slower than depth 0, inside the 3% band, for a whole burst.
    - A drafting depth at which a request of the batch, priced at its own acceptance
      rate, would decode slower than at depth 0 is priced below depth 0, by as much as
      that request loses (``every_request_gains``). Goodput sums the batch's tokens: it
      drafts for the requests that accept well at the cost of one that accepts nothing,
      whose every step then costs a verify for its one token. On a CPU a step costs about
      the same at any batch size, so the others finishing sooner gives that request none
      of its time back, and in a batch that runs until its last reply ends, it sets the
      batch's wall time (streamed batches of 8, the EAGLE pair: three requests left
      drafting for 71 steps, one of them with nothing accepted, took 13% longer than plain
      decoding).
    - It leaves depth 0 only if drafting wins back the draft's catch-up (the positions it
      missed there, at the measured cost per position) ``catch_up_margin`` times over the
      tokens the batch may still decode (``price_catch_up``): a STANDALONE draft that
      skipped a batch's prefills owes a prefill's worth of draft forward, which a few
      drafting steps at the tail of a load do not repay. The margin is for the forecast:
      the tokens left are the recent replies' survival mean and the gain is the
      acceptance's estimate, while the catch-up is paid whatever comes.
    - Every ``probe_every`` steps it runs one step at a neighbouring depth, so the cost
      model and, from depth 0, the acceptance estimate stay current; not up from depth 0
      when no draft could repay the batch's catch-up (the probe could change nothing), nor
      when, on a server that catches up, it would only retime a step timed already
      (``_probe_only_times``) or time one at a batch size beyond any a drafting step was
      timed at (``_probe_beyond_drafting``).
    - On a server that catches up, a batch at depth 0 holding a request that never drafted
      runs one caught-up drafting step whose acceptance counts (``_own_rate_probe``), where
      drafting would pay if that request accepted like the better recent ones
      (``own_rate_quantile``): a new request is otherwise priced at the recent requests'
      mean, and a lone request among poor ones never learns that it drafts well. At most
      one such step per ``probe_every`` steps.
      Under a steady load a probe that changes nothing doubles the interval (up to
      ``max_probe_every``); a new settled depth, or a batch size a third off the last
      probe's, brings it back. A load that comes back (a batch-size band whose last probe
      settled at the depth settled now) goes on at the interval it had reached: bursts
      that drain to a few requests, which draft, and fill up again, which do not, would
      otherwise start each burst probing at the base rate (~2% of a plain step's time
      at batch 16).
    - A batch larger than any timed at depth 0 runs at depth 0 first (a probe): the cheap
      step that a growing load most likely wants, and the timing that tells the fit how
      a request's cost grows without drafts.
    - Off (``enabled`` False), it drafts at the deepest candidate: the fixed behaviour.
    """

    name: ClassVar[str] = "goodput"
    candidates: list[int]
    min_gain: float = 0.03
    min_gain_leaving_plain: float = 0.10
    explore_max_batch: int = 2  # the largest batch a fresh server times drafting steps at
    # Leaving depth 0 pays the catch-up in full before the first draft, for savings that
    # are a forecast (the tokens left, the acceptance): they must cover it this many times.
    catch_up_margin: float = 2.0
    # A request that never drafted is probed where drafting pays at this quantile of the
    # recent requests' own rates.
    own_rate_quantile: float = 0.75
    confirm_steps: int = 2
    # No request drafts where it would decode slower than at depth 0 (see above).
    every_request_gains: bool = True
    probe_every: int = 32
    max_probe_every: int = 512
    enabled: bool = True
    cost: StepCostModel = field(default_factory=StepCostModel)
    acceptance: AcceptanceEstimate = field(default_factory=AcceptanceEstimate)
    requests: RequestAcceptance = field(default_factory=RequestAcceptance)
    pinned: int | None = None  # a depth every step runs at (a live setting), if any
    steps: int = 0
    debt: Callable[[int], CatchUpDebt] | None = None  # the batch's catch-up debt, if priced
    settled: int | None = None  # the last depth chosen on goodput (probes aside)
    _probe_up: bool = True
    _probe_interval: int = 0  # the interval in force (probe_every .. max_probe_every)
    _next_probe: int = 0  # the step the next probe runs at
    _settled_at_probe: int | None = None
    _batch_at_probe: int = 0
    # Per batch-size band (`_band`): the depth settled at its last probe, and the interval
    _band_probes: dict[int, tuple[int, int]] = field(default_factory=dict)
    _challenger: int | None = None  # a depth that beat the settled one, and how often
    _challenges: int = 0
    _next_own_rate_probe: int = 0
    _own_rate_probed: OrderedDict = field(default_factory=OrderedDict)  # request ids

    def __post_init__(self) -> None:
        if not self.candidates or any(k < 0 for k in self.candidates):
            raise ValueError(f"candidate depths must be non-negative, got {self.candidates}")
        self.candidates = sorted(set(self.candidates))
        self._probe_interval = self.probe_every
        self._next_probe = self.probe_every

    @property
    def deepest(self) -> int:
        return self.candidates[-1]

    def goodput(self, batch_size: int, depth: int, rates: Sequence[float] | None = None) -> float:
        """Predicted tokens per second of a step at this depth (cost model ready), its
        requests accepting at ``rates`` (default: ``batch_rates``)."""
        if rates is None:
            rates = self.batch_rates(batch_size)
        return expected_tokens(rates, depth) / self.cost.predict(batch_size, depth)

    def batch_rates(self, batch_size: int, request_ids: Sequence[str] | None = None) -> list[float]:
        """The acceptance rate of each request of the batch: its own where ``request_ids``
        name them, else the new-request rate for all."""
        server = self.acceptance.rate
        if request_ids is not None and len(request_ids) == batch_size:
            return self.requests.rates(request_ids, server)
        return [self.requests.new_request_rate(server)] * batch_size

    def trusted(self, batch_size: int | None = None) -> list[int]:
        """The candidates whose prediction counts: depth 0 once timed often enough, and the
        drafting depths from the shallowest to the deepest so timed (interpolated, never
        extrapolated); at a ``batch_size`` larger than any a drafting step was timed at,
        none of them (the fit would extrapolate a per-request cost: the probes time them
        there first)."""
        timed = self.cost.timed_depths()
        drafting = [k for k in timed if k > 0]
        low, high = (min(drafting), max(drafting)) if drafting else (1, 0)
        if batch_size is not None and drafting:
            if batch_size > max(self.cost.largest_batch_timed(k) for k in drafting):
                low, high = 1, 0
        return [k for k in self.candidates if (k == 0 and k in timed) or low <= k <= high]

    def choose(self, batch_size: int, request_ids: Sequence[str] | None = None) -> Decision:
        self.steps += 1
        if fixed := self._fixed():
            return fixed
        explore = self._explore_depth()
        if explore is not None or not self.cost.ready:
            depth = self.candidates[0] if explore is None else explore
            cheap = self.candidates[0] == 0
            if depth > 0 and cheap and batch_size > self.explore_max_batch:
                return Decision(0, "explore-later", {})
            return Decision(depth, "explore", {})
        rates = self.batch_rates(batch_size, request_ids)
        predicted = self._predicted(batch_size, rates)
        shallowest = self.candidates[0]
        if batch_size > self.cost.largest_batch_timed(shallowest):
            # The fit cannot split a per-request cost between depths it has timed at
            # smaller batches only: time the cheap depth at this size before trusting it.
            return Decision(shallowest, "probe", predicted)
        chosen, reason = self._settle(_argmax(predicted), predicted, batch_size)
        if chosen == 0 and (probe := self._own_rate_probe(batch_size, request_ids, predicted)):
            return Decision(probe, "probe-own-rate", predicted)
        if not _steady(batch_size, self._batch_at_probe) and not self._neighbours_priced(
            batch_size, chosen
        ):  # another load, whose neighbouring steps are not timed yet: probe as at first
            self._probe_interval = self.probe_every
            self._next_probe = min(self._next_probe, self.steps + self.probe_every)
            self._batch_at_probe = batch_size
        if self.steps >= self._next_probe:
            if chosen == self._settled_at_probe:  # nothing changed since: probe less
                self._probe_interval = min(2 * self._probe_interval, self.max_probe_every)
            self._settled_at_probe, self._batch_at_probe = chosen, batch_size
            self._band_probes[_band(batch_size)] = (chosen, self._probe_interval)
            self._next_probe = self.steps + self._probe_interval
            if chosen == 0 and not self._catch_up_repayable(batch_size):
                return Decision(chosen, "catch-up-cost", predicted)
            if chosen == 0 and self._probe_only_times(batch_size):
                return Decision(chosen, "probe-timed", predicted)
            if chosen == 0 and self._probe_beyond_drafting(batch_size):
                return Decision(chosen, "probe-beyond-drafting", predicted)
            return Decision(self._neighbour(chosen), "probe", predicted)
        return Decision(chosen, reason, predicted)

    def _predicted(self, batch_size: int, rates: Sequence[float]) -> dict[int, float]:
        """The goodput of each trusted depth for a batch accepting at ``rates``; each
        drafting depth at which the batch's least-accepting request would decode slower
        than at depth 0 priced below depth 0, by the share of its speed that request loses
        there (``every_request_gains``): the hysteresis then moves the batch to depth 0 as
        for any depth predicted below it, and keeps it there."""
        predicted = {k: self.goodput(batch_size, k, rates) for k in self.trusted(batch_size)}
        if not self.every_request_gains or 0 not in predicted:
            return predicted
        least = [min(rates)]
        plain = self.goodput(batch_size, 0, least)
        for k in predicted:  # depth 0 keeps its own (its ratio is 1)
            if (ratio := self.goodput(batch_size, k, least) / plain) < 1:
                predicted[k] = min(predicted[k], predicted[0] * ratio)
        return predicted

    def _settle(self, best: int, predicted: dict[int, float], batch_size: int) -> tuple[int, str]:
        """Hysteresis: the settled depth holds unless ``best`` beats it by ``min_gain`` on
        ``confirm_steps`` decisions in a row (and, from depth 0, repays its catch-up)."""
        held = self.settled
        if held is None or held not in predicted:
            self._moved(best, batch_size)
            return best, "goodput"
        if held == 0:
            gain = self.min_gain_leaving_plain
        elif best == 0:
            gain = 0.0  # no band below plain decoding: a drafting depth held there loses
        else:
            gain = self.min_gain
        if best != held and predicted[best] > predicted[held] * (1 + gain):
            if best == self._challenger:
                self._challenges += 1
            else:
                self._challenger, self._challenges = best, 1
            if self._challenges >= self.confirm_steps:
                if held == 0 and not self._repays_catch_up(batch_size, best, predicted):
                    self._challenger, self._challenges = None, 0
                    return held, "catch-up-cost"
                self._moved(best, batch_size)
                return best, "goodput"
        else:
            self._challenger, self._challenges = None, 0
        return held, "hold"

    def _repays_catch_up(self, batch_size: int, depth: int, predicted: dict[int, float]) -> bool:
        """Whether drafting at ``depth`` saves ``catch_up_margin`` times more time over the
        tokens the batch may still decode (1/goodput per token, at depth 0 against
        ``depth``) than the catch-up costs before its first drafting step."""
        owed = self._catch_up_owed(batch_size)
        if owed is None:
            return True
        tokens_left, cost = owed
        saved = tokens_left * (1 / predicted[0] - 1 / predicted[depth])
        return saved > self.catch_up_margin * cost

    def _catch_up_repayable(self, batch_size: int) -> bool:
        """Whether any draft could repay the batch's catch-up (with ``catch_up_margin``):
        one always right at the deepest depth, its steps costing what plain ones do, saves
        a fraction 1 - 1/(k+1) of the plain time of the tokens left. If not, a probe up
        from depth 0 (a drafting step over the stale draft cache) could not change the
        depth: it is skipped."""
        owed = self._catch_up_owed(batch_size)
        if owed is None:
            return True
        tokens_left, cost = owed
        saved = tokens_left * (1 - 1 / (self.deepest + 1)) / self.goodput(batch_size, 0)
        return saved > self.catch_up_margin * cost

    def _probe_only_times(self, batch_size: int) -> bool:
        """Whether a probe up from depth 0 would only retime a step priced already: on a
        server that catches up, a probe drafts over the stale draft cache and its
        acceptance is not counted, so all it teaches is its step's cost, and the step it
        would run is timed ``min_samples`` times at this batch size or between two batch
        sizes so timed (`StepCostModel.cell_priced`). Each such probe cost a drafting step
        and the one-token extend before it (~1.5% of a batch of 2's time at a 32-step
        interval) for nothing the policy would act on."""
        return self.debt is not None and self.cost.cell_priced(batch_size, self.candidates[1])

    def _probe_beyond_drafting(self, batch_size: int) -> bool:
        """Whether a probe up from depth 0 would run, on a server that catches up, at a
        batch size larger than any a drafting step was timed at, while at that largest
        size drafting is predicted to lose to depth 0. It would draft over the stale draft
        cache (nothing of its acceptance counted) to time one step: a verify and the
        draft's extends around it, 0.58 s where a plain step took 0.24 s at batch 9-16 on
        a 2-core CPU (two such probes: ~0.7 s of a 40-60 s round of 16 requests), at a
        size where drafting pays less still: a verify's cost grows with the batch, and
        the acceptance does not. Where drafting wins at the largest size timed, the probes
        go on timing larger ones, up to ``BRACKET_SPAN`` times it: a load that drafts to a
        gain at 2 requests learns whether it does at 4, and at 8 once 4 is timed; a jump
        from 2 to 16 is not probed (a server that drafted at c = 2 and then served 16 at
        once ran 5-8 such steps of ~1 s each, a plain step taking 0.14 s: 0.75-0.97x)."""
        if self.debt is None:
            return False
        drafting = [k for k in self.candidates if k > 0]
        largest = max(self.cost.largest_batch_timed(k) for k in drafting)
        if batch_size <= largest:
            return False
        return batch_size > BRACKET_SPAN * largest or self.predicted_best(largest) == 0

    def _own_rate_probe(
        self, batch_size: int, request_ids: Sequence[str] | None, predicted: dict[int, float]
    ) -> int | None:
        """The depth of a caught-up drafting step that measures the own rate of a request
        that never drafted, or None. On a server that catches up, a request that arrived at
        depth 0 is priced at the new-request rate (the recent requests' mean), and a
        periodic probe, drafting over the stale cache, counts nothing: after a few poor
        requests, a lone request that drafts well never drafts (a lone request's catch-up
        is its prompt, which a fixed depth pays anyway at its prefill). So where drafting,
        its catch-up repaid with the margin, would pay if the new requests accepted at
        ``own_rate_quantile`` of the recent rates, the batch drafts one step, caught up,
        and the next decisions price them at their own evidence."""
        if self.debt is None or request_ids is None or len(request_ids) != batch_size:
            return None
        if self.steps < self._next_own_rate_probe or max(predicted) == 0:
            return None
        new = [
            rid
            for rid in request_ids
            if not self.requests.drafted(rid) and rid not in self._own_rate_probed
        ]
        if not new:
            return None
        server = self.acceptance.rate
        upper = self.requests.upper_rate(server, self.own_rate_quantile)
        rates = [
            upper if rid in new else r
            for rid, r in zip(request_ids, self.requests.rates(request_ids, server), strict=True)
        ]
        hoped = {k: self.goodput(batch_size, k, rates) for k in predicted}
        best = _argmax(hoped)
        if best == 0 or hoped[best] <= hoped[0] * (1 + self.min_gain_leaving_plain):
            return None
        if not self._repays_catch_up(batch_size, best, hoped):
            return None
        for rid in new:
            self._own_rate_probed[rid] = None
        while len(self._own_rate_probed) > self.requests.remembered:
            self._own_rate_probed.popitem(last=False)
        self._next_own_rate_probe = self.steps + self.probe_every
        return best

    def _catch_up_owed(self, batch_size: int) -> tuple[int, float] | None:
        """The batch's tokens left and the seconds its catch-up costs; None if it owes
        nothing (or the debt is not priced)."""
        if self.debt is None:
            return None
        debt = self.debt(batch_size)
        if debt.positions == 0:
            return None
        return debt.tokens_left, debt.positions * self.cost.seconds_per_position()

    def price_catch_up(self, debt: Callable[[int], CatchUpDebt]) -> None:
        self.debt = debt

    def always_drafts(self) -> bool:
        fixed = self._fixed()
        return fixed is not None and fixed.depth > 0

    def _moved(self, depth: int, batch_size: int) -> None:
        if depth != self.settled:
            # A new regime probes at the base rate again; one this band settled at
            # before goes on at the interval its probes had reached.
            known = self._band_probes.get(_band(batch_size))
            if known is not None and known[0] == depth:
                self._probe_interval, self._settled_at_probe = known[1], depth
            else:
                self._probe_interval = self.probe_every
            self._next_probe = min(self._next_probe, self.steps + self._probe_interval)
        self.settled = depth
        self._challenger, self._challenges = None, 0

    def predicted_best(
        self, batch_size: int, request_ids: Sequence[str] | None = None
    ) -> int | None:
        """The depth a fresh decision would take at this batch size (no hysteresis, no
        probe, no state changed): the pinned or fixed depth, else the highest predicted
        goodput; None while the cost model is not ready."""
        if fixed := self._fixed():
            return fixed.depth
        if not self.cost.ready or self._explore_depth() is not None:
            return None
        return _argmax(self._predicted(batch_size, self.batch_rates(batch_size, request_ids)))

    def observe_step(self, record: StepRecord) -> None:
        if record.seconds is not None:
            cell = record.path if record.path in (PLAIN_CELL, CATCH_UP_CELL) else VERIFY_CELL
            self.cost.observe(
                record.batch_size, record.depth, record.seconds, cell, record.caught_up
            )

    def observe_acceptance(
        self, accepted: list[int], depth: int, request_ids: Sequence[str] | None = None
    ) -> None:
        self.acceptance.observe(accepted, depth)
        if request_ids is not None:
            self.requests.observe(request_ids, accepted, depth)

    def observe_draft_extend(self, positions: int, seconds: float) -> None:
        self.cost.observe_draft_extend(positions, seconds)

    def calibrate(self, timings: dict[str, list[dict[str, Any]]]) -> None:
        self.cost.calibrate(timings)

    def cost_timings(self) -> dict[str, list[dict[str, Any]]] | None:
        return self.cost.timings() if self.cost.ready else None

    def published(self) -> dict[str, Any]:
        ready = self.cost.ready
        plain = self.cost.plain_coefficients() if ready else None
        return {
            "pinned_depth": self.pinned,
            "acceptance_rate": self.acceptance.rate,
            "new_request_acceptance": self.requests.new_request_rate(self.acceptance.rate),
            "cost_model_ready": ready,
            "cost_model_ms": [round(1000 * float(c), 4) for c in self.cost.coefficients()]
            if ready
            else None,
            "plain_cost_ms": [round(1000 * float(c), 4) for c in plain]
            if plain is not None
            else None,
            "catch_up_step_ms": self.cost.catch_up_ms(),
            "catch_up_ms_per_position": round(1000 * self.cost.seconds_per_position(), 4)
            if ready
            else None,
            "trusted_depths": self.trusted(),  # at the batch sizes timed
            "probe_interval": self._probe_interval,
        }

    def _fixed(self) -> Decision | None:
        """The decision that needs no prediction: the pinned depth, or the deepest while
        the policy is off (or has one candidate)."""
        if self.pinned is not None:
            return Decision(self.pinned, "pinned", {})
        if not self.enabled or len(self.candidates) == 1:
            return Decision(self.deepest, "fixed", {})
        return None

    def _explore_depth(self) -> int | None:
        """The next depth to time while exploring (the shallowest, the deepest, the
        shallowest drafting depth, ``min_samples`` times each), None once all are."""
        counts = self.cost.timings_per_depth()
        drafting = [k for k in self.candidates if k > 0]
        order = [self.candidates[0], self.deepest] + drafting[:1]
        for depth in dict.fromkeys(order):
            if counts.get(depth, 0) < self.cost.min_samples:
                return depth
        return None

    def _neighbours_priced(self, batch_size: int, depth: int) -> bool:
        """Whether the steps a probe from ``depth`` would run at this batch size (the
        candidates either side) are each priced by their own timings already
        (`StepCostModel.cell_priced`). A load that drains (a burst's tail: 32 requests,
        then 13, then 8) changes its batch size by a third again and again; probing each
        at the base rate cost a drafting step and the catch-up before it every 32 steps
        (~2% of a plain step's time at batch 13), to time cells whose own medians price
        them already."""
        index = self.candidates.index(depth)
        around = self.candidates[max(index - 1, 0) : index + 2]
        return all(self.cost.cell_priced(batch_size, k) for k in around if k != depth)

    def _neighbour(self, depth: int) -> int:
        """The next candidate up or down (alternating; up from 0, down from the deepest)."""
        index = self.candidates.index(depth)
        go_up = index == 0 or (self._probe_up and index < len(self.candidates) - 1)
        self._probe_up = not self._probe_up
        return self.candidates[index + 1 if go_up else index - 1]


def _band(batch_size: int) -> int:
    """The batch-size band a probe schedule is remembered for (1, 2-3, 4-7, 8-15, ...)."""
    return batch_size.bit_length()


def _steady(batch_size: int, before: int) -> bool:
    """Whether a batch size is the same load as ``before`` (within a third either way)."""
    return 3 * before <= 4 * batch_size and 3 * batch_size <= 4 * before


def _argmax(predicted: dict[int, float]) -> int:
    """The depth of highest predicted goodput, the shallower on a tie."""
    return max(predicted, key=lambda k: (predicted[k], -k))
