"""The fleet view: several workers' `/stats/vocab` side by side, labelled by worker, and
their aggregates added up.

SGLang's router forwards only the routes it knows (generate, chat, completions, ...), so
`/stats/vocab` and `/nanospec/settings` are read from each worker directly. A worker is
named by its URL's host:port, as `nanospec stats` prints it.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

from pydantic import BaseModel, Field

from nanospec_server.admin.stats_models import Aggregates, RequestEntry, RequestState, VocabStats


class WorkerStats(BaseModel):
    worker: str = Field(description="host:port of the worker's URL")
    url: str
    stats: VocabStats | None = Field(description="its /stats/vocab; None when unreachable")
    error: str | None = None


class FleetRequest(RequestEntry):
    worker: str = Field(description="host:port of the worker that runs it")


class FleetStats(BaseModel):
    aggregates: Aggregates = Field(description="over every worker that answered")
    workers: list[WorkerStats]
    requests: list[FleetRequest] = Field(description="running first, then newest finished")


def worker_urls(values: list[str]) -> list[str]:
    """URLs from repeated and comma-separated values, checked, in order, each once.
    ValueError names the bad one."""
    urls: list[str] = []
    for value in values:
        for url in filter(None, (part.strip() for part in value.split(","))):
            parsed = urlparse(url)
            if parsed.scheme not in ("http", "https") or not parsed.netloc:
                raise ValueError(f"not an http(s) URL: {url!r}")
            if url.rstrip("/") not in urls:
                urls.append(url.rstrip("/"))
    if not urls:
        raise ValueError("no worker URL given")
    return urls


def worker_label(url: str) -> str:
    return urlparse(url).netloc


def fleet_stats(workers: list[WorkerStats]) -> FleetStats:
    """Combine workers' replies: aggregates summed exactly, requests merged and labelled."""
    answered = [w for w in workers if w.stats is not None]
    requests = [
        FleetRequest.model_validate(entry.model_dump() | {"worker": w.worker})
        for w in answered
        for entry in w.stats.requests
    ]
    requests.sort(key=lambda e: (e.state != RequestState.RUNNING, -(e.finished_at or 0)))
    return FleetStats(
        aggregates=Aggregates.combine([w.stats.aggregates for w in answered]),
        workers=workers,
        requests=requests,
    )


def fetch_fleet(urls: list[str], read: Callable[[str], dict]) -> FleetStats:
    """Every worker's `read(url)` (its /stats/vocab), at once; a failure (an Exception
    whose text names the worker) is kept as that worker's error, not raised."""

    def one(url: str) -> WorkerStats:
        try:
            stats = VocabStats.model_validate(read(url))
        except Exception as error:  # any failure: shown in the worker's row
            return WorkerStats(worker=worker_label(url), url=url, stats=None, error=str(error))
        return WorkerStats(worker=worker_label(url), url=url, stats=stats)

    with ThreadPoolExecutor(max_workers=len(urls)) as pool:
        return fleet_stats(list(pool.map(one, urls)))
