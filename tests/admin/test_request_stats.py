"""Host bookkeeping of `RequestStats`: running requests, bounded history, totals."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from nanospec_server.env import STATS_HISTORY
from nanospec_server.sglang_plugin.stats.request_stats import RequestStats


@dataclass
class Req:
    """The three things the bookkeeping reads from SGLang's Req."""

    rid: str
    origin_input_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    done: bool = False

    def finished(self) -> bool:
        return self.done

    @property
    def output_ids_through_stop(self) -> list[int]:
        return self.output_ids


def test_running_then_finished_with_totals(monkeypatch) -> None:
    monkeypatch.setenv(STATS_HISTORY, "2")
    stats = RequestStats(num_slots=4, vocab_size=100, device=torch.device("cpu"))
    reqs = [Req(f"r{i}", [1] * (i + 1)) for i in range(3)]
    stats.track(reqs, w_max=64)
    assert list(stats.running) == ["r0", "r1", "r2"]
    slots = torch.tensor([0, 1, 2])
    stats.record_verify(
        slots,
        torch.tensor([2, 1, 3]),
        torch.tensor([1, 1, 2]),
        slots + 10,
        torch.tensor([2, 0, 3]),
        depth=3,
    )
    stats.record_head(slots, 12)
    stats.track(reqs, w_max=32)  # a live change reaches the running requests
    running = stats.describe_running(stats.snapshot([0, 1, 2], [10, 11, 12], [5, 5, 5]))
    assert [e["w_max"] for e in running] == [32, 32, 32]
    assert [e["prompt_tokens"] for e in running] == [1, 2, 3]

    for i, req in enumerate(reqs):
        req.output_ids, req.done = [7] * 4, True
        snapshot = stats.snapshot([i], [10 + i], [5])[0]
        stats.remember_finished(req.rid, snapshot)
        stats.remember_finished(req.rid, snapshot)  # emitted twice: counted once
    assert stats.running == {}
    assert list(stats.finished) == ["r1", "r2"]  # history of 2 keeps the newest
    totals = stats.totals
    assert (totals.requests, totals.prompt_tokens, totals.output_tokens) == (3, 6, 12)
    assert (totals.draft_steps, totals.emitted_tokens, totals.covered_tokens) == (3, 6, 4)
    assert totals.covered_by_head_tokens == 5
    assert stats.finished["r1"]["head_vocab_coverage"] == 0.0
    assert stats.finished["r1"]["drafted_tokens"] == 3  # the depth the step ran at
    assert (totals.lm_head_rows, totals.lm_head_calls, totals.active_vocab_sum) == (36, 3, 33)
    assert stats.finished["r2"]["state"] == "finished" and stats.finished["r2"]["finished_at"]


def test_a_requests_own_w_max_is_the_one_in_force() -> None:
    stats = RequestStats(num_slots=4, vocab_size=100, device=torch.device("cpu"))
    reqs = [Req("own", [1]), Req("live", [1])]
    own = {"own": 16}
    for live in (64, 32):  # a live change reaches only the request without its own
        stats.track(reqs, live, lambda req, live=live: own.get(req.rid, live))
    assert [running.w_max for running in stats.running.values()] == [16, 32]


def test_a_request_that_ends_at_its_first_chunk_is_filed_once() -> None:
    stats = RequestStats(num_slots=2, vocab_size=10, device=torch.device("cpu"))
    req = Req("x", [1], output_ids=[5], done=True)  # one new token: it ends at prefill
    stats.track([req], w_max=8)
    stats.remember_finished("x", stats.snapshot([0], [0], [0])[0])
    stats.track([req], w_max=8)  # emitted twice: not noted again
    assert stats.running == {} and list(stats.finished) == ["x"]
    assert (stats.totals.requests, stats.totals.output_tokens) == (1, 1)
    stats.remember_finished("never-seen", stats.snapshot([0], [0], [0])[0])
    assert stats.totals.requests == 1


def test_an_aborted_request_is_filed_as_aborted_and_counted_apart() -> None:
    stats = RequestStats(num_slots=4, vocab_size=100, device=torch.device("cpu"))
    reqs = [Req("done", [1, 2]), Req("cut", [1, 2, 3])]
    stats.track(reqs, w_max=64)
    for i, (req, aborted) in enumerate(zip(reqs, (False, True), strict=True)):
        req.output_ids, req.done = [7] * (i + 2), True
        stats.remember_finished(req.rid, stats.snapshot([i], [10], [5])[0], aborted)
    assert [e["state"] for e in stats.finished.values()] == ["finished", "aborted"]
    totals = stats.totals
    assert (totals.requests, totals.aborted) == (1, 1)
    # both ran their steps: the sums cover both
    assert (totals.prompt_tokens, totals.output_tokens) == (5, 5)


def test_health_checks_never_enter_the_statistics(monkeypatch) -> None:
    observed: list[dict] = []
    monkeypatch.setattr(
        "nanospec_server.sglang_plugin.stats.metrics.observe_finished",
        lambda entry, _: observed.append(entry),
    )
    stats = RequestStats(num_slots=4, vocab_size=100, device=torch.device("cpu"))
    # SGLang's /health_generate rid, and a user's rid that merely contains the words
    reqs = [Req("HEALTH_CHECK_0a1b2c", [0]), Req("user-HEALTH_CHECK", [1, 2])]
    stats.track(reqs, w_max=64)
    assert list(stats.running) == ["user-HEALTH_CHECK"]
    for i, req in enumerate(reqs):
        req.output_ids, req.done = [7], True
        stats.remember_finished(req.rid, stats.snapshot([i], [3], [2])[0])
    assert list(stats.finished) == ["user-HEALTH_CHECK"]
    assert (stats.totals.requests, stats.totals.prompt_tokens) == (1, 2)
    assert [entry["rid"] for entry in observed] == ["user-HEALTH_CHECK"]


def test_plain_steps_and_catch_up_are_counted_apart_from_draft_steps() -> None:
    """A depth-0 step on the plain decode path emits one token and drafts nothing: the
    means per draft step (acceptance length, coverage, active vocabulary) leave it out."""
    stats = RequestStats(num_slots=2, vocab_size=100, device=torch.device("cpu"))
    slot = torch.tensor([1])
    stats.record_verify(slot, torch.tensor([3]), torch.tensor([2]), torch.tensor([40]),
                        torch.tensor([3]), depth=3)  # fmt: skip
    for _ in range(5):
        stats.record_plain(slot)
    stats.record_catch_up(slot, torch.tensor([5]))
    entry = stats.snapshot([1], [40], [9])[0]
    assert (entry["draft_steps"], entry["plain_steps"], entry["emitted_tokens"]) == (1, 5, 8)
    assert entry["accept_length_mean"] == 3.0 and entry["coverage"] == 2 / 3
    assert entry["active_vocab_mean"] == 40.0 and entry["catch_up_tokens"] == 5
