"""The live-change rule the admin route and the scheduler share."""

import pytest

from nanospec_server.adaptive.live import live_change_problem

GOODPUT = {"policy": "goodput", "candidate_depths": [0, 1, 3]}


@pytest.mark.parametrize("key", ["adaptive", "adaptive_depth"])
@pytest.mark.parametrize("published", [None, {"policy": "sglang", "candidate_depths": [0, 3]}])
def test_without_our_policy_no_adaptive_setting_changes(key: str, published: dict | None) -> None:
    problem = live_change_problem({key: 0}, published)
    assert problem is not None and problem.startswith(f"{key}:")
    assert "--nanospec-adaptive" in problem


@pytest.mark.parametrize("changes", [{"adaptive": False}, {"adaptive_depth": 3},
                                     {"adaptive_depth": 0}, {"adaptive_depth": -1}, {}])  # fmt: skip
def test_our_policy_takes_switches_and_candidate_depths(changes: dict) -> None:
    assert live_change_problem(changes, GOODPUT) is None


@pytest.mark.parametrize("depth", [2, 4, 7])
def test_a_depth_that_is_no_candidate_is_refused_with_the_candidates(depth: int) -> None:
    problem = live_change_problem({"adaptive_depth": depth}, GOODPUT)
    assert problem == f"adaptive_depth: {depth} is not a candidate depth [0, 1, 3]"


def test_other_settings_pass_on_any_server() -> None:
    assert live_change_problem({"w_max": 512, "k_ver": 2}, None) is None
