"""A soak: a plan's requests against a tiny NanoSpec server, with live W_max changes and
aborts mixed in, the scheduler's resident memory sampled throughout; `soak_checks.py`
then judges it against a plain server's greedy outputs.

`python benchmarks/soak.py` runs the long version; `tests/bench/test_soak.py` a short one.
Every loop here is bounded in count (the plan) and in time (`deadline_s`), and every
request goes to 127.0.0.1.
"""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from nanospec_server.bench import clients
from nanospec_server.bench.soak_checks import check
from nanospec_server.bench.soak_plan import Ending, Job
from nanospec_server.bench.soak_record import SoakRun
from nanospec_server.launch import server_state
from nanospec_server.launch.server import running_servers, speculative_flags
from nanospec_server.models.tiny import tiny_model_path

ADMIN_KEY = "soak-admin-key"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
W_MAX, W_CAP = 64, 256  # the tiny vocabulary has 997 tokens: windows this size matter
RSS_SAMPLE_S = 0.5


def server_flags(history: int) -> dict[str, list[str]]:
    """`nanospec serve` flags of the soaked server and of its plain reference."""
    target = ["--model-path", str(tiny_model_path("tiny-target")), "--dtype", "float32"]
    target += ["--max-total-tokens", "16384", "--mem-fraction-static", "0.3"]
    spec = speculative_flags("EAGLE", "tiny-eagle", 3, 1, 4)
    spec += ["--nanospec-w-max", str(W_MAX), "--nanospec-w-cap", str(W_CAP)]
    spec += ["--nanospec-stats-history", str(history), "--admin-api-key", ADMIN_KEY]
    return {"spec": target + spec, "plain": target}


def reference_outputs(url: str, jobs: list[Job], concurrency: int) -> dict[str, list[int]]:
    """Plain decoding's output for every greedy job (whole, so cut ones compare as prefixes)."""
    greedy = [job for job in jobs if job.greedy]

    def one(job: Job) -> list[int]:
        params = job.params()
        params.pop("custom_params", None)  # a plain server has no window to size
        return clients.generate_whole(url, f"plain-{job.rid}", job.input_ids, params).output_ids

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return dict(zip((job.rid for job in greedy), pool.map(one, greedy), strict=True))


class _Soak:
    def __init__(self, url: str, jobs: list[Job], warmup: int, deadline_s: float, seed: int):
        self.url, self.jobs = url, jobs
        self.deadline = time.monotonic() + deadline_s
        self.rng = random.Random(seed)
        self.run = SoakRun()
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.next_job, self.limit = 0, warmup
        self.scheduler = server_state.scheduler_process(url)

    def take(self) -> Job | None:
        with self.lock:
            if self.next_job == self.limit:
                return None
            if time.monotonic() > self.deadline:
                self.run.stopped_by_deadline = True
                return None
            job = self.jobs[self.next_job]
            self.next_job += 1
            self.run.sent.append(job)
            return job

    def worker(self) -> None:
        while (job := self.take()) is not None:
            try:
                outcome = self.send(job)
            except Exception as error:  # every failure is reported, none stops the soak
                with self.lock:
                    self.run.errors[job.rid] = f"{type(error).__name__}: {error}"
                continue
            with self.lock:
                self.run.outcomes[job.rid] = outcome

    def send(self, job: Job) -> clients.Outcome:
        params = job.params()
        if job.ending == Ending.WHOLE:
            return clients.generate_whole(self.url, job.rid, job.input_ids, params)
        if job.ending in (Ending.STREAM, Ending.LEAVE):
            leave = job.leave_after if job.ending == Ending.LEAVE else None
            return clients.stream(self.url, job.rid, job.input_ids, params, leave)
        aborter = threading.Timer(job.abort_after_s, self.abort, args=(job.rid,))
        aborter.start()
        try:
            return clients.generate_whole(self.url, job.rid, job.input_ids, params)
        finally:
            aborter.join()

    def abort(self, rid: str) -> None:
        clients.abort(self.url, rid, ADMIN)
        with self.lock:
            self.run.aborts_sent += 1

    def change_w_max(self, interval_s: float) -> None:
        while not self.done.wait(self.rng.uniform(0.5, 1.5) * interval_s):
            response = requests.post(
                f"{self.url}/nanospec/settings",
                json={"w_max": self.rng.randint(1, W_CAP)},
                headers=ADMIN,
                timeout=60,
            )
            self.run.w_max_changes.append(response.status_code)

    def sample_rss(self) -> None:
        while not self.done.wait(RSS_SAMPLE_S):
            if self.run.rss_warm is not None:
                self.run.rss_samples.append(self.scheduler.memory_info().rss)


def soak(
    url: str,
    jobs: list[Job],
    concurrency: int,
    w_max_interval_s: float,
    deadline_s: float,
    warmup: int,
    seed: int = 0,
) -> SoakRun:
    """Send the jobs from `concurrency` clients while W_max changes every ~interval; stop
    sending at the deadline. Ends once every request ended and the server holds nothing."""
    state = _Soak(url, jobs, warmup, deadline_s, seed)
    started = time.monotonic()
    helpers = [
        threading.Thread(target=state.change_w_max, args=(w_max_interval_s,), daemon=True),
        threading.Thread(target=state.sample_rss, daemon=True),
    ]
    for thread in helpers:
        thread.start()
    try:
        for limit in (warmup, len(jobs)):  # the warm-up, then the rest
            state.limit = limit
            with ThreadPoolExecutor(max_workers=concurrency) as pool:
                for _ in range(concurrency):
                    pool.submit(state.worker)
            if state.run.rss_warm is None:
                server_state.wait_until_idle(url)  # like the end: idle, then measured
                state.run.rss_warm = state.scheduler.memory_info().rss
    finally:
        state.done.set()
        for thread in helpers:
            thread.join(timeout=120)
    state.run.wall_s = time.monotonic() - started
    server_state.wait_until_idle(url)
    state.run.rss_end = state.scheduler.memory_info().rss
    return state.run


def soak_with_servers(
    jobs: list[Job],
    log_dir: Path,
    concurrency: int,
    w_max_interval_s: float,
    deadline_s: float,
    warmup: int,
):
    """Start the soaked server and its plain reference, take plain decoding's outputs,
    soak, and check (returns `soak_checks.Verdict`)."""
    flags = server_flags(history=len(jobs) + 1)
    servers = {name: (args, log_dir / f"{name}.log") for name, args in flags.items()}
    with running_servers(servers) as urls:
        expected = reference_outputs(urls["plain"], jobs, concurrency)
        before = server_state.vocab_stats(urls["spec"], limit=1)
        run = soak(urls["spec"], jobs, concurrency, w_max_interval_s, deadline_s, warmup)
        after = server_state.vocab_stats(urls["spec"], limit=len(jobs) + 1)
        idle = server_state.wait_until_idle(urls["spec"])
    return check(run, expected, before, after, idle)
