"""DepthPolicy: what the plugin asks of a policy that chooses each step's draft depth, and
the record of a step it observes (no SGLang import)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from nanospec_server.adaptive.policy import CATCH_UP_CELL, PLAIN_CELL, Decision

# The paths a decode step can take: the verify then the draft extend, (at depth 0, the next
# step not drafting either) the verify alone, (at depth 0) SGLang's plain decode step, or
# that step followed by the draft's extend over the tokens it missed, its own at least (the
# next step drafts).
VERIFY = "verify"
VERIFY_WITHOUT_EXTEND = "verify-without-extend"
PLAIN = PLAIN_CELL
PLAIN_CATCH_UP = CATCH_UP_CELL


@dataclass(frozen=True)
class StepRecord:
    """One decode step as it ran: ``seconds`` is None for a step that was not timed."""

    batch_size: int
    depth: int
    path: str
    seconds: float | None
    caught_up: int = 0  # positions the draft caught up on in the step (a catch-up step)


@dataclass(frozen=True)
class CatchUpDebt:
    """What drafting again would cost the batch first, and what it could win it back on:
    the positions its draft must catch up on, and the tokens its requests may still decode
    (each counted up to a horizon)."""

    positions: int
    tokens_left: int


NO_DEBT = CatchUpDebt(0, 0)


@runtime_checkable
class DepthPolicy(Protocol):
    """Chooses each step's depth among ``candidates`` (sorted, 0 = plain decoding).

    ``enabled`` is the live ``adaptive`` switch (off: the deepest candidate every step) and
    ``pinned`` the live ``adaptive_depth`` pin (a candidate every step runs at, or None)."""

    name: str
    candidates: list[int]
    enabled: bool
    pinned: int | None

    def choose(self, batch_size: int, request_ids: Sequence[str] | None = None) -> Decision:
        """This step's depth (may change the policy's state: probes, hysteresis);
        ``request_ids`` name the batch's requests where known."""

    def predicted_best(
        self, batch_size: int, request_ids: Sequence[str] | None = None
    ) -> int | None:
        """The depth a fresh decision would take, changing nothing; None if unknown yet."""

    def observe_step(self, record: StepRecord) -> None:
        """A decode step's batch size, depth, path and wall time, after it ran."""

    def observe_acceptance(
        self, accepted: list[int], depth: int, request_ids: Sequence[str] | None = None
    ) -> None:
        """Draft tokens each request had accepted at a step that drafted ``depth`` (the
        requests ``request_ids``, in the same order, where known)."""

    def observe_draft_extend(self, positions: int, seconds: float) -> None:
        """A draft extend over ``positions`` positions (a prefill's) took ``seconds``:
        what a catch-up over as many costs."""

    def calibrate(self, timings: dict[str, list[dict[str, Any]]]) -> None:
        """Start from the step timings of a calibration (`adaptive/calibration.py`'s
        ``CostTimings``, as a dict) recorded on this host and configuration."""

    def cost_timings(self) -> dict[str, list[dict[str, Any]]] | None:
        """What a calibration of this host would keep (as ``CostTimings``), None while
        the policy has nothing worth keeping (no cost model, or not ready)."""

    def published(self) -> dict[str, Any]:
        """The policy's own fields of ``/stats/vocab.adaptive``."""

    def always_drafts(self) -> bool:
        """Whether every step drafts (a fixed or pinned drafting depth): prefill work
        deferred to a request's first drafting step would then only cost a step."""

    def price_catch_up(self, debt: Callable[[int], CatchUpDebt]) -> None:
        """Where to read the batch's catch-up debt from (asked with the batch size, only
        when a decision would leave depth 0: reading it scans the batch's KV slots)."""
