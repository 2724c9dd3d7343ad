"""A DepthPolicy that drafts at the deepest candidate (the launch's depth) every step, unless
a depth is pinned: the fixed behaviour, behind the same extension point as goodput's."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from nanospec_server.adaptive.depth_policy import CatchUpDebt, StepRecord
from nanospec_server.adaptive.policy import AcceptanceEstimate, Decision


@dataclass
class FixedDepthPolicy:
    candidates: list[int]
    enabled: bool = True  # on or off, the depth is the deepest candidate
    pinned: int | None = None
    acceptance: AcceptanceEstimate = field(default_factory=AcceptanceEstimate)
    name: ClassVar[str] = "fixed"

    def __post_init__(self) -> None:
        if not self.candidates or any(k < 0 for k in self.candidates):
            raise ValueError(f"candidate depths must be non-negative, got {self.candidates}")
        self.candidates = sorted(set(self.candidates))

    @property
    def depth(self) -> int:
        return self.candidates[-1]

    def choose(self, batch_size: int, request_ids: Sequence[str] | None = None) -> Decision:
        if self.pinned is not None:
            return Decision(self.pinned, "pinned", {})
        return Decision(self.depth, "fixed", {})

    def predicted_best(
        self, batch_size: int, request_ids: Sequence[str] | None = None
    ) -> int | None:
        return self.choose(batch_size).depth

    def observe_step(self, record: StepRecord) -> None:
        pass  # no cost model: the depth does not depend on time

    def observe_acceptance(
        self, accepted: list[int], depth: int, request_ids: Sequence[str] | None = None
    ) -> None:
        self.acceptance.observe(accepted, depth)

    def observe_draft_extend(self, positions: int, seconds: float) -> None:
        pass  # the depth does not depend on cost

    def always_drafts(self) -> bool:
        return self.choose(0).depth > 0

    def price_catch_up(self, debt: Callable[[int], CatchUpDebt]) -> None:
        pass  # the depth does not depend on cost

    def calibrate(self, timings: dict[str, list[dict[str, Any]]]) -> None:
        pass  # the depth does not depend on cost

    def cost_timings(self) -> dict[str, list[dict[str, Any]]] | None:
        return None  # no cost model

    def published(self) -> dict[str, Any]:
        return {
            "pinned_depth": self.pinned,
            "fixed_depth": self.depth,
            "acceptance_rate": self.acceptance.rate,
        }
