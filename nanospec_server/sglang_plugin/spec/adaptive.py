"""Adaptive speculation inside SGLang's speculative worker, for every draft kind we serve.

SGLang 0.5.23 already switches the draft depth at run time: an `AdaptiveController` holds
one prebuilt runtime state (attention backends, graph runners) per candidate step count and
applies one before each decode step (`activate_step_by_batch`), fed after each verify
(`on_verify_complete_cpu`). Its own policy (`--speculative-adaptive`) covers EAGLE/EAGLE-3
with top-k 1 only, and its STANDALONE worker leaves the controller out. We plug our policy
(`adaptive/policy.py`: goodput under a per-host cost model) into that same controller,
installed after the worker has built its graphs, so STANDALONE drafts and top-k > 1 trees
get it too. Which policy is `--nanospec-adaptive-policy`'s, built through
`adaptive/registry.py` and asked only what `adaptive/depth_policy.py`'s protocol offers. The candidate depths never exceed the launch's `--speculative-num-steps`, so
every buffer SGLang and NanoSpec sized at start (verify width, packed head, windows) fits
them all.

At depth 0 SGLang verifies the last bonus token alone (a plain decode through the verify
path) and then runs the draft extend. We skip that extend (`extend_skipped`, SGLang's own
`_stub_skipped_draft_extend` fills the draft input) unless the NEXT step drafts: the policy
decides that step's depth now (`AdaptiveState.next_step_drafts`), and the step then runs at
it. So a step that drafts always starts from a fresh extend (the draft's top-k, hidden
state and the KV of the last token), while a run of depth-0 steps costs a plain decode
each; the draft's KV cache lacks the tokens of the run but the last (lossless: the target
verifies every draft; fewer drafts accepted while those positions stay in context).
A server that catches up defers each prefill's top-K_pre and the draft's prefill
to the request's first drafting step (`prefill_deferred`); one that does not skips the
top-K_pre of a prefill whose requests join a batch the policy would run at depth 0
(`prefill_topk_skipped`). `--nanospec-adaptive-keep-extend` keeps
every extend (an exact draft cache) and every top-K_pre. NanoSpec's `on_verify` (window
append of the verified token and the target's top-K_ver) runs on every step either way
(`window_update_without_extend`): the window state stays exact.
With `--speculative-adaptive` (SGLang's policy) we install nothing but still time the steps
and publish the depth each one ran at.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter, deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import torch
from sglang.srt.arg_groups.overrides import resolved_view, resolving_view
from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, check_cuda_graph_backend
from sglang.srt.runtime_context import attn_dp_enabled_of, get_exec
from sglang.srt.speculative.adaptive_runtime_state import AdaptiveController, SpecRuntimeState
from sglang.srt.speculative.eagle_info import EagleDraftInput
from sglang.srt.speculative.eagle_utils import (
    _eagle_prefill_tail_tokens,
    get_draft_recurrent_hidden_state_spec,
)
from sglang.srt.speculative.spec_utils import draft_tp_context

from nanospec_server import seams
from nanospec_server.adaptive.calibration import ServerIdentity
from nanospec_server.adaptive.depth_policy import (
    NO_DEBT,
    PLAIN,
    PLAIN_CATCH_UP,
    VERIFY,
    VERIFY_WITHOUT_EXTEND,
    CatchUpDebt,
    DepthPolicy,
    StepRecord,
)
from nanospec_server.adaptive.policy import Decision
from nanospec_server.adaptive.registry import build_policy
from nanospec_server.adaptive.reply_lengths import ReplyLengths
from nanospec_server.config import NanoSpecConfig
from nanospec_server.sglang_plugin.spec import calibration, plain_step
from nanospec_server.sglang_plugin.spec.catch_up import DraftCatchUp
from nanospec_server.sglang_plugin.spec.step_context import current
from nanospec_server.sglang_plugin.spec.verify_capture import LAST_VERIFY

logger = logging.getLogger(__name__)

RECENT_STEPS = 64  # steps /stats/vocab lists, newest last
SKIP_EXTEND_ENV = "SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND"
CUDA_TIME_EVERY = 8  # on a GPU a timed step costs two host syncs: time one step in 8
# The most tokens per request a catch-up may be repaid over (what a request still decodes
# is estimated from the replies that finished last: `ReplyLengths`).
REPAY_HORIZON = 128


class PolicyAdapter:
    """Our depth policy behind SGLang's `AdaptiveSpecPolicy` protocol."""

    def __init__(self, policy: DepthPolicy, state: AdaptiveState) -> None:
        self.policy = policy
        self.state = state
        self._graph_bs: list[int] | None = None

    @property
    def candidate_steps(self) -> list[int]:
        return self.policy.candidates

    def set_cuda_graph_bs(self, cuda_graph_bs: list[int] | None) -> None:
        self._graph_bs = sorted(cuda_graph_bs) if cuda_graph_bs else None

    def cuda_graph_bs_for_step(self, step: int) -> list[int] | None:
        return self._graph_bs  # any batch size may run at any depth

    def get_steps_for_batch(self, batch_size: int) -> int:
        decision = self.state.pending or self.policy.choose(batch_size, self.state.batch_ids())
        self.state.pending = None
        self.state.last_decision = decision
        return decision.depth

    def on_verify_complete(self, num_correct_drafts_per_req: list[int], batch_size: int):
        if self.state.drafting_stale:
            return None  # a probe over a draft cache that missed positions: it errs low
        # The depth in force: with SGLang's overlap schedule (GPU) these counts can arrive a
        # step after a switch, which the estimate absorbs; the CPU path has no overlap.
        # Called from SGLang's result processing of the step `timed_forward` just ran.
        reqs = self.state.last_decode_reqs
        ids = [req.rid for req in reqs] if len(reqs) == len(num_correct_drafts_per_req) else None
        self.policy.observe_acceptance(num_correct_drafts_per_req, self.state.depth_in_force, ids)
        return None  # the next step's `get_steps_for_batch` decides


@dataclass
class AdaptiveState:
    """What one scheduler process publishes about adaptive speculation."""

    policy_name: str  # ours by name ("goodput", "fixed"), "sglang" (--speculative-adaptive), "off"
    candidates: list[int]
    policy: DepthPolicy | None = None
    skip_extend: bool = False  # at depth 0, the draft extend only before a drafting step
    worker: object | None = None  # the EAGLEWorkerV2 (its stub for a skipped extend)
    plain_steps_enabled: bool = False  # depth 0 runs SGLang's plain decode step
    catch_up: DraftCatchUp | None = None  # the draft's KV validity (skipped extends only)
    depth_in_force: int = 0
    last_decision: Decision | None = None
    pending: Decision | None = None  # the next step's depth, decided a step early
    path: str = VERIFY  # the path the step running now takes
    steps_by_depth: Counter = field(default_factory=Counter)
    steps_by_batch_size: Counter = field(default_factory=Counter)
    recent: deque = field(default_factory=lambda: deque(maxlen=RECENT_STEPS))
    last_decode_reqs: list = field(default_factory=list)  # the requests of the last decode step
    reply_lengths: ReplyLengths = field(default_factory=ReplyLengths)  # of finished requests
    batch: object | None = None  # the decode batch of the step running now
    caught_up: int = 0  # positions the draft caught up on in the step running now
    # A probe up from depth 0 drafts without catching up: the next step's drafts, and the
    # step running now's, come from a draft cache that missed positions.
    next_drafts_stale: bool = False
    drafting_stale: bool = False
    timed_steps: int = 0
    # On a CPU, the last decode step's start, record and /stats entry: its cost is observed
    # when the next decode step starts (`close_cycle`), the scheduler's work between them
    # included; None after a prefill ran between (an untimed cycle).
    open_cycle: tuple[float, StepRecord, dict] | None = None
    extends_skipped: int = 0  # depth-0 steps that ran without the draft extend
    plain_steps: int = 0  # depth-0 steps that ran SGLang's plain decode path
    plain_steps_argmax_from_topk: int = 0  # of those, greedy ones that read the top-k pass
    depth_0_verifies: int = 0  # depth-0 steps that ran SGLang's verify (TARGET_VERIFY)
    verify_reasons: Counter = field(default_factory=Counter)  # depth-0 steps kept on verify
    prefill_topks_skipped: int = 0  # prefills that went without NanoSpec's top-K_pre
    prefills_deferred: int = 0  # prefills whose speculative work waits for a drafting step
    draft_prefills_skipped: int = 0  # prefills that went without the draft's (caught up later)
    identity: ServerIdentity | None = None  # what a calibration of this server records
    calibrated_from: str | None = None  # the calibration file the cost model started from

    def record(
        self, batch_size: int, depth: int, seconds: float | None, cycle_from: float | None = None
    ) -> None:
        """Count a decode step; the policy observes its ``seconds``, or with ``cycle_from``
        (its start) the time until the next decode step starts (`close_cycle`)."""
        self.steps_by_depth[depth] += 1
        self.steps_by_batch_size[batch_size] += 1
        reason = self.last_decision.reason if self.last_decision else None
        entry = {"batch_size": batch_size, "depth": depth, "path": self.path, "reason": reason}
        entry["step_ms"] = round(1000 * seconds, 3) if seconds is not None else None
        self.recent.append(entry)
        if self.policy is None:
            return
        record = StepRecord(batch_size, depth, self.path, seconds, self.caught_up)
        if cycle_from is None:
            self.policy.observe_step(record)
        else:
            self.open_cycle = (cycle_from, record, entry)

    def close_cycle(self, now: float | None) -> None:
        """The next decode step starts at ``now`` (None: a prefill or an idle step ran
        since, so the cycle is not one step's): the last one is observed with its cycle."""
        if self.open_cycle is None:
            return
        start, record, entry = self.open_cycle
        self.open_cycle = None
        if now is not None and self.policy is not None:
            entry["cycle_ms"] = round(1000 * (now - start), 3)
            self.policy.observe_step(replace(record, seconds=now - start))

    def catch_up_debt(self, batch_size: int) -> CatchUpDebt:
        """The running batch's catch-up debt: the positions its draft would run over before
        drafting, and the tokens its requests may still decode (each up to
        ``REPAY_HORIZON``)."""
        batch = self.batch
        if self.catch_up is None or batch is None:
            return NO_DEBT
        positions = self.catch_up.owed(self.worker, batch)
        tokens_left = sum(self.tokens_left(req) for req in batch.reqs)
        return CatchUpDebt(positions, round(tokens_left))

    def tokens_left(self, req) -> float:
        """What a request may still decode, up to ``REPAY_HORIZON``: estimated from the
        replies that finished last (`ReplyLengths`), within its max_new_tokens."""
        generated = len(req.output_ids)
        limit = req.sampling_params.max_new_tokens
        limit = generated + REPAY_HORIZON if limit is None else limit
        return min(self.reply_lengths.tokens_left(generated, limit), REPAY_HORIZON)

    def count_finished(self) -> None:
        """At a decode step's start: the last decode step's requests that have finished
        since (each is in one such step after its last token) give their reply lengths.
        Only a server that catches up reads them (`catch_up_debt`)."""
        if self.catch_up is None:
            return
        for req in self.last_decode_reqs:
            if req.finished():
                self.reply_lengths.finished(len(req.output_ids))

    def next_step_drafts(self, batch_size: int) -> bool:
        """Decide the next step's depth now (it runs at it): does it draft?"""
        if self.policy is None:
            return True
        self.pending = self.policy.choose(batch_size, self.batch_ids())
        return self.pending.depth > 0

    def batch_ids(self) -> list[str] | None:
        """The request ids of the decode batch running now (None between steps)."""
        return [req.rid for req in self.batch.reqs] if self.batch is not None else None

    def published(self) -> dict:
        out = {
            "policy": self.policy_name,
            "skip_extend_at_depth_0": self.skip_extend or os.environ.get(SKIP_EXTEND_ENV) == "1",
            "enabled": self.policy.enabled if self.policy else self.policy_name == "sglang",
            "candidate_depths": self.candidates,
            "depth_in_force": self.depth_in_force,
            "extends_skipped": self.extends_skipped,
            "plain_depth_0": self.plain_steps_enabled,
            "plain_steps": self.plain_steps,
            "plain_steps_argmax_from_topk": self.plain_steps_argmax_from_topk,
            "depth_0_verifies": self.depth_0_verifies,
            "depth_0_on_verify_path": dict(self.verify_reasons),
            "catch_up_tokens": self.catch_up.tokens_caught_up if self.catch_up else 0,
            "catch_up_positions_left_stale": (
                self.catch_up.positions_left_stale if self.catch_up else 0
            ),
            "prefill_topks_skipped": self.prefill_topks_skipped,
            "prefills_deferred": self.prefills_deferred,
            "draft_prefills_skipped": self.draft_prefills_skipped,
            "steps_by_depth": {str(k): v for k, v in sorted(self.steps_by_depth.items())},
            "steps_by_batch_size": {str(k): v for k, v in sorted(self.steps_by_batch_size.items())},
            "recent_steps": list(self.recent),
        }
        if self.policy is not None:
            out.update(self.policy.published())
            out["calibrated_from"] = self.calibrated_from
            out["calibration"] = (
                calibration.published(self.policy, self.identity) if self.identity else None
            )
            decision = self.last_decision
            out["last_goodput"] = (
                {str(k): v for k, v in decision.goodput.items()} if decision else {}
            )
        return out


def candidate_depths(worker) -> list[int]:
    """The depths the worker's draft kind lets a policy choose among, up to the launch's."""
    kind = worker._draft_worker.draft_kind
    return kind.candidate_depths(worker.speculative_num_steps, worker.topk)


def install(worker, config: NanoSpecConfig) -> None:
    """AFTER `EAGLEWorkerV2.init_cuda_graphs` (STANDALONE's worker inherits it)."""
    context = current()
    if getattr(worker, "_draft_worker", None) is None:
        return  # a pipeline stage that does not draft
    if worker.adaptive_controller is not None:  # --speculative-adaptive: SGLang's policy
        context.adaptive = AdaptiveState("sglang", worker.adaptive_controller.candidate_steps)
        context.adaptive.depth_in_force = worker.speculative_num_steps
        return
    reason = unsupported_reason(worker.server_args) if config.adaptive else None
    if reason and config.adaptive_by_default:
        logger.warning("nanospec: adaptive speculation is off with %s: fixed depth", reason)
    elif reason:
        raise ValueError(f"--nanospec-adaptive: not with {reason}")
    if not config.adaptive or reason:
        context.adaptive = AdaptiveState("off", [worker.speculative_num_steps])
        context.adaptive.depth_in_force = worker.speculative_num_steps
        return
    candidates = candidate_depths(worker)
    policy = build_policy(config.adaptive_policy, candidates)
    state = AdaptiveState(policy.name, candidates, policy, config.adaptive_skip_extend, worker)
    state.plain_steps_enabled = config.adaptive_plain and plain_step.serves(worker)
    state.identity = calibration.server_identity(worker, candidates)
    if config.adaptive_calibration:
        calibration.start_from(policy, config.adaptive_calibration, state.identity)
        state.calibrated_from = config.adaptive_calibration
    if state.skip_extend and state.plain_steps_enabled:  # the catch-up serves plain steps
        allocator = worker.token_to_kv_pool_allocator
        num_slots = int(allocator.size) + 2 * int(allocator.page_size)
        keeps_hidden = not worker.speculative_algorithm.is_standalone()
        state.catch_up = DraftCatchUp(num_slots, worker.device, keeps_hidden)
        policy.price_catch_up(state.catch_up_debt)
    context.adaptive = state
    controller = AdaptiveController(worker, PolicyAdapter(policy, state))
    with draft_tp_context(worker._draft_worker.parallel_layout):  # as SGLang builds its own
        controller.register(_current_state(worker))
        if worker.topk > 1:  # SGLang's controller would build a chain's width (steps + 1)
            controller.register(worker.build_adaptive_runtime_state(0, 1, cuda_graph_bs=None))
        controller.init_states(cuda_graph_bs=_graph_batch_sizes())
    worker.adaptive_controller = controller
    state.depth_in_force = worker.speculative_num_steps
    logger.info("nanospec: adaptive speculation (%s), depths %s", policy.name, candidates)


def unsupported_reason(server_args) -> str | None:
    """What rules out switching the depth at run time (SGLang refuses its own policy for the
    same reasons; STANDALONE drafts and top-k > 1 trees, which it also refuses, are what ours
    adds). None if nothing does."""
    view, resolving = resolved_view(server_args), resolving_view(server_args)
    if attn_dp_enabled_of(view):
        return "attention DP (each rank would choose its own depth)"
    if view.enable_multi_layer_eagle:
        return "--enable-multi-layer-eagle"
    if resolving.enable_two_batch_overlap:
        return "--enable-two-batch-overlap"
    if resolving.enable_pdmux:
        return "--enable-pdmux"
    return None


def _current_state(worker) -> SpecRuntimeState:
    """The state the worker runs now (what SGLang registers for its own policy)."""
    draft, target = worker._draft_worker, worker._target_worker.model_runner
    return SpecRuntimeState(
        speculative_num_steps=worker.speculative_num_steps,
        speculative_num_draft_tokens=worker.speculative_num_draft_tokens,
        draft_attn_backend=draft.draft_attn_backend,
        cuda_graph_runner=draft.cuda_graph_runner,
        target_attn_backend=target.attn_backend,
        target_graph_runner=target.decode_cuda_graph_runner,
        draft_extend_attn_backend=draft.draft_extend_attn_backend,
        cuda_graph_runner_for_draft_extend=draft.cuda_graph_runner_for_draft_extend,
    )


def _graph_batch_sizes() -> list[int] | None:
    if check_cuda_graph_backend(Phase.DECODE, Backend.DISABLED):
        return None
    return get_exec().graph.cuda_graph_bs_decode


def after_init_cuda_graphs(result, worker, *args, **kwargs):
    install(worker, NanoSpecConfig.from_env())
    return result


def timed_forward(original, worker, batch, *args, **kwargs):
    """AROUND `forward_batch_generation`: a decode step's wall time, at the depth it ran; a
    depth-0 step our policy chose runs SGLang's plain decode path (`plain_step.py`)."""
    state = current().adaptive
    decode = not (batch.forward_mode.is_extend() or batch.is_extend_in_batch)
    if state is None or not decode or batch.forward_mode.is_idle():
        if state is not None:
            state.close_cycle(None)
        return original(worker, batch, *args, **kwargs)
    cuda = worker.device == "cuda" or str(worker.device).startswith("cuda")
    timed = not cuda or state.timed_steps % CUDA_TIME_EVERY == 0
    state.timed_steps += 1
    state.count_finished()
    state.path = VERIFY
    state.batch, state.caught_up = batch, 0
    state.drafting_stale, state.next_drafts_stale = state.next_drafts_stale, False
    if timed and cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    if not cuda:
        state.close_cycle(start)  # the last step's cycle ends where this one's begins
    verifies = LAST_VERIFY.verifies
    result = _plain_depth_zero(worker, batch, state, kwargs.get("on_publish"))
    if result is None:
        result = original(worker, batch, *args, **kwargs)
    if timed and cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start if timed else None
    state.depth_in_force = worker.speculative_num_steps
    state.last_decode_reqs = list(batch.reqs)
    if worker.speculative_num_steps == 0 and LAST_VERIFY.verifies != verifies:
        state.depth_0_verifies += 1
    # On a CPU the policy prices a step by its whole cycle, start to next start: the
    # scheduler's result processing and the next step's preparation run outside this call
    # (2-3 ms a step at batch 8). On CUDA the overlap scheduler runs the next step's host
    # work under this one's kernels: there the synchronized call is the step.
    cycle_from = None if cuda else start
    state.record(batch.seq_lens.shape[0], worker.speculative_num_steps, seconds, cycle_from)
    state.batch = None
    return result


def _plain_depth_zero(worker, batch, state: AdaptiveState, on_publish):
    """The step through SGLang's plain decode path if our policy runs it at depth 0 and no
    request in it needs the verify path; None to run SGLang's speculative step."""
    if state.policy is None or not state.plain_steps_enabled:
        return None
    size = batch.seq_lens.shape[0]
    worker.activate_step_by_batch(size)  # this step's depth, decided once:
    state.pending = state.last_decision  # SGLang's step asks the policy again
    if worker.speculative_num_steps != 0:
        return None
    if reason := plain_step.verify_reason(batch):
        state.verify_reasons[reason] += 1
        return None
    state.pending = None
    state.path = PLAIN
    state.plain_steps += 1
    result, from_top = plain_step.run(worker, batch, LAST_VERIFY.k_ver)
    state.plain_steps_argmax_from_topk += from_top
    if on_publish is not None:
        on_publish(result.new_seq_lens)
    catch_up = state.catch_up
    if catch_up is not None:
        catch_up.forget({req.rid for req in batch.reqs})
        hidden = result.logits_output.hidden_states
        catch_up.missed(batch, batch.out_cache_loc, result.next_token_ids, hidden)
    if state.skip_extend and not state.next_step_drafts(size):
        worker._stub_skipped_draft_extend(batch, result)  # our AFTER hook feeds the window
        state.extends_skipped += 1
        return result
    # A probe drafts one step to time it and returns to depth 0: catching every request
    # up first would cost a draft forward over all it missed since (a prefill's worth at a
    # large batch) for one step. It drafts from the draft's KV as it is (still verified;
    # the acceptance it measures errs low, towards plain decoding).
    probe = state.pending is not None and state.pending.reason == "probe"
    plan = catch_up.plan(worker, batch) if catch_up is not None and not probe else None
    # Its acceptance says how a stale cache drafts, not how the draft does: not counted.
    state.next_drafts_stale = probe and catch_up is not None
    if not probe:  # a probe drafts without them: a top-K_pre over the batch for one step
        worker.draft_worker.nanospec.append_deferred_topk(batch)
    if plan is None or plan.nothing_missed:  # the ordinary one-token draft extend
        with draft_tp_context(worker.draft_worker.parallel_layout):
            worker.draft_worker._draft_extend_for_decode(batch, result)
        # Where the extend runs only before a drafting step, timed apart from plain steps:
        # at a batch size that mostly drafts, the plain steps timed are the ones before a
        # drafting step, and with the extend in them they priced depth 0 a third too dear
        # there. With every extend kept, it is what every depth-0 step costs.
        if state.skip_extend:
            state.path = PLAIN_CATCH_UP
        return result
    _catch_up(worker, batch, result, state, plan)
    return result


def _catch_up(worker, batch, result, state: AdaptiveState, plan) -> None:
    """The draft runs over every position it missed before the next step drafts from it;
    a request with more than a chunk to go keeps the batch at depth 0 for another step."""
    draft = worker.draft_worker
    runtime = draft.nanospec
    runtime.on_verify(batch, result, 0, plain=True)  # the window takes the step's token
    with (
        draft_tp_context(draft.parallel_layout),
        runtime.stats.timer.draft_phase(batch.req_pool_indices),
    ):
        draft_input, lengths = state.catch_up.run(worker, batch, plan, result.next_token_ids)
    runtime.stats.record_catch_up(batch.req_pool_indices.to(torch.int64), lengths)
    state.caught_up = int(lengths.sum())
    following = result.next_draft_input
    following.topk_p, following.topk_index = draft_input.topk_p, draft_input.topk_index
    following.hidden_states = draft_input.hidden_states
    state.path = PLAIN_CATCH_UP
    if not plan.done:
        state.pending = Decision(0, "catch-up", {})


def extend_skipped(batch, batch_output) -> bool:
    """At a depth-0 step whose next step does not draft either: skip the draft extend
    (SGLang's stub fills the draft input, `window_update_without_extend` the window)."""
    state = current().adaptive
    if state is None or not state.skip_extend or batch.forward_mode.is_idle():
        return False
    if state.path == PLAIN:  # the plain step decided already
        return False
    if state.worker.speculative_num_steps != 0:
        return False
    if state.next_step_drafts(batch.seq_lens.shape[0]):
        return False
    state.worker._stub_skipped_draft_extend(batch, batch_output)
    state.path = VERIFY_WITHOUT_EXTEND
    state.extends_skipped += 1
    return True


def prefill_deferred(batch) -> bool:
    """Whether this prefill defers NanoSpec's top-K_pre (where the draft kind does not take
    its own in the target's forward) and the draft's prefill (``skipped_draft_prefill``) to
    its requests' first drafting step, on a server that
    catches up, unless every step drafts. Under load most requests never draft, and a
    burst of arrivals is prefilled a chunk at a time: its first requests, prefilled into a
    small batch, would pay a full-vocabulary LM head and a draft forward over their prompts
    for a batch that then runs at depth 0 (on a fresh server too, before the policy can
    tell). A request that drafts pays the same work one step later (the catch-up runs the
    draft over the prompt, `NanoSpecRuntime.append_deferred_topk` the top-K_pre)."""
    state = current().adaptive
    if state is None or state.catch_up is None or state.policy.always_drafts():
        return False
    state.prefills_deferred += 1
    return True


def prefill_topk_skipped(batch) -> bool:
    """On a server that does not catch up (CUDA, tensor parallelism), whether this prefill
    goes without NanoSpec's top-K_pre: when the batch its requests join (them, the last
    decode step's requests and those waiting to be prefilled: a burst of arrivals is
    prefilled a chunk at a time) would run at depth 0, as a fresh decision of our policy
    predicts it (or it is pinned there). Those top-K_pre are a
    full-vocabulary LM head over every prompt position, most of what a speculative server
    adds to a short request's cost under load (~4 ms per prompt token for a 152k x 896
    head on one core). A request prefilled so drafts from its prompt's tokens and the
    target's top-K_ver of every step since, once drafting resumes (lossless either way)."""
    state = current().adaptive
    if state is None or state.policy is None or not state.skip_extend:
        return False
    # The requests of the last decode step still running (the step's size counted the
    # ones that have finished since: a lone request's successor joined a batch of 2).
    running = sum(1 for req in state.last_decode_reqs if not req.finished())
    scheduler = current().scheduler
    waiting = len(getattr(scheduler, "waiting_queue", ()))
    if state.policy.predicted_best(running + len(batch.reqs) + waiting) != 0:  # None: not ready
        return False
    state.prefill_topks_skipped += 1
    return True


def skipped_draft_prefill(draft, batch, next_token_ids, target_hidden):
    """A deferred prefill skips the draft's prefill (a STANDALONE draft's whole forward over
    every prompt token; an EAGLE head's layer and, where SGLang's FR-Spec map is off, its
    LM head): the draft catches up on the prompt later, from its tokens and, for EAGLE
    kinds, the target's hidden states ``target_hidden`` kept at its slots. Its slots are
    noted as missed and the next decode step runs at depth 0, catching up before any step
    drafts. Returns the draft input it leaves (zeros: never drafted from), or None to run
    the prefill."""
    state = current().adaptive
    catch_up = state.catch_up if state is not None else None
    if catch_up is None or not state.plain_steps_enabled:
        return None
    if not catch_up.hidden_complete(target_hidden, batch.out_cache_loc.shape[0]):
        return None  # no hidden state at every position to catch up from
    tails = _eagle_prefill_tail_tokens(batch, next_token_ids)
    catch_up.missed_prefill(batch, tails, target_hidden)
    state.pending = Decision(0, "catch-up", {})
    state.draft_prefills_skipped += 1
    size, topk = len(batch.reqs), draft.topk
    device = next_token_ids.device
    stub = EagleDraftInput(
        topk_p=torch.zeros((size, topk), dtype=torch.float32, device=device),
        topk_index=torch.zeros((size, topk), dtype=torch.int64, device=device),
        bonus_tokens=next_token_ids,
        num_tokens_per_req=1,
        num_tokens_for_logprob_per_req=1,
    )
    # an EAGLE draft input carries the draft's last hidden state: the running batch's
    # rows and these are concatenated when the batches merge
    width, dtype = get_draft_recurrent_hidden_state_spec(draft.draft_runner)
    if width is not None:
        stub.hidden_states = torch.zeros((size, width), dtype=dtype, device=device)
    return stub


@contextmanager
def timed_draft_prefill(batch) -> Iterator[None]:
    """On a server that catches up, a draft prefill's wall time over its positions: what a
    catch-up over as many costs, before the policy has timed a catch-up of its own."""
    state = current().adaptive
    if state is None or state.catch_up is None:
        yield
        return
    start = time.perf_counter()
    yield
    state.policy.observe_draft_extend(batch.extend_num_tokens, time.perf_counter() - start)


@contextmanager
def widened_prefill(draft, batch, hidden) -> Iterator[tuple[bool, object]]:
    """`DraftCatchUp.widened_prefill` where the server catches up, else nothing (False and
    the prefill's hidden states)."""
    state = current().adaptive
    if state is None or state.catch_up is None:
        yield False, hidden
        return
    with state.catch_up.widened_prefill(state.worker, batch, hidden) as widened:
        yield widened


def window_update_without_extend(result, worker, batch, batch_output, *args, **kwargs):
    """AFTER `_stub_skipped_draft_extend`: the depth-0 step's verified token and top-K_ver
    enter NanoSpec's window, as the skipped draft extend would have had them enter; on the
    verify path the step's KV slots are the draft's to catch up on (the plain step notes
    its own)."""
    plain = plain_step_running()
    worker._draft_worker.nanospec.on_verify(batch, batch_output, 0, plain)
    state = current().adaptive
    if not plain and state is not None and state.catch_up is not None:
        hidden = batch_output.logits_output.hidden_states
        verified = batch_output.next_draft_input.bonus_tokens
        state.catch_up.missed(batch, batch.out_cache_loc, verified, hidden)
    return result


def draft_wrote(slots) -> None:
    """The draft wrote its KV at these slots along with the target (prefill, extend)."""
    state = current().adaptive
    if state is not None and state.catch_up is not None and slots is not None:
        state.catch_up.drafted(slots)


def probing() -> bool:
    """Whether the step running now is a probe (one step at a neighbouring depth)."""
    state = current().adaptive
    decision = state.last_decision if state is not None else None
    return decision is not None and decision.reason == "probe"


def plain_step_running() -> bool:
    """Whether the step running now is a depth-0 step on SGLang's plain decode path."""
    state = current().adaptive
    return state is not None and state.path == PLAIN


def register_hooks() -> None:
    seams.hook(seams.WORKER_INIT_CUDA_GRAPHS, after_init_cuda_graphs)
    seams.hook(seams.WORKER_FORWARD, timed_forward)
    seams.hook(seams.WORKER_SKIPPED_EXTEND, window_update_without_extend)


def apply_live(config: NanoSpecConfig) -> None:
    state = current().adaptive
    if state is not None and state.policy is not None:
        state.policy.enabled = config.adaptive
        state.policy.pinned = None if config.adaptive_depth == -1 else config.adaptive_depth


def published() -> dict | None:
    state = current().adaptive
    return state.published() if state is not None else None


def live_change_state() -> dict | None:
    """The two fields of `published` a live change is checked against (`adaptive/live.py`),
    without building the rest (the calibration is a pass over every timed cell)."""
    state = current().adaptive
    if state is None:
        return None
    return {"policy": state.policy_name, "candidate_depths": state.candidates}
