"""The soak's verdict on made-up runs: it passes a consistent one and names each fault."""

from __future__ import annotations

import copy
from dataclasses import replace

from nanospec_server.bench.clients import LEFT, Outcome
from nanospec_server.bench.soak_checks import RSS_GROWTH_BOUND_MB, check
from nanospec_server.bench.soak_plan import Ending, plan
from nanospec_server.bench.soak_record import SoakRun
from nanospec_server.launch.server_state import Held

IDLE = Held(0, 0, 1, 1, 264, 264)
MB = 2**20


def entry(rid: str, state: str, prompt: int, output: int) -> dict:
    return {"rid": rid, "state": state, "prompt_tokens": prompt, "output_tokens": output,
            "draft_steps": output}  # fmt: skip


def aggregates(entries: list[dict]) -> dict:
    states = [e["state"] for e in entries]
    return {
        "requests_finished": states.count("finished"),
        "requests_aborted": states.count("aborted"),
        "requests_running": 0,
        "prompt_tokens": sum(e["prompt_tokens"] for e in entries),
        "output_tokens": sum(e["output_tokens"] for e in entries),
        "draft_steps": sum(e["draft_steps"] for e in entries),
    }


def consistent_run():
    """Four jobs: two that end, one a leaving client cut, one aborted before any batch."""
    jobs = plan(4, seed=0, max_prompt=20, max_new=8, w_cap=64)
    jobs = [replace(job, sampled=False) for job in jobs]
    expected = {job.rid: list(range(10, 18)) for job in jobs}
    run = SoakRun(sent=jobs, w_max_changes=[200, 200], aborts_sent=1, rss_warm=100 * MB)
    run.rss_samples, run.rss_end = [101 * MB, 103 * MB], 102 * MB
    run.outcomes = {
        jobs[0].rid: Outcome(jobs[0].rid, expected[jobs[0].rid], "length"),
        jobs[1].rid: Outcome(jobs[1].rid, expected[jobs[1].rid], "length"),
        jobs[2].rid: Outcome(jobs[2].rid, expected[jobs[2].rid][:2], LEFT),
        jobs[3].rid: Outcome(jobs[3].rid, [], "abort"),
    }
    entries = [
        entry(jobs[0].rid, "finished", len(jobs[0].input_ids), 8),
        entry(jobs[1].rid, "finished", len(jobs[1].input_ids), 8),
        entry(jobs[2].rid, "aborted", len(jobs[2].input_ids), 3),
    ]
    before = {"aggregates": aggregates([])}
    after = {"aggregates": aggregates(entries), "requests": entries, "history_size": 16}
    return run, expected, before, after


def test_a_consistent_run_passes_with_its_figures() -> None:
    verdict = check(*consistent_run(), IDLE)
    assert verdict.failures == []
    assert (verdict.finished, verdict.aborted, verdict.aborted_before_a_batch) == (2, 1, 1)
    assert (
        verdict.greedy_compared == 3 and verdict.rss_max_mb == 103.0 and verdict.rss_end_mb == 102.0
    )


def test_each_fault_is_named() -> None:
    run, expected, before, after = consistent_run()
    rid = run.sent[0].rid
    run.outcomes[rid] = Outcome(rid, expected[rid][:-1] + [0], "length")
    after["requests"][0]["output_tokens"] = 8  # still on the books as sent
    assert any(
        "differs from plain" in f for f in check(run, expected, before, after, IDLE).failures
    )

    run, expected, before, after = consistent_run()
    after["aggregates"]["output_tokens"] += 1  # a token nobody accounts for
    assert any(
        "output_tokens moved" in f for f in check(run, expected, before, after, IDLE).failures
    )

    run, expected, before, after = consistent_run()
    leaked = Held(0, 1, 9, 1, 9000, 264)
    assert any("still held" in f for f in check(run, expected, before, after, leaked).failures)

    run, expected, before, after = consistent_run()
    run.rss_end = run.rss_warm + (RSS_GROWTH_BOUND_MB + 1) * MB
    assert any("RSS grew" in f for f in check(run, expected, before, after, IDLE).failures)

    run, expected, before, after = consistent_run()
    after["requests"] = after["requests"][1:]  # a finished request missing from the books
    after["aggregates"] = aggregates(after["requests"])
    assert any(
        "no /stats/vocab entry" in f for f in check(run, expected, before, after, IDLE).failures
    )

    run, expected, before, after = consistent_run()
    run.w_max_changes.append(500)
    assert any("W_max changes" in f for f in check(run, expected, before, after, IDLE).failures)


def test_a_plan_is_seeded_and_mixes_every_ending() -> None:
    first, again = plan(400, 3, 300, 48, 256), plan(400, 3, 300, 48, 256)
    assert first == again and copy.deepcopy(first) == first
    assert {job.ending for job in first} == set(Ending)
    assert len({job.rid for job in first}) == 400
    assert all(1 <= len(job.input_ids) <= 301 and 1 <= job.max_new_tokens <= 48 for job in first)
    assert any(job.sampled for job in first) and any(job.own_w_max for job in first)
    assert not any(a.rid != b.rid and b.rid.startswith(a.rid) for a in first[:50] for b in first)
