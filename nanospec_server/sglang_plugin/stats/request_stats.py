"""Per-request NanoSpec statistics: counters on the device, read on the host once per chunk.

Counters are indexed by the request slot (SGLang's `req_pool_idx`) and updated with
tensor ops inside the speculative step, so the step never waits on the host. The output
streamer turns them into one plain dict per request when it emits a chunk.

The host side keeps what the admin layer publishes: the requests running now (tracked
from the output streamer, which sees every batch), a bounded history of finished ones,
and totals since start. Only counts and figures, never prompt or output text.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from sglang.srt.constants import HEALTH_CHECK_RID_PREFIX
from torch import Tensor

from nanospec_server.config import DEFAULT_HISTORY
from nanospec_server.env import stats_history
from nanospec_server.sglang_plugin.stats import metrics
from nanospec_server.sglang_plugin.stats.step_timer import StepTimer

# Counter columns, one row per slot. COVERED: emitted tokens in the active set;
# COVERED_BY_HEAD: in the draft head's own vocabulary (all of them but for an EAGLE-3 d2t).
STEPS, ACCEPTED, EMITTED, COVERED, ACTIVE_SUM, ACTIVE_MAX, ROWS_SUM, HEAD_CALLS = range(8)
COVERED_BY_HEAD = 8
DRAFTED = 9  # the depth each step ran at, summed (adaptive speculation changes it)
# Depth-0 steps that ran SGLang's plain decode path (each emitted one token and drafted
# none; not draft steps), and tokens the draft caught up on after a run of them.
PLAIN_STEPS, CATCH_UP = 10, 11
NUM_COUNTERS = 12


def is_health_check(rid: object) -> bool:
    """SGLang's `/health` and `/health_generate` run a one-token generate under such a rid.
    A router probes every worker every few seconds: counted, these would outnumber the real
    requests of an idle fleet and drag every mean towards one-token prompts."""
    return isinstance(rid, str) and rid.startswith(HEALTH_CHECK_RID_PREFIX)


def history_size() -> int:
    return max(1, int(raw if (raw := stats_history()) is not None else DEFAULT_HISTORY))


@dataclass
class RunningRequest:
    """A request that has reached a batch and not finished yet."""

    req: Any  # SGLang's Req: read for token counts only, dropped when it finishes
    started_at: float
    w_max: int | None  # the window length in force at its latest step

    def describe(self, stats: dict, state: str, finished_at: float | None = None) -> dict:
        return {
            "rid": self.req.rid,
            "state": state,
            "prompt_tokens": len(self.req.origin_input_ids),
            # as SGLang counts completion tokens: a last verify step may accept past the
            # stop (max_new_tokens, a stop token), and what lies past it is never sent
            "output_tokens": len(self.req.output_ids_through_stop),
            "w_max": self.w_max,
            "started_at": self.started_at,
            "finished_at": finished_at,
            **stats,
        }


@dataclass
class Totals:
    """Raw sums over every request that ended, finished or aborted (its steps ran all the
    same); the admin layer derives means (across DP ranks too)."""

    requests: int = 0  # finished normally
    aborted: int = 0  # ended by an abort: a client that went away, /abort_request
    prompt_tokens: int = 0
    output_tokens: int = 0
    draft_steps: int = 0
    plain_steps: int = 0
    catch_up_tokens: int = 0
    emitted_tokens: int = 0
    covered_tokens: int = 0
    covered_by_head_tokens: int = 0
    active_vocab_sum: int = 0
    lm_head_rows: int = 0
    lm_head_calls: int = 0

    def add(self, entry: dict) -> None:
        if entry["state"] == "aborted":
            self.aborted += 1
        else:
            self.requests += 1
        self.prompt_tokens += entry["prompt_tokens"]
        self.output_tokens += entry["output_tokens"]
        self.draft_steps += entry["draft_steps"]
        self.plain_steps += entry["plain_steps"]
        self.catch_up_tokens += entry["catch_up_tokens"]
        self.emitted_tokens += entry["emitted_tokens"]
        self.covered_tokens += entry["covered_tokens"]
        self.covered_by_head_tokens += entry["covered_by_head_tokens"]
        self.active_vocab_sum += entry["active_vocab_sum"]
        self.lm_head_rows += entry["lm_head_rows"]
        self.lm_head_calls += entry["lm_head_calls"]


class RequestStats:
    def __init__(self, num_slots: int, vocab_size: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.counters = torch.zeros(num_slots, NUM_COUNTERS, dtype=torch.int64, device=device)
        # What one plain step adds to a request's counters (one index_add_ a step).
        self.plain_step_row = torch.zeros(1, NUM_COUNTERS, dtype=torch.int64, device=device)
        self.plain_step_row[0, [PLAIN_STEPS, EMITTED]] = 1
        self.timer = StepTimer(num_slots, enabled=device.type == "cpu")
        self.running: dict[str, RunningRequest] = {}
        self.finished: OrderedDict[str, dict] = OrderedDict()
        self.history = history_size()
        self.totals = Totals()
        self.started_at = time.time()
        self.w_max_published: int | None = None

    def reset(self, slots: Tensor) -> None:
        self.counters[slots] = 0
        self.timer.reset(slots)

    def record_verify(
        self,
        slots: Tensor,
        accept_lens: Tensor,
        covered: Tensor,
        active_size: Tensor,
        covered_by_head: Tensor,
        depth: int,
    ) -> None:
        """One speculative step at this draft depth: tokens emitted (accepted + bonus), how
        many were in I (of the draft head: I ∩ D), and how many in the head's vocabulary D."""
        delta = torch.zeros(len(slots), NUM_COUNTERS, dtype=torch.int64, device=slots.device)
        delta[:, STEPS] = 1
        delta[:, ACCEPTED] = accept_lens - 1  # draft tokens the target accepted
        delta[:, EMITTED] = accept_lens
        delta[:, COVERED] = covered
        delta[:, ACTIVE_SUM] = active_size
        delta[:, COVERED_BY_HEAD] = covered_by_head
        delta[:, DRAFTED] = depth
        self.counters.index_add_(0, slots, delta)
        maxed = torch.maximum(self.counters[slots, ACTIVE_MAX], active_size)
        self.counters[slots, ACTIVE_MAX] = maxed

    def record_plain(self, slots: Tensor) -> None:
        """One depth-0 step on the plain decode path: one token each, nothing drafted."""
        self.counters.index_add_(0, slots, self.plain_step_row.expand(len(slots), -1))

    def record_catch_up(self, slots: Tensor, tokens: Tensor) -> None:
        """Tokens the draft ran over to catch up on these requests' depth-0 steps."""
        self.counters[slots, CATCH_UP] += tokens.to(torch.int64)

    def record_head(self, slots: Tensor, rows: int | Tensor) -> None:
        """One draft LM-head call over `rows` rows for each of these requests."""
        self.counters[slots, ROWS_SUM] += rows
        self.counters[slots, HEAD_CALLS] += 1

    def snapshot(
        self, slots: list[int], active_now: list[int], stream_len: list[int]
    ) -> list[dict]:
        """Host dicts for these slots: the one device-to-host copy per output chunk."""
        rows = self.counters[slots].tolist()
        return [
            _to_dict(row, active, length, self.vocab_size) | _timing(row[STEPS], timed)
            for row, active, length, timed in zip(
                rows, active_now, stream_len, self.timer.read(slots), strict=True
            )
        ]

    # -- host bookkeeping for the admin layer ---------------------------------------------

    def track(
        self, reqs, w_max: int | None, w_max_of: Callable[[Any], int | None] | None = None
    ) -> None:
        """Every batch the output streamer sees: note new requests and the W_max in force
        (the live ``w_max``, published as a metric; ``w_max_of(req)``: a request's own)."""
        if w_max != self.w_max_published:
            metrics.w_max_in_force(w_max or 0)
            self.w_max_published = w_max
        now = time.time()
        for req in reqs:
            if req.rid in self.finished or is_health_check(req.rid):
                # with the overlap schedule a finished request can be emitted twice; a
                # health check is never noted, so it is never filed, counted or observed
                continue
            # A request that ends at its first output (one new token, an EOS at once) is
            # noted too: this chunk's snapshot files it.
            in_force = w_max_of(req) if w_max_of is not None else w_max
            running = self.running.get(req.rid)
            if running is None:
                self.running[req.rid] = RunningRequest(req, now, in_force)
            else:
                running.w_max = in_force
        if len(self.running) > len(self.counters):
            # More than there are slots: some finished without a last chunk reaching the
            # streamer (aborts) and nobody has read the statistics since. Bound the memory.
            self.running = {rid: r for rid, r in self.running.items() if not r.req.finished()}

    def remember_finished(self, rid: str, stats: dict, aborted: bool = False) -> None:
        running = self.running.pop(rid, None)
        if running is None or rid in self.finished:
            return  # with the overlap schedule a finished request can be emitted twice
        state = "aborted" if aborted else "finished"
        entry = running.describe(stats, state, finished_at=time.time())
        self.finished[rid] = entry
        while len(self.finished) > self.history:
            self.finished.popitem(last=False)
        self.totals.add(entry)
        metrics.observe_finished(entry, self.vocab_size)

    def running_reqs(self) -> list:
        return [running.req for running in self.running.values()]

    def describe_running(self, stats: list[dict]) -> list[dict]:
        """Entries for `running_reqs()` (in that order), given their snapshots."""
        return [
            running.describe(req_stats, "running")
            for running, req_stats in zip(self.running.values(), stats, strict=True)
        ]

    def totals_dict(self) -> dict:
        return asdict(self.totals)


def _to_dict(row: list[int], active_now: int, stream_len: int, vocab_size: int) -> dict:
    steps, calls = row[STEPS], row[HEAD_CALLS]
    drafting_emitted = row[EMITTED] - row[PLAIN_STEPS]  # a plain step emits one token
    covered_of = drafting_emitted or None  # coverage is of the tokens draft steps emitted
    return {
        "active_vocab_size": active_now,
        "active_vocab_mean": row[ACTIVE_SUM] / steps if steps else float(active_now),
        "active_vocab_max": max(row[ACTIVE_MAX], active_now),
        "stream_length": stream_len,
        "coverage": row[COVERED] / covered_of if covered_of else None,
        # Coverage by the draft head's vocabulary D, the ceiling of the one above.
        "head_vocab_coverage": row[COVERED_BY_HEAD] / covered_of if covered_of else None,
        "accept_length_mean": drafting_emitted / steps if steps else None,
        "draft_steps": steps,
        "plain_steps": row[PLAIN_STEPS],
        "catch_up_tokens": row[CATCH_UP],
        "accepted_draft_tokens": row[ACCEPTED],
        "drafted_tokens": row[DRAFTED],
        "lm_head_rows_mean": row[ROWS_SUM] / calls if calls else None,
        "lm_head_calls": calls,
        "vocab_size": vocab_size,
        # raw sums, so that means over many requests (and DP ranks) are exact
        "emitted_tokens": row[EMITTED],
        "covered_tokens": row[COVERED],
        "covered_by_head_tokens": row[COVERED_BY_HEAD],
        "active_vocab_sum": row[ACTIVE_SUM],
        "lm_head_rows": row[ROWS_SUM],
    }


def _timing(steps: int, timed: tuple[float, float] | None) -> dict:
    """The draft's time per speculative step and its LM head's share (None on a GPU)."""
    draft, head = timed or (None, None)
    return {
        "draft_ms_per_step": 1000 * draft / steps if timed and steps else None,
        "lm_head_share": head / draft if timed and draft else None,
        # raw sums, as above
        "draft_seconds": draft,
        "lm_head_seconds": head,
    }
