"""A short soak (the CI version of `benchmarks/soak.py`): real tiny servers, ~60 requests
of random lengths with aborts and live W_max changes, judged by `soak_checks`."""

from __future__ import annotations

from pathlib import Path

import pytest

from nanospec_server.bench.soak import W_CAP, soak_with_servers
from nanospec_server.bench.soak_plan import plan

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1200)]

REQUESTS = 60


def test_a_short_soak_leaks_nothing_and_stays_lossless(tmp_path: Path) -> None:
    jobs = plan(REQUESTS, seed=1, max_prompt=200, max_new=24, w_cap=W_CAP)
    verdict = soak_with_servers(
        jobs, tmp_path, concurrency=8, w_max_interval_s=0.5, deadline_s=900, warmup=10
    )
    assert not verdict.failures, verdict.summary()
    # it did what a soak should: every request accounted for, aborts and changes among them
    assert verdict.requests == REQUESTS
    assert verdict.finished + verdict.aborted + verdict.aborted_before_a_batch == REQUESTS
    assert verdict.aborted > 0 and verdict.w_max_changes > 0
    assert verdict.greedy_compared >= REQUESTS // 2
