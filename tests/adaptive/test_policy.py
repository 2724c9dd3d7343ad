"""The goodput policy's decisions against its own cost model, and the estimators behind it."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nanospec_server.adaptive.depth_policy import CatchUpDebt
from nanospec_server.adaptive.policy import (
    CATCH_UP_CELL,
    PLAIN_CELL,
    AcceptanceEstimate,
    Decision,
    GoodputPolicy,
    RequestAcceptance,
    StepCostModel,
    expected_tokens,
    step_features,
)

coefficient = st.floats(0.0, 0.05, allow_nan=False)


def exact_cost_model(coef: np.ndarray, depths: list[int], sizes: list[int]) -> StepCostModel:
    model = StepCostModel()
    for b in sizes:
        for k in depths:
            model.observe(b, k, float(step_features(b, k) @ coef))
    return model


@settings(max_examples=60, deadline=None)
@given(st.lists(coefficient, min_size=4, max_size=4), st.integers(1, 64), st.integers(0, 7))
def test_cost_model_recovers_a_linear_host(coef, batch_size, depth) -> None:
    coef = np.array(coef) + np.array([1e-3, 0, 0, 0])
    model = exact_cost_model(coef, [0, 1, 3, 5], [1, 4, 8, 16])
    truth = float(step_features(batch_size, depth) @ coef)
    assert model.predict(batch_size, depth) == pytest.approx(truth, rel=1e-6, abs=1e-9)


def test_cost_model_forgets_old_timings() -> None:
    model = StepCostModel(window=3)
    for k in (0, 1, 2, 3) * 4:
        model.observe(1, k, 1.0)  # a slow host ...
    for k in (0, 1, 2, 3) * 3:
        model.observe(1, k, 0.1)  # ... that got fast: only these remain
    assert model.predict(1, 2) == pytest.approx(0.1)


def test_the_fits_are_redone_every_few_timings_not_every_step(monkeypatch) -> None:
    """The policy predicts several depths each step: its fits are cached and redone every
    ``refit_every`` timings (a plain-decoding fit redone on every step, over every timed
    cell's median, cost a quarter of a millisecond a step), and a cell's median follows
    its newest timing."""
    from nanospec_server.adaptive import policy as policy_module

    fits = []
    least_squares = policy_module._least_squares
    monkeypatch.setattr(
        policy_module, "_least_squares", lambda *a: fits.append(1) or least_squares(*a)
    )
    model = StepCostModel(refit_every=8)
    for _ in range(80):
        model.observe(2, 0, 0.1, PLAIN_CELL)
        model.predict(3, 0)  # an untimed batch size: the plain fit's answer
    assert len(fits) <= 80 // 8 + 1, len(fits)
    model.observe(2, 0, 0.3, PLAIN_CELL)
    before = model.predict(2, 0)
    for _ in range(16):
        model.observe(2, 0, 0.3, PLAIN_CELL)
    assert before == pytest.approx(0.1) and model.predict(2, 0) == pytest.approx(0.3)


def test_a_rarely_visited_depth_keeps_its_timings() -> None:
    """Thousands of depth-0 steps between two probes do not push a drafting depth's
    timings out: the model stays ready, and its drafting line stays where it was timed."""
    model = StepCostModel(window=8)
    for k in (0, 4) * 4:
        model.observe(2, k, 0.1 + 0.05 * k)
    for _ in range(1000):
        model.observe(2, 0, 0.1)
    assert model.ready and model.timings_per_depth() == {0: 8, 4: 3}
    assert model.predict(2, 4) == pytest.approx(0.3)


def test_a_long_load_at_large_batches_keeps_the_small_ones() -> None:
    """Hundreds of plain steps at batch 20-32 leave the line's timings at batch 1-4: the
    fit still prices a plain step at batch 1 as timed there."""
    model = StepCostModel()
    for b in (1, 1, 2, 4) * 4:
        model.observe(b, 0, 0.150 + 0.010 * b, PLAIN_CELL)
    for step in range(600):
        b = 20 + step % 13
        model.observe(b, 0, 0.150 + 0.010 * b, PLAIN_CELL)
    assert {1, 2, 4} <= {b for b, _, _, _ in model.samples}
    assert model.predict(1, 0) == pytest.approx(0.160)


def test_a_cell_timed_often_enough_predicts_itself() -> None:
    """A host whose step is flat up to batch 4 and then climbs with the drafts (a CPU with
    AMX): no line through every cell fits batch 2, whose own timings price it; a cell not
    timed is the line between the timed cells either side of it (within a factor of two),
    else the fit's."""

    def verify(b: int, k: int) -> float:
        return 0.2 + 0.05 * k + (0.1 * (b - 4) * k if b > 4 else 0.0)

    model = StepCostModel()
    for _ in range(4):
        for b in (1, 2, 4, 8, 16):
            for k in (1, 4):
                model.observe(b, k, verify(b, k))
    fitted = lambda b, k: float(step_features(b, k) @ model.coefficients())  # noqa: E731
    assert abs(fitted(2, 1) - verify(2, 1)) > 0.02
    assert model.predict(2, 1) == pytest.approx(verify(2, 1))
    assert model.predict(12, 1) == pytest.approx((verify(8, 1) + verify(16, 1)) / 2)
    assert model.predict(12, 2) == pytest.approx(fitted(12, 2))  # depth 2: not timed
    assert model.predict(24, 1) == pytest.approx(fitted(24, 1))  # nothing timed above
    assert model.cell_priced(12, 1) and not model.cell_priced(24, 1)


def test_only_neighbours_within_a_factor_of_two_price_a_batch_size() -> None:
    """Timed at batch 4 and 16 only, batch 10 is the fit's: the step's cost is not a line
    over so wide a span (flat up to 8 on a CPU with AMX)."""
    model = StepCostModel()
    for _ in range(4):  # the first step at each depth is a warm-up
        for b in (1, 4, 16):
            for k in (0, 1):
                model.observe(b, k, 0.2 + 0.01 * b + 0.05 * k + (0.1 if b > 8 else 0.0))
    fitted = float(step_features(10, 1) @ model.coefficients())
    assert not model.cell_priced(10, 1) and not model.cell_priced(2, 1)
    assert model.predict(10, 1) == pytest.approx(fitted)
    model.observe(8, 1, 0.33)
    assert not model.cell_priced(6, 1)  # timed once: not yet
    model.observe(8, 1, 0.33), model.observe(8, 1, 0.33)
    assert model.cell_priced(6, 1) and model.predict(6, 1) == pytest.approx(0.31)


def test_cost_model_needs_two_depths_timed_often() -> None:
    model = StepCostModel()
    for b in range(1, 9):
        model.observe(b, 3, 0.01 * b)
    model.observe(1, 0, 0.005)  # depth 0's warm-up
    assert not model.ready  # one depth timed only
    for _ in range(model.min_samples - 1):
        model.observe(1, 0, 0.005)
        assert not model.ready  # depth 3 timed often, depth 0 less than min_samples times
    model.observe(1, 0, 0.005)
    assert model.ready
    fresh = StepCostModel()
    for k in (0, 3) * fresh.min_samples:  # each depth's first step is its warm-up
        fresh.observe(1, k, 0.01)
    assert not fresh.ready  # two depths, neither min_samples times
    fresh.observe(1, 0, 0.01)
    assert not fresh.ready  # one of them
    fresh.observe(1, 3, 0.01)
    assert fresh.ready


def test_the_first_step_at_each_depth_is_a_warm_up_not_a_timing() -> None:
    """A cold first deep step (seconds) must not make drafting look dear: the fit sees
    only the steps after it."""
    model = StepCostModel()
    model.observe(1, 4, 5.0)  # cold
    for k in (0, 0, 0, 0, 4, 4, 4):
        model.observe(1, k, 0.010 + 0.005 * k)
    assert model.ready
    assert model.predict(1, 4) == pytest.approx(0.030)
    assert model.predict(1, 0) == pytest.approx(0.010)


@settings(max_examples=60, deadline=None)
@given(st.floats(0.0, 1.0), st.integers(1, 7), st.integers(0, 2**32 - 1))
def test_acceptance_estimate_converges_to_the_geometric_rate(p, depth, seed) -> None:
    rng = np.random.default_rng(seed)
    estimate = AcceptanceEstimate(decay=1.0, successes=0.0, trials=1e-9)
    for _ in range(400):
        accepted = []
        for _ in range(4):
            a = 0
            while a < depth and rng.random() < p:
                a += 1
            accepted.append(a)
        estimate.observe(accepted, depth)
    assert estimate.rate == pytest.approx(p, abs=0.08)


def test_the_estimate_follows_the_requests_drafting_now_at_any_batch_size() -> None:
    """After a long load of 16 requests with 70% of drafts accepted, 8 requests that
    accept almost none pull the estimate below 0.45 within five steps (forgetting by
    batch step, it stayed near 0.66)."""
    estimate = AcceptanceEstimate()
    rng = np.random.default_rng(0)
    for _ in range(500):
        estimate.observe([int(rng.random() < 0.7) for _ in range(16)], depth=1)
    assert estimate.rate == pytest.approx(0.7, abs=0.1)
    for _ in range(5):
        estimate.observe([0] * 8, depth=1)
    assert estimate.rate < 0.45


def test_no_draft_no_acceptance_evidence() -> None:
    estimate = AcceptanceEstimate()
    estimate.observe([0, 0, 0], depth=0)
    assert estimate.rate == 0.5


def test_expected_tokens_is_the_geometric_sum() -> None:
    estimate = AcceptanceEstimate(successes=3.0, trials=4.0)  # p = 0.75
    assert expected_tokens([estimate.rate], 0) == 1.0
    assert expected_tokens([estimate.rate], 3) == pytest.approx(1 + 0.75 + 0.75**2 + 0.75**3)


def ready_policy(coef: np.ndarray, p: float, candidates: list[int], **kw) -> GoodputPolicy:
    policy = GoodputPolicy(candidates, **({"probe_every": 10**9} | kw))
    policy.cost = exact_cost_model(coef, candidates, [1, 2, 4, 8, 16, 32, 64])
    policy.acceptance = AcceptanceEstimate(successes=p * 1000, trials=1000)
    return policy


@settings(max_examples=100, deadline=None)
@given(
    st.lists(coefficient, min_size=4, max_size=4),
    st.floats(0.0, 0.99),
    st.integers(1, 48),
)
def test_decision_maximises_predicted_goodput(coef, p, batch_size) -> None:
    """With no hysteresis the chosen depth is the argmax of b * E[tokens | k] / T(b, k)."""
    coef = np.array(coef) + np.array([1e-3, 0, 0, 0])
    policy = ready_policy(coef, p, [0, 1, 2, 3, 4, 5], min_gain=0.0)
    decision = policy.choose(batch_size)

    def goodput(k: int) -> float:
        tokens = sum(p**i for i in range(k + 1))
        return batch_size * tokens / float(step_features(batch_size, k) @ coef)

    best = max(goodput(k) for k in policy.candidates)
    assert goodput(decision.depth) == pytest.approx(best, rel=1e-6)
    assert decision.reason == "goodput"


def test_drafting_stops_where_verify_cost_outgrows_acceptance() -> None:
    """A host where reading the weights dominates a small batch and a drafted token costs
    as much as a request's decode (a 2-core CPU): at p = 0.6 speculation pays at batch 1
    and is switched off at batch 16."""
    # 100 ms fixed, 10 ms per request, 5 ms per draft step, 10 ms per drafted token
    coef = np.array([0.100, 0.010, 0.005, 0.010])
    policy = ready_policy(coef, 0.6, [0, 1, 2, 3])
    assert policy.choose(1).depth > 0
    policy.settled = None
    assert policy.choose(16).depth == 0


def test_hysteresis_holds_a_depth_against_a_small_gain() -> None:
    coef = np.array([0.010, 0.001, 0.001, 0.0001])
    policy = ready_policy(coef, 0.5, [0, 1, 2, 3], min_gain=10.0)  # nothing beats 11x
    first = policy.choose(4).depth
    policy.acceptance = AcceptanceEstimate(successes=999, trials=1000)  # now deeper pays
    assert policy.choose(4).depth == first and policy.choose(4).reason == "hold"


def test_hysteresis_never_holds_a_drafting_depth_below_plain_decoding() -> None:
    """Drafting settled at a small batch (a load's tail) is left as soon as depth 0 is
    predicted faster at the batch size now (a new burst), however slightly; depth 0 is
    left only for ``min_gain_leaving_plain``. Timings of the EAGLE pair on a 2-core CPU:
    a depth-1 step costs 1.125 plain steps at batch 1 and 1.3 at batch 8."""
    policy = GoodputPolicy([0, 1], probe_every=10**9)
    policy.acceptance = AcceptanceEstimate(successes=280, trials=1000)
    for b, plain, drafting in ((1, 0.080, 0.090), (8, 0.100, 0.130)):
        for _ in range(policy.cost.min_samples + 1):  # the first is a warm-up
            policy.cost.observe(b, 0, plain, PLAIN_CELL)
            policy.cost.observe(b, 1, drafting)
    assert [policy.choose(1).depth for _ in range(3)][-1] == 1  # 1.28 / 1.125: +14%
    assert policy.goodput(8, 0) < policy.goodput(8, 1) * (1 + policy.min_gain)  # in the band
    at_eight = [policy.choose(8) for _ in range(20)]
    confirming = policy.confirm_steps - 1  # decisions that favour depth 0 before it moves
    assert [d.reason for d in at_eight[:confirming]] == ["hold"] * confirming
    assert {d.depth for d in at_eight[confirming:]} == {0}, at_eight
    policy.acceptance = AcceptanceEstimate(successes=340, trials=1000)  # 1.34 / 1.3: +3%
    assert {policy.choose(8).depth for _ in range(20)} == {0}  # not enough to leave plain


def drafting_steps_until_plain(policy: GoodputPolicy, ids: list[str] | None) -> int:
    """Steps four requests that have nothing accepted draft, after a long well-predicted
    run, before the policy takes them to depth 0 (EAGLE pair timings on a 2-core CPU:
    a depth-1 step costs 1.27 plain steps at batch 4)."""
    for b, plain, drafting in ((4, 0.100, 0.127), (1, 0.080, 0.090)):
        for _ in range(policy.cost.min_samples + 1):  # the first is a warm-up
            policy.cost.observe(b, 0, plain, PLAIN_CELL)
            policy.cost.observe(b, 1, drafting)
    for step in range(400):  # others drafted well: 0.8 accepted per draft token
        policy.observe_acceptance([1, 1, 1, 0], 1, [f"old-{step}-{i}" for i in range(4)])
    assert policy.choose(4, ids).depth == 1
    for steps in range(1, 100):
        policy.observe_acceptance([0, 0, 0, 0], 1, ids)
        if policy.choose(4, ids).depth == 0:
            return steps
    return 100


def test_a_request_that_drafts_badly_stops_drafting_on_its_own_evidence() -> None:
    """A batch's expected tokens are its requests' own: four requests with nothing accepted
    go to depth 0 within a few steps, where the server-wide rate (the reference: no
    request ids) still answers for the requests before them for many more."""
    own = drafting_steps_until_plain(GoodputPolicy([0, 1], probe_every=10**9), list("abcd"))
    server_wide = drafting_steps_until_plain(GoodputPolicy([0, 1], probe_every=10**9), None)
    assert own <= 5 < 20 <= server_wide, (own, server_wide)


def test_a_new_request_starts_from_what_recent_requests_accepted() -> None:
    """Each remembered request counts once, however many trials it made: a deep, long run
    of one well-predicted request does not set a newcomer's rate alone."""
    requests, server_wide = RequestAcceptance(prior_trials=2.0), AcceptanceEstimate()
    assert requests.new_request_rate(0.5) == 0.5  # nothing seen: the server-wide rate
    for _ in range(50):
        requests.observe(["good", "bad"], [4, 0], 4)
        server_wide.observe([4, 0], 4)
    good, bad, new = requests.rates(["good", "bad", "new"], 0.5)
    assert good > 0.9 and bad < 0.1
    assert new == pytest.approx((good + bad) / 2, abs=0.01)
    assert server_wide.rate > 0.75  # four trials of the good one to one of the bad
    requests.observe(["good"], [0], 0)  # a depth-0 step says nothing about the draft
    assert requests.rates(["good"], 0.5)[0] == good


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=8), st.integers(0, 6))
def test_a_batch_expects_the_sum_of_its_requests_tokens(rates, depth) -> None:
    reference = sum(p**i for p in rates for i in range(depth + 1))
    assert expected_tokens(rates, depth) == pytest.approx(reference, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("candidates", [[0, 4], [0, 1, 2, 3, 4]])
def test_cold_start_times_the_full_depth_then_probes(candidates) -> None:
    """A fresh server times plain decoding ``min_samples`` times, the full depth as often,
    and the shallowest drafting depth as often where it differs (each after a warm-up
    step), then decides on goodput, every depth between the two drafting ones trusted."""
    policy = GoodputPolicy(candidates, probe_every=5)
    explored = []
    while (decision := policy.choose(1)).reason == "explore":
        explored.append(decision.depth)
        policy.cost.observe(1, decision.depth, 0.01 + 0.001 * decision.depth)
    runs = policy.cost.min_samples + 1
    shallow = [candidates[1]] * runs if candidates[1] != candidates[-1] else []
    assert explored == [0] * runs + [candidates[-1]] * runs + shallow
    assert policy.trusted() == candidates
    reasons = [policy.choose(1).reason for _ in range(10)]
    assert "probe" in reasons and "explore" not in reasons


def test_a_fresh_server_times_drafting_only_once_a_burst_drains() -> None:
    """A fresh server's first burst of 8 runs at depth 0 once depth 0 is timed; the drafting
    depths are timed when the batch is down to ``explore_max_batch``. With no depth 0 to
    fall back on, any batch explores."""
    policy = GoodputPolicy([0, 1, 3], probe_every=10**9)
    burst = []
    for _ in range(30):
        decision = policy.choose(8)
        burst.append((decision.depth, decision.reason))
        policy.cost.observe(8, decision.depth, 0.2)
    runs = policy.cost.min_samples + 1
    assert burst == [(0, "explore")] * runs + [(0, "explore-later")] * (30 - runs)
    tail = []
    while (decision := policy.choose(2)).reason == "explore":
        tail.append(decision.depth)
        policy.cost.observe(2, decision.depth, 0.1 + 0.05 * decision.depth)
    assert tail == [3] * runs + [1] * runs  # depth 0 is timed already, at batch 8
    assert policy.cost.ready
    assert GoodputPolicy([1, 3]).choose(8) == Decision(1, "explore", {})


def test_probes_back_off_under_a_steady_load() -> None:
    """A probe that changes nothing doubles the interval to the next, up to the cap; a
    new settled depth brings the base interval back."""
    coef = np.array([0.100, 0.010, 0.005, 0.010])
    policy = ready_policy(coef, 0.6, [0, 1, 2, 3], probe_every=8, max_probe_every=64)
    probes = [step for step in range(1, 600) if policy.choose(16).reason == "probe"]
    gaps = [b - a for a, b in itertools.pairwise(probes)]
    assert gaps[:4] == [8, 16, 32, 64] and set(gaps[4:]) == {64}, gaps
    policy.acceptance = AcceptanceEstimate(successes=999, trials=1000)  # drafting pays now
    moved = [policy.choose(1) for _ in range(70)]
    assert policy.settled > 0
    assert sum(d.reason == "probe" for d in moved) >= 2  # back at the base interval


def test_a_draining_load_probes_less_once_the_probed_steps_are_timed() -> None:
    """A burst's tail shrinks the batch by a third again and again. Where the steps a probe
    would run are timed at each of its sizes, the interval keeps doubling through the
    drain; where they are not, each new size is probed from the base interval."""
    coef = np.array([0.100, 0.010, 0.005, 0.010])
    drain = [32, 21, 14, 9, 6, 4]

    def probes(timings_per_cell: int) -> int:
        policy = ready_policy(coef, 0.1, [0, 1, 2, 3], probe_every=8, max_probe_every=512)
        for b in drain:
            for k in policy.candidates:
                for _ in range(timings_per_cell):
                    policy.cost.observe(b, k, float(step_features(b, k) @ coef))
        decisions = [policy.choose(b) for b in drain for _ in range(40)]
        assert {d.depth for d in decisions if d.reason != "probe"} == {0}
        return sum(d.reason == "probe" for d in decisions)

    timed, untimed = probes(3), probes(0)
    assert timed <= 5 and untimed >= 2 * len(drain), (timed, untimed)


def test_a_draining_load_is_not_probed_where_timed_sizes_either_side_price_it() -> None:
    """On a server that catches up, a probe up from depth 0 only times its step: a drain
    through sizes that lie between sizes timed within a factor of two of each other needs
    none; between sizes timed farther apart, each new size is probed."""
    coef = np.array([0.100, 0.010, 0.005, 0.010])
    drain = [32, 21, 14, 9, 6, 4]

    def probes(timed_sizes: list[int]) -> int:
        policy = ready_policy(coef, 0.1, [0, 1, 2, 3], probe_every=8, max_probe_every=512)
        policy.price_catch_up(lambda batch_size: CatchUpDebt(10, 2048))
        for b in timed_sizes:
            for k in (0, 1):
                for _ in range(3):
                    policy.cost.observe(b, k, float(step_features(b, k) @ coef))
        decisions = [policy.choose(b) for b in drain for _ in range(40)]
        assert {d.depth for d in decisions if d.reason != "probe"} == {0}
        return sum(d.reason == "probe" for d in decisions)

    assert probes([32, 16, 8, 4]) == 0
    assert probes([32, 4]) >= 2


def test_a_switch_needs_the_gain_on_consecutive_decisions() -> None:
    """Hysteresis: one decision that favours another depth does not move the settled one."""
    coef = np.array([0.100, 0.010, 0.005, 0.010])
    policy = ready_policy(coef, 0.6, [0, 1, 2, 3], confirm_steps=3)
    assert policy.choose(16).depth == 0
    policy.acceptance = AcceptanceEstimate(successes=999, trials=1000)
    assert [policy.choose(1).reason for _ in range(3)] == ["hold", "hold", "goodput"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.001, 10.0), min_size=1, max_size=40), st.integers(1, 5))
def test_exploration_is_bounded_whatever_the_timings(times, deepest) -> None:
    """However the host's timings fall, exploration ends after 3 ``min_samples`` + 3 steps
    (three of them warm-ups) and spends at most 2 ``min_samples`` + 2 above depth 0."""
    policy = GoodputPolicy(list(range(deepest + 1)))
    explored = []
    for seconds in times:
        decision = policy.choose(2)
        if decision.reason != "explore":
            break
        explored.append(decision.depth)
        policy.cost.observe(2, decision.depth, seconds)
    assert len(explored) <= 3 * policy.cost.min_samples + 3
    assert sum(1 for k in explored if k > 0) <= 2 * policy.cost.min_samples + 2


def test_pinned_depth_overrides_the_policy() -> None:
    policy = ready_policy(np.array([0.03, 0.02, 0.01, 0.004]), 0.9, [0, 1, 2, 3])
    policy.pinned = 0
    assert [policy.choose(b).depth for b in (1, 8, 32)] == [0, 0, 0]
    assert policy.choose(1).reason == "pinned"
    policy.pinned = None
    assert policy.choose(1).reason == "goodput"


def test_cost_model_ignores_stalled_steps() -> None:
    """A step the host stalled for a whole scheduler slice moves a median, not a fit."""
    model = StepCostModel()
    for k in (0, 1, 2) * 5:
        model.observe(4, k, 0.010 + 0.002 * k)
    model.observe(4, 1, 2.0)  # stalled
    assert model.predict(4, 1) == pytest.approx(0.012)


def test_off_drafts_at_the_launch_depth() -> None:
    policy = ready_policy(np.array([0.03, 0.02, 0.01, 0.004]), 0.1, [0, 1, 2, 3])
    policy.enabled = False
    assert policy.choose(32).depth == 3 and policy.choose(32).reason == "fixed"


def test_bad_candidates_are_refused() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        GoodputPolicy([-1, 2])


@settings(max_examples=60, deadline=None)
@given(st.lists(coefficient, min_size=4, max_size=4), st.floats(0.0, 0.99), st.integers(1, 48))
def test_predicted_best_is_a_fresh_decision_that_changes_nothing(coef, p, batch_size) -> None:
    """What a prefill asks (would the batch it joins draft?) is the decision a fresh
    policy would take, and asking it moves neither the step count nor the held depth."""
    coef = np.array(coef) + np.array([1e-3, 0, 0, 0])
    policy = ready_policy(coef, p, [0, 1, 2, 3], min_gain=0.0)
    fresh = ready_policy(coef, p, [0, 1, 2, 3], min_gain=0.0)
    assert policy.predicted_best(batch_size) == fresh.choose(batch_size).depth
    assert (policy.steps, policy.settled) == (0, None)
    assert GoodputPolicy([0, 3]).predicted_best(batch_size) is None  # no cost model yet
    policy.pinned = 0
    assert policy.predicted_best(batch_size) == 0  # pinned, as `choose` takes it
    policy.pinned, policy.enabled = None, False
    assert policy.predicted_best(batch_size) == 3  # off: the launch depth


# The default pair on this 2-core host (1.5B target, 0.5B STANDALONE draft, bf16), fitted to
# its measured step times at batch 1-16 and depth 0-4: weights read once per step dominate a
# small batch, and every drafted token costs about two requests' decode.
CPU_HOST = np.array([0.152, 0.0045, 0.035, 0.0096])


def host_goodput(coef: np.ndarray, p: float, batch_size: int, depth: int) -> float:
    tokens = batch_size * sum(p**i for i in range(depth + 1))
    return tokens / float(step_features(batch_size, depth) @ coef)


def host_best_depth(coef: np.ndarray, p: float, batch_size: int, candidates: list[int]) -> int:
    return max(candidates, key=lambda k: host_goodput(coef, p, batch_size, k))


@pytest.mark.parametrize("batch_size", [4, 8, 16])
def test_a_larger_batch_times_depth_0_before_trusting_the_fit(batch_size: int) -> None:
    """After a run at batch 1 (where drafting pays), the fit has depth 0 at batch 1 only and
    cannot split the per-request cost between the depths: extrapolated, it kept the policy
    drafting deep at batch 4 where one draft token is best. The first step at a batch size
    larger than any timed at depth 0 is a depth-0 probe; then, with its probes, the policy
    settles on the host's best depth there."""
    candidates, p = [0, 1, 2, 3, 4], 0.72
    policy = GoodputPolicy(candidates)
    policy.acceptance = AcceptanceEstimate(successes=p * 1000, trials=1000)

    def run(decision: Decision, b: int) -> None:
        policy.cost.observe(b, decision.depth, float(step_features(b, decision.depth) @ CPU_HOST))

    for _ in range(40):
        run(policy.choose(1), 1)
    assert policy.settled == host_best_depth(CPU_HOST, p, 1, candidates) > 0
    first = policy.choose(batch_size)
    assert (first.depth, first.reason) == (0, "probe")
    run(first, batch_size)
    for _ in range(70):
        run(policy.choose(batch_size), batch_size)
    # the host's best there, or a depth within the hysteresis' margin of it (a wider one
    # from depth 0, whose leaving costs the draft's catch-up)
    best = host_best_depth(CPU_HOST, p, batch_size, candidates)
    truth = {k: host_goodput(CPU_HOST, p, batch_size, k) for k in candidates}
    margin = policy.min_gain_leaving_plain if policy.settled == 0 else policy.min_gain
    assert truth[policy.settled] * (1 + margin) >= truth[best], (policy.settled, truth)


def test_one_stalled_timing_of_a_depth_does_not_keep_the_policy_off_it() -> None:
    """A fresh server times the deepest depth once; stalled (10x), that one timing made every
    drafting depth look slow, and since probes visit neighbours only, it was never retimed:
    the default pair stayed at depth 0 at concurrency 1 until it aged out of the window. A
    cell's weight in the fit grows with its timings, so the depths the probes keep timing
    outvote it within a few probes."""
    candidates, p = [0, 1, 2, 3, 4], 0.72
    policy = GoodputPolicy(candidates)
    policy.acceptance = AcceptanceEstimate(successes=p * 1000, trials=1000)
    stalled_once = False
    for _ in range(200):
        depth = policy.choose(1).depth
        seconds = float(step_features(1, depth) @ CPU_HOST)
        if depth == 4 and (4, "verify") in policy.cost.warmed and not stalled_once:
            seconds, stalled_once = 10 * seconds, True
        policy.cost.observe(1, depth, seconds)
    assert stalled_once and policy.cost.timings_per_depth()[4] < policy.cost.window  # in the fit
    assert policy.settled == host_best_depth(CPU_HOST, p, 1, candidates)


def test_plain_steps_and_catch_up_steps_are_timed_apart() -> None:
    """Depth 0 on the plain decode path fits its own line; the speculative steps' fit never
    sees it, and catch-up steps neither (they are published, not predicted)."""
    model = StepCostModel()
    for b in (1, 2, 4, 8) * 2:
        model.observe(b, 0, 0.050 + 0.002 * b, PLAIN_CELL)  # first per cell: a warm-up
        for k in (1, 3):
            model.observe(b, k, 0.080 + 0.003 * b + 0.020 * k + 0.004 * b * k)
        model.observe(b, 0, 5.0, CATCH_UP_CELL)
    assert model.predict(6, 0) == pytest.approx(0.050 + 0.002 * 6)
    assert model.predict(6, 2) == pytest.approx(0.080 + 0.003 * 6 + 0.040 + 0.048)
    assert model.catch_up_ms() == pytest.approx(5000.0)
    assert model.timings_per_depth() == {0: 7, 1: 7, 3: 7}


def test_drafting_is_not_trusted_beyond_the_batch_sizes_it_was_timed_at() -> None:
    """Drafting timed at batch 1-8 only: at batch 15 the policy does not draft on the fit's
    extrapolation (a held deep depth there cost 10x a plain step), it decodes plainly and
    its probes time a drafting depth at the new size first."""
    policy = GoodputPolicy([0, 1, 2, 3, 4], min_gain=0.0)
    policy.acceptance = AcceptanceEstimate(successes=600, trials=1000)
    for b in (1, 2, 4, 8) * 4:
        policy.cost.observe(b, 0, float(step_features(b, 0) @ CPU_HOST), PLAIN_CELL)
        for k in (1, 4):
            policy.cost.observe(b, k, float(step_features(b, k) @ CPU_HOST))
    policy.cost.observe(16, 0, float(step_features(16, 0) @ CPU_HOST), PLAIN_CELL)
    policy.settled = 4  # drafting deep at batch 1
    assert policy.trusted(15) == [0] and policy.trusted(8) == [0, 1, 2, 3, 4]
    decision = policy.choose(15)
    assert (decision.depth, decision.reason) == (0, "goodput")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 16), st.integers(0, 4), st.floats(0.001, 2.0)),
                min_size=3, max_size=40))  # fmt: skip
def test_the_fit_never_makes_a_step_cheaper_with_more_requests_or_drafts(timings) -> None:
    model = StepCostModel(min_samples=1)
    for b, k, seconds in timings * 2:
        model.observe(b, k, seconds)
    assert (model.coefficients() >= 0).all()


def test_a_catch_up_is_priced_per_position_beyond_a_plain_step() -> None:
    """Until a catch-up step is timed, a caught-up position costs what the speculative fit
    prices a drafted token at; then the median excess over a plain step per position."""
    model = exact_cost_model(np.array([0.080, 0.003, 0.020, 0.004]), [1, 3], [1, 2, 4, 8])
    assert model.seconds_per_position() == pytest.approx(0.004)
    for b in (2, 2, 4, 4, 4):  # the first is a warm-up
        model.observe(b, 0, 0.050 + 0.002 * b, PLAIN_CELL)
        model.observe(b, 0, 0.050 + 0.002 * b + 0.0015 * 100 * b, CATCH_UP_CELL, 100 * b)
    assert model.seconds_per_position() == pytest.approx(0.0015)
    for _ in range(10):  # short catch-ups within a plain step's noise price nothing
        model.observe(4, 0, 0.050 + 0.002 * 4 - 0.001, CATCH_UP_CELL, 8)
    assert model.seconds_per_position() == pytest.approx(0.0015)


def test_before_a_catch_up_is_timed_the_draft_prefills_price_a_position() -> None:
    """A draft prefill is the catch-up's extend over a prompt, timed alone: its seconds per
    position price the catch-up until a catch-up step of its own is timed (the fit's ``c3``
    is a drafted token's draft and verify, several times a position's catch-up)."""
    model = exact_cost_model(np.array([0.080, 0.003, 0.020, 0.004]), [1, 3], [1, 2, 4, 8])
    for positions in (40, 100, 300):
        model.observe_draft_extend(positions, 0.001 * positions)
    model.observe_draft_extend(5, 0.050)  # a short prompt: the forward's fixed cost
    assert model.seconds_per_position() == pytest.approx(0.001)
    for b in (2, 2, 4):  # the first is a warm-up
        model.observe(b, 0, 0.050 + 0.002 * b, PLAIN_CELL)
        model.observe(b, 0, 0.050 + 0.002 * b + 0.0025 * 100 * b, CATCH_UP_CELL, 100 * b)
    assert model.seconds_per_position() == pytest.approx(0.0025)


def settled_at_depth_0(debt: CatchUpDebt, **kw) -> GoodputPolicy:
    """A host where drafting pays at batch 2 by ~45%, the batch at depth 0 owing ``debt``."""
    policy = ready_policy(CPU_HOST, 0.8, [0, 1, 2, 3], **kw)
    policy.settled = 0
    policy.price_catch_up(lambda batch_size: debt)
    return policy


def test_depth_0_is_left_only_when_drafting_repays_the_catch_up() -> None:
    """Two requests with 16 tokens to go do not repay 4,000 positions of draft forward (at
    ~10 ms each) with ~45% more tokens per second; with 256 to go and 20 owed they do."""
    assert host_best_depth(CPU_HOST, 0.8, 2, [0, 1, 2, 3]) > 0
    stay = settled_at_depth_0(CatchUpDebt(positions=4000, tokens_left=32))
    decisions = [stay.choose(2) for _ in range(6)]
    assert {d.depth for d in decisions} == {0}
    assert decisions[-1].reason == "catch-up-cost"
    leave = settled_at_depth_0(CatchUpDebt(positions=20, tokens_left=512))
    assert [leave.choose(2).depth for _ in range(3)][-1] > 0


def test_a_catch_up_repaid_once_but_not_with_the_margin_keeps_depth_0() -> None:
    """Savings forecast at 1.5 times the catch-up's cost: not enough with the default
    margin (the forecast may not come, the catch-up is paid whatever), enough with none."""
    probe = settled_at_depth_0(CatchUpDebt(positions=1, tokens_left=512))
    for _ in range(probe.confirm_steps):
        predicted = probe.choose(2).goodput
    best = max(predicted, key=lambda k: (predicted[k], -k))
    saved = 512 * (1 / predicted[0] - 1 / predicted[best])
    positions = round(saved / probe.cost.seconds_per_position() / 1.5)

    def settles(margin: float) -> list[Decision]:
        policy = settled_at_depth_0(CatchUpDebt(positions, 512), catch_up_margin=margin)
        return [policy.choose(2) for _ in range(4)]

    held = settles(2.0)
    assert {d.depth for d in held} == {0} and held[-1].reason == "catch-up-cost"
    assert settles(1.0)[-1].depth == best


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 20_000), st.integers(0, 2_000), st.integers(1, 16))
def test_leaving_depth_0_weighs_the_debt_as_priced(positions, tokens_left, batch_size) -> None:
    """The rule against its arithmetic: leave when the time saved over the tokens left
    (1/goodput per token) exceeds the margin times positions x cost per position, else
    hold."""
    policy = settled_at_depth_0(CatchUpDebt(positions, tokens_left))
    for _ in range(policy.confirm_steps):
        decision = policy.choose(batch_size)
    predicted = decision.goodput
    best = max(predicted, key=lambda k: (predicted[k], -k))
    if best == 0 or predicted[best] <= predicted[0] * (1 + policy.min_gain_leaving_plain):
        assert decision.depth == 0 and decision.reason == "hold"
        return
    saved = tokens_left * (1 / predicted[0] - 1 / predicted[best])
    cost = positions * policy.cost.seconds_per_position()
    repaid = positions == 0 or saved > policy.catch_up_margin * cost
    assert decision.depth == (best if repaid else 0)


def test_no_probe_up_from_depth_0_when_no_draft_could_repay_the_catch_up() -> None:
    """A probe drafts one step over the stale draft cache to learn whether drafting pays;
    where even a draft always right could not repay the debt, it could change nothing."""

    def probes(debt: CatchUpDebt) -> list[Decision]:
        policy = settled_at_depth_0(debt, probe_every=32)
        return [d for d in (policy.choose(16) for _ in range(300)) if d.reason == "probe"]

    assert probes(CatchUpDebt(positions=0, tokens_left=2048))
    assert probes(CatchUpDebt(positions=10, tokens_left=2048))
    assert not probes(CatchUpDebt(positions=50_000, tokens_left=2048))


def test_no_probe_up_from_depth_0_that_would_only_retime_a_timed_step() -> None:
    """On a server that catches up, a probe's drafts come from a stale draft cache and its
    acceptance is not counted: once its step is timed at the batch size, the probe is
    skipped. Without a catch-up (its acceptance counts), or with the step untimed, it runs."""

    def probes(debt: CatchUpDebt | None, timings: int) -> int:
        policy = settled_at_depth_0(CatchUpDebt(10, 2048), probe_every=32)
        policy.debt = None if debt is None else policy.debt
        for _ in range(timings):
            policy.cost.observe(16, 1, float(step_features(16, 1) @ CPU_HOST))
        decisions = [policy.choose(16) for _ in range(300)]
        assert {d.depth for d in decisions if d.reason != "probe"} == {0}
        return sum(d.reason == "probe" for d in decisions)

    assert probes(CatchUpDebt(10, 2048), timings=3) == 0
    assert probes(CatchUpDebt(10, 2048), timings=1) >= 2  # not timed min_samples times yet
    assert probes(None, timings=3) >= 2


def test_no_probe_up_from_depth_0_beyond_the_batch_sizes_drafting_was_timed_at() -> None:
    """On a server that catches up, a probe at a batch size larger than any a drafting step
    was timed at would draft over the stale draft cache to time a step where drafting pays
    less still than at the largest size timed: skipped where drafting loses there, run
    where it wins there (the load may draft to a gain at larger sizes too). Without a
    catch-up (its acceptance counts) it runs."""

    def probes(debt: CatchUpDebt | None, acceptance: float = 0.1) -> int:
        policy = GoodputPolicy([0, 1, 2, 3], probe_every=8)
        policy.cost = exact_cost_model(CPU_HOST, [0, 1, 2, 3], [1, 2, 4, 8])
        for _ in range(3):
            policy.cost.observe(16, 0, float(step_features(16, 0) @ CPU_HOST))
        policy.acceptance = AcceptanceEstimate(successes=1000 * acceptance, trials=1000)
        if debt is not None:
            policy.price_catch_up(lambda batch_size: debt)
        decisions = [policy.choose(16) for _ in range(200)]
        assert {d.depth for d in decisions if d.reason != "probe"} == {0}
        return sum(d.reason == "probe" for d in decisions)

    assert host_best_depth(CPU_HOST, 0.95, 8, [0, 1, 2, 3]) > 0
    assert host_best_depth(CPU_HOST, 0.1, 8, [0, 1, 2, 3]) == 0
    assert probes(CatchUpDebt(10, 2048)) == 0
    assert probes(CatchUpDebt(10, 2048), acceptance=0.95) >= 2
    assert probes(None) >= 2


@pytest.mark.parametrize("batch_size, probed", [(4, True), (16, False)])
def test_probes_beyond_the_timed_sizes_climb_by_a_factor_of_two(batch_size, probed) -> None:
    """Drafting timed at batch 1-2 and winning there: a server that catches up probes a
    batch of 4 (twice the largest size timed), not a batch of 16 served at once."""
    policy = GoodputPolicy([0, 1, 2, 3], probe_every=8)
    policy.cost = exact_cost_model(CPU_HOST, [0, 1, 2, 3], [1, 2, 1, 2, 1, 2])
    for _ in range(3):
        policy.cost.observe(batch_size, 0, float(step_features(batch_size, 0) @ CPU_HOST))
    policy.acceptance = AcceptanceEstimate(successes=950, trials=1000)
    policy.price_catch_up(lambda size: CatchUpDebt(10, 2048))
    assert policy.predicted_best(2) > 0
    decisions = [policy.choose(batch_size) for _ in range(200)]
    assert (sum(d.reason == "probe" for d in decisions) >= 2) == probed


def test_a_load_that_comes_back_keeps_its_probe_interval() -> None:
    """Bursts of 16 that drain to one request: the lone request drafts (a new settled
    depth), the next burst settles at depth 0 again. Its probes go on at the interval the
    last burst's had reached instead of starting again from the base one."""
    coef = np.array([0.100, 0.010, 0.005, 0.010])
    policy = ready_policy(coef, 0.5, [0, 1, 2, 3], probe_every=8, max_probe_every=512)
    policy.acceptance = AcceptanceEstimate(successes=5, trials=100)  # only a lone request drafts

    def burst() -> list[Decision]:
        decisions = [policy.choose(16) for _ in range(120)]
        policy.acceptance = AcceptanceEstimate(successes=990, trials=1000)
        tail = [policy.choose(1) for _ in range(20)]
        assert policy.settled > 0, tail
        policy.acceptance = AcceptanceEstimate(successes=5, trials=100)
        return decisions

    first = sum(d.reason == "probe" for d in burst())
    later = [sum(d.reason == "probe" for d in burst()) for _ in range(4)]
    assert first >= 3 and all(n <= 1 for n in later), (first, later)


# A dearer draft than CPU_HOST's: a depth-1 step costs 1.45 plain steps at batch 1, a
# depth-3 one 2.5.
DEAR_DRAFT_HOST = np.array([0.152, 0.0045, 0.060, 0.02])


def depth_0_after(accepted_per_request: list[int], debt: CatchUpDebt | None) -> GoodputPolicy:
    """A policy settled at depth 0 after requests that drafted one at a time at depth 3,
    ten steps each with these tokens accepted per step, the batch owing ``debt``."""
    policy = ready_policy(DEAR_DRAFT_HOST, 0.5, [0, 1, 2, 3])
    policy.settled = 0
    if debt is not None:
        policy.price_catch_up(lambda batch_size: debt)
    for i, accepted in enumerate(accepted_per_request):
        for _ in range(10):
            policy.observe_acceptance([accepted], 3, [f"old-{i}"])
    return policy


MIXED = [0, 0, 3, 0, 0, 3, 0, 3]  # five requests with nothing accepted, three with all


@pytest.mark.parametrize("drafts_well", [True, False])
def test_a_new_request_among_poor_ones_drafts_one_step_to_learn_its_own_rate(
    drafts_well: bool,
) -> None:
    """On a server that catches up, a lone request priced at the recent requests' mean
    (below break-even) would never draft; where the better recent requests' rate pays, it
    drafts one caught-up step whose acceptance counts, then drafts on if it accepted and
    goes back to depth 0 if not, not probed again."""
    policy = depth_0_after(MIXED, CatchUpDebt(50, 128))
    assert policy.predicted_best(1, ["new"]) == 0
    probe = policy.choose(1, ["new"])
    assert probe.reason == "probe-own-rate" and probe.depth > 0
    policy.observe_acceptance([probe.depth if drafts_well else 0], probe.depth, ["new"])
    after = [policy.choose(1, ["new"]) for _ in range(40)]
    assert "probe-own-rate" not in {d.reason for d in after}
    assert (after[-1].depth > 0) == drafts_well, after[-1]


def test_no_own_rate_probe_where_even_the_better_requests_would_not_pay() -> None:
    """Recent requests all poor, a catch-up no draft repays, or no catch-up at all (a
    periodic probe counts its acceptance there): the new request stays at depth 0."""
    for policy in (
        depth_0_after([0] * 8, CatchUpDebt(50, 128)),
        depth_0_after(MIXED, CatchUpDebt(50_000, 128)),
        depth_0_after(MIXED, None),
    ):
        decisions = [policy.choose(1, ["new"]) for _ in range(40)]
        assert {(d.depth, d.reason) for d in decisions} <= {(0, "hold"), (0, "goodput")}


def tail_of_three(**kw) -> GoodputPolicy:
    """Three requests left in a batch: two that accept every draft token, one that has
    nothing accepted; EAGLE pair timings on a 2-core CPU (a depth-1 step costs 1.15 plain
    steps at batch 3)."""
    policy = GoodputPolicy([0, 1], probe_every=10**9, **kw)
    for b, plain, drafting in ((3, 0.100, 0.115), (1, 0.080, 0.090)):
        for _ in range(policy.cost.min_samples + 1):  # the first is a warm-up
            policy.cost.observe(b, 0, plain, PLAIN_CELL)
            policy.cost.observe(b, 1, drafting)
    for _ in range(60):
        policy.observe_acceptance([1, 1, 0], 1, ["good", "also-good", "bad"])
    return policy


def test_no_request_is_drafted_for_slower_than_plain_decoding() -> None:
    """Summed over the batch, drafting wins (the reference, with the guard off, drafts);
    for the request that accepts nothing every step costs more for the same one token, so
    the batch runs at depth 0 while it is in it, and drafts again once it has left."""
    ids = ["good", "also-good", "bad"]
    reference = tail_of_three(every_request_gains=False)
    assert reference.goodput(3, 1, reference.batch_rates(3, ids)) > reference.goodput(3, 0)
    assert reference.choose(3, ids).depth == 1
    guarded = tail_of_three()
    assert [guarded.choose(3, ids).depth for _ in range(5)] == [0] * 5
    assert guarded.predicted_best(3, ids) == 0
    alone = [guarded.choose(1, ["good"]).depth for _ in range(guarded.confirm_steps)]
    assert alone[-1] == 1
