"""A per-host calibration of the goodput policy's cost model: the step timings one server
measured, saved to a file that a later server of the same configuration on the same host
starts from (`--nanospec-adaptive-calibration`), instead of exploring on its first
requests (no SGLang import).

A fresh server times the drafting depths only on batches of one or two: under a load
that never drains that far it runs at depth 0 for good. Started from a calibration it
prices every step it was timed at from its first one; its own timings replace the
calibration's as they come (a cell's calibrated median counts as ``min_samples``
timings, which the next ``min_samples + 1`` live ones outvote).

A calibration names the server it was measured on (CPU, threads, dtype, models, draft
algorithm, candidate depths): a step's cost on another CPU or with another draft says
nothing here, so a server refuses to start from one recorded elsewhere.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nanospec_server.adaptive.policy import CATCH_UP_CELL, PLAIN_CELL, VERIFY_CELL

FORMAT = 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CellTiming(_Strict):
    """The median wall time of the steps at one batch size, depth and path."""

    batch_size: int = Field(ge=1)
    depth: int = Field(ge=0)
    path: Literal[VERIFY_CELL, PLAIN_CELL, CATCH_UP_CELL]  # type: ignore[valid-type]
    seconds: float = Field(gt=0)


class CatchUpTiming(_Strict):
    """A plain step that also ran the draft over ``positions`` positions it had missed."""

    batch_size: int = Field(ge=1)
    seconds: float = Field(gt=0)
    positions: int = Field(ge=1)


class ExtendTiming(_Strict):
    """A draft extend over a prefill's ``positions`` positions, timed alone."""

    seconds: float = Field(gt=0)
    positions: int = Field(ge=1)


class CostTimings(_Strict):
    cells: list[CellTiming]
    catch_ups: list[CatchUpTiming] = []
    draft_extends: list[ExtendTiming] = []


class ServerIdentity(_Strict):
    """What a step's cost depends on besides the batch size and the depth."""

    cpu: str
    threads: int = Field(ge=1)
    dtype: str
    target: str
    draft: str
    algorithm: str
    tp_size: int = Field(ge=1)
    candidates: list[int]

    def differences(self, running: ServerIdentity) -> list[str]:
        """``field: recorded != running`` for each field that differs."""
        return [
            f"{name}: {mine!r} != {theirs!r}"
            for name, mine in self
            if mine != (theirs := getattr(running, name))
        ]


class Calibration(_Strict):
    format: Literal[1] = FORMAT  # type: ignore[valid-type]
    server: ServerIdentity
    timings: CostTimings


def read_calibration(path: Path) -> Calibration:
    """The calibration in ``path``; ValueError saying what is wrong with the file."""
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror}") from error
    try:
        return Calibration.model_validate(json.loads(text))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not JSON: {error}") from error
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ValueError(f"{path}: {where}: {first['msg']}") from error


def write_calibration(calibration: Calibration, path: Path) -> None:
    Path(path).write_text(calibration.model_dump_json(indent=1) + "\n")
