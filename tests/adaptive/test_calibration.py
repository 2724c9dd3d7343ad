"""A calibration file: what a policy's cost model keeps, written and read back, and a
fresh policy started from it deciding as the measured one does, without exploring."""

from __future__ import annotations

import json

import numpy as np
import pytest

from nanospec_server.adaptive.calibration import (
    Calibration,
    CostTimings,
    ServerIdentity,
    read_calibration,
    write_calibration,
)
from nanospec_server.adaptive.depth_policy import CatchUpDebt
from nanospec_server.adaptive.policy import (
    CATCH_UP_CELL,
    PLAIN_CELL,
    VERIFY_CELL,
    GoodputPolicy,
    step_features,
)

# A 2-core CPU's steps: a verify of ``k`` drafts costs more than a plain step, by batch.
VERIFY_COST = np.array([0.040, 0.004, 0.006, 0.002])
PLAIN_COST = np.array([0.036, 0.003])
IDENTITY = ServerIdentity(
    cpu="AMD EPYC",
    threads=2,
    dtype="bfloat16",
    target="/models/target",
    draft="/models/draft",
    algorithm="EAGLE",
    tp_size=1,
    candidates=[0, 1, 2, 4],
)


def measured_policy() -> GoodputPolicy:
    """A policy that timed every candidate at batch 1, 2, 4 and 8 (each cell's first
    timing a warm-up), with catch-ups and a prefill's draft extend."""
    policy = GoodputPolicy([0, 1, 2, 4])
    for b in (1, 2, 4, 8):
        for _ in range(4):
            policy.cost.observe(b, 0, float(PLAIN_COST @ [1, b]), PLAIN_CELL)
            for k in (1, 2, 4):
                policy.cost.observe(b, k, float(step_features(b, k) @ VERIFY_COST), VERIFY_CELL)
    for _ in range(4):
        policy.cost.observe(4, 0, 0.09, CATCH_UP_CELL, caught_up=40)
    policy.cost.observe_draft_extend(200, 0.2)
    return policy


def test_a_calibration_survives_its_file(tmp_path) -> None:
    timings = CostTimings.model_validate(measured_policy().cost_timings())
    path = tmp_path / "calibration.json"
    write_calibration(Calibration(server=IDENTITY, timings=timings), path)
    assert read_calibration(path) == Calibration(server=IDENTITY, timings=timings)
    cells = {(c.batch_size, c.depth, c.path) for c in timings.cells}
    assert len(cells) == 4 * 4 + 1  # every size at every depth, and the catch-up cell


def test_a_policy_started_from_a_calibration_prices_as_the_measured_one() -> None:
    measured = measured_policy()
    fresh = GoodputPolicy([0, 1, 2, 4])
    assert fresh.predicted_best(4) is None  # nothing timed: it would explore
    fresh.calibrate(measured.cost_timings())
    assert fresh.cost.ready
    for b in (1, 2, 3, 4, 6, 8):
        for k in (0, 1, 2, 4):
            assert fresh.cost.predict(b, k) == pytest.approx(measured.cost.predict(b, k))
    assert fresh.cost.seconds_per_position() == pytest.approx(measured.cost.seconds_per_position())
    fresh.observe_acceptance([4, 4, 4, 4], 4)  # a draft that is always right
    measured.observe_acceptance([4, 4, 4, 4], 4)
    decision = fresh.choose(4)
    assert decision.reason == "goodput"
    assert decision.depth == measured.choose(4).depth > 0


def test_live_timings_outvote_the_calibration() -> None:
    fresh = GoodputPolicy([0, 1, 2, 4])
    fresh.calibrate(measured_policy().cost_timings())
    calibrated = fresh.cost.predict(4, 2)
    slower = 2 * calibrated
    fresh.cost.observe(4, 2, slower)  # this process's warm-up step: not a timing
    for _ in range(fresh.cost.min_samples):
        fresh.cost.observe(4, 2, slower)
    assert fresh.cost.predict(4, 2) == pytest.approx((calibrated + slower) / 2)  # a tie
    fresh.cost.observe(4, 2, slower)
    assert fresh.cost.predict(4, 2) == pytest.approx(slower)


def test_a_calibration_from_another_server_names_what_differs() -> None:
    elsewhere = IDENTITY.model_copy(update={"cpu": "Intel Xeon", "threads": 4})
    assert elsewhere.differences(IDENTITY) == [
        "cpu: 'Intel Xeon' != 'AMD EPYC'",
        "threads: 4 != 2",
    ]
    assert IDENTITY.differences(IDENTITY) == []


@pytest.mark.parametrize(
    ("content", "named"),
    [
        ("{", "is not JSON"),
        ('{"server": {}}', "server.cpu"),
        (None, "cannot read"),
    ],
)
def test_a_bad_calibration_file_says_what_is_wrong(tmp_path, content, named) -> None:
    path = tmp_path / "calibration.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match=named):
        read_calibration(path)


def test_a_cell_on_an_unknown_path_is_refused(tmp_path) -> None:
    timings = CostTimings.model_validate(measured_policy().cost_timings()).model_dump()
    timings["cells"][0]["path"] = "verfy"
    path = tmp_path / "calibration.json"
    calibration = {"format": 1, "server": IDENTITY.model_dump(), "timings": timings}
    path.write_text(json.dumps(calibration))
    with pytest.raises(ValueError, match="timings.cells.0.path"):
        read_calibration(path)


def test_a_fixed_depth_policy_has_nothing_to_calibrate() -> None:
    from nanospec_server.adaptive.fixed import FixedDepthPolicy

    policy = FixedDepthPolicy([0, 1, 2, 4])
    policy.calibrate(measured_policy().cost_timings())
    assert policy.cost_timings() is None
    assert policy.choose(8).depth == 4


def test_a_policy_not_ready_keeps_no_calibration() -> None:
    policy = GoodputPolicy([0, 1, 2, 4])
    policy.price_catch_up(lambda b: CatchUpDebt(0, 0))
    policy.cost.observe(1, 0, 0.05, PLAIN_CELL)
    assert policy.cost_timings() is None
