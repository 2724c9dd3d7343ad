"""The soak's verdict: memory flat after warm-up, nothing held, statistics that add up, and
every greedy output plain decoding's (the whole of it, or a prefix when cut short)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from nanospec_server.bench import clients
from nanospec_server.bench.soak_record import SoakRun
from nanospec_server.launch.server_state import Held

# The scheduler's RSS, idle, may grow by at most this much from the end of warm-up to the
# end. Its steady state holds SGLang's and our bounded histories (finished requests,
# statistics); a leak per request (a tensor, a dict entry) crosses it within ~1,000.
# (Busy, it peaked ~56 MB above the warm value in a 600-request run: batches' buffers.)
RSS_GROWTH_BOUND_MB = 64
FINISHES = {"length", "stop"}


@dataclass
class Verdict:
    requests: int
    finished: int
    aborted: int  # on the server's books
    aborted_before_a_batch: int  # cut short before they reached a batch: no entry
    aborts_sent: int
    w_max_changes: int
    greedy_compared: int
    rss_warm_mb: float | None
    rss_max_mb: float | None
    rss_end_mb: float | None
    wall_s: float
    failures: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        return asdict(self)


def _mb(value: int | None) -> float | None:
    return None if value is None else round(value / 2**20, 1)


def check(run: SoakRun, expected: dict[str, list[int]], before: dict, after: dict, idle: Held):
    failures = [f"{rid}: {error}" for rid, error in run.errors.items()]
    if run.stopped_by_deadline:
        failures.append(f"time cap: sent {len(run.sent)} requests only")
    entries = {e["rid"]: e for e in after["requests"] if e["state"] != "running"}
    if after["history_size"] < len(run.sent):
        failures.append(f"history keeps {after['history_size']} < {len(run.sent)} sent")
    compared, absent = 0, 0
    for job in run.sent:
        outcome, entry = run.outcomes.get(job.rid), entries.get(job.rid)
        if outcome is None:
            continue  # an error, reported above
        ended = outcome.finish in FINISHES
        if entry is None:
            absent += 1
            if outcome.finish != "abort":  # only an abort can end a request before a batch
                failures.append(f"{job.rid}: {outcome.finish}, yet no /stats/vocab entry")
            continue
        if ended != (entry["state"] == "finished") and outcome.finish != clients.LEFT:
            failures.append(f"{job.rid}: client saw {outcome.finish}, server {entry['state']}")
        if entry["prompt_tokens"] != len(job.input_ids):
            failures.append(f"{job.rid}: prompt {entry['prompt_tokens']} != {len(job.input_ids)}")
        if ended and entry["output_tokens"] != len(outcome.output_ids):
            failures.append(f"{job.rid}: output {entry['output_tokens']} tokens on the books, "
                            f"{len(outcome.output_ids)} sent")  # fmt: skip
        if job.greedy:
            compared += 1
            want = expected[job.rid]
            got = outcome.output_ids
            if (got != want) if ended else (got != want[: len(got)]):
                failures.append(f"{job.rid}: greedy output differs from plain decoding")
    failures += _books(before["aggregates"], after["aggregates"], entries, run)
    if not idle.idle:
        failures.append(f"still held after the soak: {idle}")
    rss_max = max(run.rss_samples + [run.rss_end or 0]) if run.rss_warm is not None else None
    if run.rss_warm is None or run.rss_end is None:
        failures.append("the warm-up never ended: no memory baseline")
    elif run.rss_end - run.rss_warm > RSS_GROWTH_BOUND_MB * 2**20:
        failures.append(f"scheduler RSS grew {_mb(run.rss_end - run.rss_warm)} MB after warm-up")
    if set(run.w_max_changes) - {200}:
        failures.append(f"W_max changes answered {sorted(set(run.w_max_changes))}")
    states = [entries[job.rid]["state"] for job in run.sent if job.rid in entries]
    accounted = states.count("finished") + states.count("aborted") + absent + len(run.errors)
    if accounted != len(run.sent):
        failures.append(f"{len(run.sent)} sent, {accounted} finished, aborted or failed")
    return Verdict(
        requests=len(run.sent),
        finished=states.count("finished"),
        aborted=states.count("aborted"),
        aborted_before_a_batch=absent,
        aborts_sent=run.aborts_sent,
        w_max_changes=len(run.w_max_changes),
        greedy_compared=compared,
        rss_warm_mb=_mb(run.rss_warm),
        rss_max_mb=_mb(rss_max),
        rss_end_mb=_mb(run.rss_end),
        wall_s=round(run.wall_s, 1),
        failures=failures,
    )


def _books(before: dict, after: dict, entries: dict[str, dict], run: SoakRun) -> list[str]:
    """The aggregates moved by exactly what this soak's entries say."""
    mine = [entries[job.rid] for job in run.sent if job.rid in entries]
    states = [entry["state"] for entry in mine]
    want = {
        "requests_finished": states.count("finished"),
        "requests_aborted": states.count("aborted"),
        "prompt_tokens": sum(entry["prompt_tokens"] for entry in mine),
        "output_tokens": sum(entry["output_tokens"] for entry in mine),
        "draft_steps": sum(entry["draft_steps"] for entry in mine),
        "requests_running": 0 - before["requests_running"],
    }
    return [
        f"aggregates: {name} moved by {after[name] - before[name]}, entries say {moved}"
        for name, moved in want.items()
        if after[name] - before[name] != moved
    ]
