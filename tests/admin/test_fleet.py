"""The fleet view against a plainly written reference: sums over workers are the sums over
all their DP ranks, requests keep their worker's label, and worker URLs parse as documented."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nanospec_server.admin.fleet import WorkerStats, fetch_fleet, fleet_stats, worker_urls
from nanospec_server.admin.stats_models import vocab_stats
from tests.admin.test_stats_models import entry, rank

figures = st.tuples(st.integers(1, 50), st.integers(0, 200), st.integers(0, 100))
# workers -> DP ranks -> finished requests (steps, extra emitted, covered share)
fleets = st.lists(
    st.lists(st.lists(figures, max_size=4), min_size=1, max_size=2), min_size=1, max_size=3
)


def ranks_of(worker: int, per_rank: list[list[tuple[int, int, int]]]) -> list[dict]:
    ranks = []
    for r, requests in enumerate(per_rank):
        finished = []
        for i, (steps, extra, share) in enumerate(requests):
            emitted = steps + extra
            rid = f"w{worker}-r{r}-{i}"
            finished.append(entry(rid, "finished", steps, emitted, emitted * share // 100, i))
        ranks.append(rank(r, finished, []))
    return ranks


@given(fleets)
def test_fleet_aggregates_are_those_of_every_rank_together(fleet) -> None:
    workers = [
        WorkerStats(worker=f"h:{w}", url=f"http://h:{w}", stats=vocab_stats(ranks_of(w, ranks)))
        for w, ranks in enumerate(fleet)
    ]
    every_rank = [r for w, ranks in enumerate(fleet) for r in ranks_of(w, ranks)]
    expected = vocab_stats(every_rank).aggregates  # one server with all those ranks
    assert fleet_stats(workers).aggregates == expected


def test_requests_are_labelled_by_worker_and_merged_newest_first() -> None:
    a = vocab_stats([rank(0, [entry("a1", "finished", 2, 3, 1, 5.0)], [])])
    b = vocab_stats([rank(0, [entry("b1", "finished", 2, 3, 1, 9.0)], [])])
    down = WorkerStats(worker="c:3", url="http://c:3", stats=None, error="cannot connect")
    fleet = fleet_stats(
        [WorkerStats(worker="a:1", url="http://a:1", stats=a), down,
         WorkerStats(worker="b:2", url="http://b:2", stats=b)]
    )  # fmt: skip
    assert [(e.rid, e.worker) for e in fleet.requests] == [("b1", "b:2"), ("a1", "a:1")]
    assert fleet.aggregates.requests_finished == 2  # the worker that is down adds nothing


def test_a_worker_that_fails_is_kept_with_its_error() -> None:
    good = vocab_stats([rank(0, [entry("x", "finished", 2, 3, 1, 1.0)], [])])

    def read(url: str) -> dict:
        if "bad" in url:
            raise ConnectionError(f"--url {url}: cannot connect")
        return good.model_dump(mode="json")

    fleet = fetch_fleet(["http://good:1", "http://bad:2"], read)
    assert [w.worker for w in fleet.workers] == ["good:1", "bad:2"]
    assert fleet.workers[1].stats is None and "bad:2" in fleet.workers[1].error
    assert fleet.aggregates.requests_finished == 1


def test_worker_urls_repeated_or_comma_separated() -> None:
    urls = worker_urls(["http://a:1/, http://b:2", "http://a:1", "https://c"])
    assert urls == ["http://a:1", "http://b:2", "https://c"]
    for bad in (["a:1"], ["http://a:1,ftp://b"], [" , "]):
        with pytest.raises(ValueError):
            worker_urls(bad)
