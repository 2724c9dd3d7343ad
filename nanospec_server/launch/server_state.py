"""What a running server holds: NanoSpec's slots, union rows and state bytes (from
`/stats/vocab`), its requests' fates, and its scheduler process (for resident memory)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from urllib.parse import urlparse

import psutil
import requests

POLL_S = 0.25
SCHEDULER_TITLE = "sglang::scheduler"


@dataclass(frozen=True)
class Held:
    """What running requests hold of NanoSpec's state, summed over DP ranks."""

    running: int
    slots_in_use: int
    union_rows_in_use: int
    union_rows_idle: int
    state_bytes_in_use: int
    state_bytes_idle: int

    @property
    def idle(self) -> bool:
        """Nothing held: no request, no slot, only the pinned rows of the packed head."""
        return (
            self.running == 0
            and self.slots_in_use == 0
            and self.union_rows_in_use == self.union_rows_idle
            and self.state_bytes_in_use == self.state_bytes_idle
        )


def vocab_stats(url: str, **params) -> dict:
    response = requests.get(f"{url}/stats/vocab", params=params, timeout=60)
    response.raise_for_status()
    return response.json()


def held(url: str) -> Held:
    stats = vocab_stats(url, limit=1)
    memory = [rank["memory"] for rank in stats["ranks"]]
    return Held(
        running=stats["aggregates"]["requests_running"],
        slots_in_use=sum(m["slots_in_use"] for m in memory),
        union_rows_in_use=sum(m["union_rows_in_use"] for m in memory),
        union_rows_idle=sum(m["union_rows_idle"] for m in memory),
        state_bytes_in_use=stats["aggregates"]["state_bytes_in_use"],
        state_bytes_idle=stats["aggregates"]["state_bytes_idle"],
    )


def wait_until_idle(url: str, timeout_s: float = 120) -> Held:
    """Poll until nothing is held (or the deadline passes): the last request's slot goes
    back when its scheduler idles, which can come just after its response reached us."""
    deadline = time.monotonic() + timeout_s
    while not (now := held(url)).idle and time.monotonic() < deadline:
        time.sleep(POLL_S)
    return now


def request_entry(url: str, rid: str) -> dict | None:
    response = requests.get(f"{url}/stats/vocab/{rid}", timeout=60)
    return response.json() if response.status_code == 200 else None


def wait_for_entry(url: str, rid: str, states: set[str], timeout_s: float = 120) -> dict | None:
    """The request's `/stats/vocab` entry once its state is one of `states` (or None at
    the deadline)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        entry = request_entry(url, rid)
        if entry is not None and entry["state"] in states:
            return entry
        time.sleep(POLL_S)
    return None


def wait_until_drafting(url: str, rid: str, timeout_s: float = 120) -> dict | None:
    """The running request's entry once it has taken a speculative step (None at the deadline
    or if it ended first)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        entry = request_entry(url, rid)
        if entry is not None and entry["state"] != "running":
            return None
        if entry is not None and entry["draft_steps"] > 0:
            return entry
        time.sleep(POLL_S)
    return None


def scheduler_process(url: str) -> psutil.Process:
    """The scheduler of the server listening on `url`'s port (a child of its launcher)."""
    port = urlparse(url).port
    listening = [
        conn.pid
        for conn in psutil.net_connections(kind="tcp")
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid
    ]
    if not listening:
        raise LookupError(f"no process listens on port {port}")
    for child in psutil.Process(listening[0]).children():
        if " ".join(child.cmdline()).split()[:1] == [SCHEDULER_TITLE]:
            return child
    raise LookupError(f"the server on port {port} has no {SCHEDULER_TITLE} process")
