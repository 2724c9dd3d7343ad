"""What a soak saw: each job's outcome (or error), W_max changes, memory samples."""

from __future__ import annotations

from dataclasses import dataclass, field

from nanospec_server.bench import clients
from nanospec_server.bench.soak_plan import Job


@dataclass
class SoakRun:
    """What the soak saw: each job's outcome (or error), W_max changes, memory samples."""

    sent: list[Job] = field(default_factory=list)
    outcomes: dict[str, clients.Outcome] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    w_max_changes: list[int] = field(default_factory=list)  # HTTP status of each change
    aborts_sent: int = 0
    rss_warm: int | None = None  # scheduler RSS, idle once the warm-up requests ended
    rss_samples: list[int] = field(default_factory=list)  # after warm-up, busy or not
    rss_end: int | None = None  # idle at the end
    wall_s: float = 0.0
    stopped_by_deadline: bool = False
