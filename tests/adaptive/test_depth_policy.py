"""Every registered depth policy against the DepthPolicy protocol, and the fixed policy's
own rule (the goodput policy's is in test_policy.py)."""

from __future__ import annotations

import pytest

from nanospec_server.adaptive.depth_policy import VERIFY, DepthPolicy, StepRecord
from nanospec_server.adaptive.fixed import FixedDepthPolicy
from nanospec_server.adaptive.live import live_change_problem
from nanospec_server.adaptive.registry import POLICIES, build_policy, policy_names
from nanospec_server.config import NanoSpecConfig

CANDIDATES = [0, 1, 2, 3]


@pytest.fixture(params=policy_names())
def policy(request) -> DepthPolicy:
    return build_policy(request.param, CANDIDATES)


def test_a_registered_policy_speaks_the_protocol(policy: DepthPolicy) -> None:
    assert isinstance(policy, DepthPolicy)
    assert policy.name in POLICIES and policy.candidates == CANDIDATES
    for _ in range(40):
        decision = policy.choose(2)
        assert decision.depth in CANDIDATES
        policy.observe_step(StepRecord(2, decision.depth, VERIFY, 0.01 + 0.002 * decision.depth))
        policy.observe_acceptance([decision.depth, 0], decision.depth)
    best = policy.predicted_best(2)
    assert best is None or best in CANDIDATES
    published = policy.published()
    assert published["pinned_depth"] is None and 0 < published["acceptance_rate"] < 1


def test_a_pin_and_the_switch_mean_the_same_for_every_policy(policy: DepthPolicy) -> None:
    policy.pinned = 1
    assert policy.choose(4).depth == 1 and policy.predicted_best(4) == 1
    assert policy.published()["pinned_depth"] == 1
    policy.pinned, policy.enabled = None, False
    assert policy.choose(4).depth == 3 and policy.predicted_best(4) == 3


def test_an_untimed_step_is_observed_without_harm(policy: DepthPolicy) -> None:
    policy.observe_step(StepRecord(1, 3, VERIFY, None))
    assert policy.choose(1).depth in CANDIDATES


def test_the_fixed_policy_drafts_at_the_deepest_candidate_whatever_it_observes() -> None:
    policy = FixedDepthPolicy([3, 0, 2])
    assert policy.candidates == [0, 2, 3]
    for batch_size in (1, 8, 64):
        policy.observe_step(StepRecord(batch_size, 3, VERIFY, 10.0 * batch_size))
        decision = policy.choose(batch_size)
        assert (decision.depth, decision.reason) == (3, "fixed")
    assert policy.published()["fixed_depth"] == 3


def test_unknown_policies_and_bad_candidates_are_refused() -> None:
    with pytest.raises(ValueError, match="known: goodput, fixed"):
        build_policy("bogus", CANDIDATES)
    with pytest.raises(ValueError, match="non-negative"):
        build_policy("fixed", [-1, 2])
    with pytest.raises(ValueError, match="adaptive_policy"):
        NanoSpecConfig(adaptive_policy="bogus")


def test_every_policy_of_ours_switches_live() -> None:
    published = {"policy": "fixed", "candidate_depths": CANDIDATES}
    assert live_change_problem({"adaptive_depth": 2}, published) is None
    assert "not a candidate" in live_change_problem({"adaptive_depth": 7}, published)
    assert "--nanospec-adaptive" in live_change_problem({"adaptive": True}, {"policy": "sglang"})
