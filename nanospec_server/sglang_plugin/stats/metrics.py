"""NanoSpec's Prometheus series, recorded in the scheduler process.

With `--enable-metrics` SGLang points `PROMETHEUS_MULTIPROC_DIR` at a shared directory
before it spawns the schedulers, and its `/metrics` route merges every process's files.
Series created here therefore show up on `/metrics` beside SGLang's own, with no HTTP
work in the scheduler. Without `--enable-metrics` every call here is a no-op.

Every series carries `worker` and `dp_rank`. Prometheus adds `instance` when it scrapes,
but that is the scraper's address for the target (a service name, a pod IP, a relabelled
value) and is lost or rewritten through federation and remote write; `worker` is the
worker's own name, the same host:port that `nanospec stats --url ...` labels its rows with,
so a fleet's series stay apart wherever they are collected and match the CLI's rows.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any

from nanospec_server.env import worker_name as worker_name_from_env

PREFIX = "nanospec:"
SIZE_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 3072, 4096, 8192, 16384, 32768, 65536)
FRACTION_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)
ACCEPT_BUCKETS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0)


@dataclass
class _Series:
    active_vocab: Any
    coverage: Any
    accept_length: Any
    rows_computed: Any
    rows_saved: Any
    settings_changes: Any
    w_max: Any
    worker: str

    @property
    def labels(self) -> dict[str, str]:
        # Read at use: the scheduler's parallel context is set after our hooks install.
        from sglang.srt.runtime_context import get_parallel

        return {"worker": self.worker, "dp_rank": str(get_parallel().dp_rank or 0)}


_SERIES: _Series | None = None


def worker_name(host: str, port: int) -> str:
    """The `worker` label: $NANOSPEC_WORKER_NAME, else host:port, with the machine's
    hostname for a wildcard bind (in a compose file, the service's hostname)."""
    if name := worker_name_from_env():
        return name
    if host in ("", "0.0.0.0", "::"):
        host = socket.gethostname()
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def enable(worker: str) -> None:
    """Create the series (once per scheduler process), labelled with this `worker`."""
    global _SERIES
    if _SERIES is not None:
        return
    # Imported here: prometheus_client picks its multiprocess storage at import time.
    from prometheus_client import Counter, Gauge, Histogram

    names = ["worker", "dp_rank"]
    _SERIES = _Series(
        active_vocab=Histogram(
            f"{PREFIX}active_vocab_size",
            "Mean active draft vocabulary size of each finished request",
            names,
            buckets=SIZE_BUCKETS,
        ),
        coverage=Histogram(
            f"{PREFIX}coverage",
            "Fraction of each finished request's emitted tokens that were in its active vocabulary",
            names,
            buckets=FRACTION_BUCKETS,
        ),
        accept_length=Histogram(
            f"{PREFIX}accept_length",
            "Mean tokens emitted per speculative step, per finished request",
            names,
            buckets=ACCEPT_BUCKETS,
        ),
        rows_computed=Counter(
            f"{PREFIX}lm_head_rows_computed", "Draft LM-head rows multiplied", names
        ),
        rows_saved=Counter(
            f"{PREFIX}lm_head_rows_saved",
            "Draft LM-head rows the full vocabulary would have cost on top",
            names,
        ),
        settings_changes=Counter(
            f"{PREFIX}settings_changes", "Live settings changes applied", [*names, "setting"]
        ),
        w_max=Gauge(
            f"{PREFIX}w_max", "Window length W_max in force", names, multiprocess_mode="mostrecent"
        ),
        worker=worker,
    )


def observe_finished(entry: dict, vocab_size: int) -> None:
    if _SERIES is None:
        return
    labels = _SERIES.labels
    if entry["draft_steps"]:
        _SERIES.active_vocab.labels(**labels).observe(entry["active_vocab_mean"])
        _SERIES.accept_length.labels(**labels).observe(entry["accept_length_mean"])
    if entry["coverage"] is not None:
        _SERIES.coverage.labels(**labels).observe(entry["coverage"])
    computed = entry["lm_head_rows"]
    _SERIES.rows_computed.labels(**labels).inc(computed)
    _SERIES.rows_saved.labels(**labels).inc(max(0, entry["lm_head_calls"] * vocab_size - computed))


def settings_changed(changes: dict[str, int]) -> None:
    if _SERIES is None:
        return
    for setting in changes:
        _SERIES.settings_changes.labels(**_SERIES.labels, setting=setting).inc()


def w_max_in_force(w_max: int) -> None:
    if _SERIES is not None:
        _SERIES.w_max.labels(**_SERIES.labels).set(w_max)
