"""Starting a policy from a calibration file inside the worker: refused, naming the flag,
when the file was recorded on another server or cannot be read."""

from __future__ import annotations

import pytest

from nanospec_server.adaptive.calibration import Calibration, CostTimings, write_calibration
from nanospec_server.adaptive.policy import GoodputPolicy
from nanospec_server.sglang_plugin.spec import calibration
from tests.adaptive.test_calibration import IDENTITY, measured_policy


@pytest.fixture
def calibration_file(tmp_path):
    timings = CostTimings.model_validate(measured_policy().cost_timings())
    path = tmp_path / "calibration.json"
    write_calibration(Calibration(server=IDENTITY, timings=timings), path)
    return path


def test_a_calibration_of_this_server_starts_the_policy(calibration_file) -> None:
    policy = GoodputPolicy([0, 1, 2, 4])
    calibration.start_from(policy, str(calibration_file), IDENTITY)
    assert policy.cost.ready
    published = calibration.published(policy, IDENTITY)
    assert Calibration.model_validate(published) == Calibration.model_validate_json(
        calibration_file.read_text()
    )


def test_a_calibration_from_another_server_is_refused(calibration_file) -> None:
    policy = GoodputPolicy([0, 1, 2, 4])
    other = IDENTITY.model_copy(update={"dtype": "float32", "candidates": [0, 3]})
    with pytest.raises(ValueError) as refused:
        calibration.start_from(policy, str(calibration_file), other)
    message = str(refused.value)
    assert message.startswith("--nanospec-adaptive-calibration: ")
    assert "dtype: 'bfloat16' != 'float32'" in message and "candidates" in message
    assert not policy.cost.ready  # nothing of it taken


def test_an_unreadable_calibration_names_the_flag(tmp_path) -> None:
    with pytest.raises(ValueError, match="^--nanospec-adaptive-calibration: cannot read"):
        calibration.start_from(GoodputPolicy([0, 1]), str(tmp_path / "none.json"), IDENTITY)
