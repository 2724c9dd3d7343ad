"""What rules out our adaptive policy at start, and which depths it chooses among."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from nanospec_server import host


@pytest.fixture(scope="module")
def adaptive():
    host.prepare_cpu_environment()  # before SGLang's platform detection
    from nanospec_server.sglang_plugin.spec import adaptive

    return adaptive


def server_args(*extra: str):
    from sglang.srt.server_args import prepare_server_args

    from nanospec_server.models.tiny import tiny_model_path

    argv = ["--model-path", str(tiny_model_path("agree-target")), "--device", "cpu"]
    argv += ["--speculative-algorithm", "STANDALONE", "--speculative-eagle-topk", "2"]
    argv += ["--speculative-draft-model-path", str(tiny_model_path("agree-standalone"))]
    argv += ["--speculative-num-steps", "3", "--speculative-num-draft-tokens", "6", *extra]
    args = prepare_server_args(argv)
    args.resolve_once()
    return args


def test_standalone_trees_are_ours_to_adapt_but_two_batch_overlap_is_not(adaptive) -> None:
    assert adaptive.unsupported_reason(server_args()) is None  # SGLang refuses both
    assert adaptive.unsupported_reason(server_args("--enable-two-batch-overlap")) == (
        "--enable-two-batch-overlap"
    )


def test_a_chain_adapts_every_depth_a_tree_all_or_nothing(adaptive) -> None:
    from nanospec_server.sglang_plugin.spec.draft_kinds.registry import KINDS

    for kind in KINDS:
        draft = SimpleNamespace(draft_kind=kind())

        def depths(topk: int, draft=draft) -> list[int]:
            worker = SimpleNamespace(speculative_num_steps=4, topk=topk, _draft_worker=draft)
            return adaptive.candidate_depths(worker)

        assert depths(1) == [0, 1, 2, 3, 4], kind.name
        assert depths(4) == [0, 4], kind.name


def test_a_probe_over_a_stale_draft_cache_does_not_feed_the_acceptance(adaptive) -> None:
    """A probe up from depth 0 drafts without catching up: its drafts come from a cache
    that missed positions, and they would drag the estimate below what the draft does."""
    from nanospec_server.adaptive.policy import GoodputPolicy

    policy = GoodputPolicy([0, 1, 2])
    state = adaptive.AdaptiveState("goodput", [0, 1, 2], policy)
    adapter = adaptive.PolicyAdapter(policy, state)
    state.depth_in_force = 2
    state.drafting_stale = True
    adapter.on_verify_complete([0, 0, 0], 3)
    assert policy.acceptance.rate == pytest.approx(0.5)  # the prior, untouched
    state.drafting_stale = False
    adapter.on_verify_complete([0, 0, 0], 3)
    assert policy.acceptance.rate < 0.5


def test_acceptance_reaches_the_policy_per_request_and_decisions_name_the_batch(adaptive) -> None:
    """SGLang's result processing hands the counts in the order of the step's requests; the
    policy learns each request's own rate and decides on the batch's requests."""
    from nanospec_server.adaptive.policy import GoodputPolicy

    policy = GoodputPolicy([0, 1, 2])
    state = adaptive.AdaptiveState("goodput", [0, 1, 2], policy)
    adapter = adaptive.PolicyAdapter(policy, state)
    state.depth_in_force = 2
    state.last_decode_reqs = [SimpleNamespace(rid="good"), SimpleNamespace(rid="bad")]
    for _ in range(10):
        adapter.on_verify_complete([2, 0], 2)
    good, bad = policy.requests.rates(["good", "bad"], policy.acceptance.rate)
    assert good > 0.8 and bad < 0.2
    state.batch = SimpleNamespace(reqs=state.last_decode_reqs)
    assert state.batch_ids() == ["good", "bad"]
    adapter.on_verify_complete([0], 2)  # counts that do not match the step: no request rate
    assert policy.requests.rates(["good"], policy.acceptance.rate)[0] == pytest.approx(
        good, abs=0.01
    )


def test_finished_replies_set_what_a_running_request_may_still_decode(adaptive) -> None:
    """A request that finished is counted at the next decode step's start (`timed_forward`
    then replaces the step's requests); the catch-up is then priced over what the replies
    before it ran past a running request's length."""

    def request(generated: int, done: bool, limit: int | None = 128) -> SimpleNamespace:
        return SimpleNamespace(
            output_ids=[0] * generated,
            finished=lambda: done,
            sampling_params=SimpleNamespace(max_new_tokens=limit),
        )

    state = adaptive.AdaptiveState("goodput", [0, 1])
    state.last_decode_reqs = [request(13, True)]
    state.count_finished()  # a server that does not catch up keeps no reply lengths
    state.catch_up = SimpleNamespace()  # one that does
    young = request(10, False)
    assert state.tokens_left(young) == 118
    assert state.tokens_left(request(10, False, limit=None)) == adaptive.REPAY_HORIZON
    for length in (13, 15, 17, 19):
        state.last_decode_reqs = [request(length, True), young]
        state.count_finished()
    assert state.tokens_left(young) == pytest.approx(6.0)  # (3 + 5 + 7 + 9) / 4


def test_a_plain_step_that_runs_the_draft_extend_is_timed_apart(adaptive, monkeypatch) -> None:
    """A depth-0 step before a drafting step runs the draft's one-token extend after the
    plain decode: recorded as a catch-up step, never in the plain cell that prices depth 0
    (where drafting is the rule, such steps were most of that cell's timings)."""
    from contextlib import nullcontext

    import torch

    from nanospec_server.adaptive.fixed import FixedDepthPolicy

    policy = FixedDepthPolicy([0, 3], pinned=3)  # the next step drafts
    state = adaptive.AdaptiveState("fixed", [0, 3], policy, skip_extend=True)
    state.plain_steps_enabled = True
    paths_while_extending = []
    draft_worker = SimpleNamespace(
        parallel_layout=None,
        nanospec=SimpleNamespace(append_deferred_topk=lambda batch: None),
        _draft_extend_for_decode=lambda batch, result: paths_while_extending.append(state.path),
    )
    worker = SimpleNamespace(
        speculative_num_steps=0, activate_step_by_batch=lambda size: None, draft_worker=draft_worker
    )
    monkeypatch.setattr(adaptive, "draft_tp_context", lambda layout: nullcontext())
    monkeypatch.setattr(adaptive.plain_step, "verify_reason", lambda batch: None)
    monkeypatch.setattr(
        adaptive.plain_step, "run", lambda worker, batch, k: (SimpleNamespace(), False)
    )
    adaptive._plain_depth_zero(worker, SimpleNamespace(seq_lens=torch.zeros(2)), state, None)
    assert paths_while_extending == ["plain"]  # the window takes the step as a plain one
    assert state.path == "plain-catch-up"
    state.skip_extend = False  # every extend kept: what every depth-0 step costs
    adaptive._plain_depth_zero(worker, SimpleNamespace(seq_lens=torch.zeros(2)), state, None)
    assert state.path == "plain"


def test_a_step_is_priced_by_its_cycle_unless_a_prefill_ran_between(adaptive) -> None:
    """On a CPU the policy observes a decode step when the next one starts, with the time
    from start to start (the scheduler's work between them is part of what a step costs);
    a prefill between them leaves that cycle untimed."""
    observed = []
    policy = SimpleNamespace(observe_step=observed.append)
    state = adaptive.AdaptiveState("goodput", [0, 1], policy)
    state.record(4, 1, 0.010, cycle_from=100.0)
    assert observed == []  # not before the next step starts
    state.close_cycle(100.025)
    assert [(r.batch_size, r.depth, r.seconds) for r in observed] == [(4, 1, pytest.approx(0.025))]
    assert state.recent[-1]["step_ms"] == 10.0 and state.recent[-1]["cycle_ms"] == 25.0
    state.record(4, 0, 0.008, cycle_from=200.0)
    state.close_cycle(None)  # a prefill ran: the cycle is not one step's
    state.close_cycle(200.5)
    assert len(observed) == 1 and "cycle_ms" not in state.recent[-1]
    state.record(4, 0, 0.008)  # a CUDA step: its own synchronized time, at once
    assert observed[-1].seconds == 0.008


def test_a_probe_step_is_told_apart(adaptive, monkeypatch) -> None:
    """The draft worker skips the deferred top-K_pre at a probe's extend (the batch most
    likely returns to depth 0 after it): it asks ``probing``, which reads the decision in
    force for the step."""
    from nanospec_server.adaptive.policy import Decision, GoodputPolicy
    from nanospec_server.sglang_plugin.spec.step_context import current

    state = adaptive.AdaptiveState("goodput", [0, 1, 2], GoodputPolicy([0, 1, 2]))
    monkeypatch.setattr(current(), "adaptive", state)
    assert not adaptive.probing()  # no decision yet
    state.last_decision = Decision(1, "probe", {})
    assert adaptive.probing()
    state.last_decision = Decision(1, "goodput", {})
    assert not adaptive.probing()
