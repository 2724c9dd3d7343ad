"""The goodput policy's calibration inside a speculative worker: what identifies this
server's step costs, starting the policy from a calibration file recorded on the same,
and the calibration `/stats/vocab.adaptive` publishes for the next start
(`adaptive/calibration.py`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from nanospec_server.adaptive.calibration import (
    Calibration,
    CostTimings,
    ServerIdentity,
    read_calibration,
)
from nanospec_server.adaptive.depth_policy import DepthPolicy
from nanospec_server.host import cpu_model

logger = logging.getLogger(__name__)

FLAG = "--nanospec-adaptive-calibration"


def server_identity(worker, candidates: list[int]) -> ServerIdentity:
    """This speculative worker's identity as a calibration records it."""
    args = worker.server_args
    device = torch.cuda.get_device_name(0) if args.device == "cuda" else cpu_model()
    return ServerIdentity(
        cpu=device,
        threads=torch.get_num_threads(),
        dtype=str(worker._target_worker.model_runner.dtype).removeprefix("torch."),
        target=str(args.model_path),
        draft=str(args.speculative_draft_model_path),
        algorithm=str(args.speculative_algorithm),
        tp_size=int(args.tp_size),
        candidates=list(candidates),
    )


def start_from(policy: DepthPolicy, path: str, identity: ServerIdentity) -> None:
    """Start ``policy`` from the calibration in ``path``; ValueError naming the flag if the
    file is unusable or was recorded on another server."""
    try:
        calibration = read_calibration(Path(path))
    except ValueError as error:
        raise ValueError(f"{FLAG}: {error}") from error
    if differences := calibration.server.differences(identity):
        raise ValueError(
            f"{FLAG}: {path} was recorded on another server ({'; '.join(differences)})"
        )
    policy.calibrate(calibration.timings.model_dump())
    logger.info(
        "nanospec: the cost model starts from %s (%d step cells)",
        path,
        len(calibration.timings.cells),
    )


def published(policy: DepthPolicy, identity: ServerIdentity) -> dict[str, Any] | None:
    """The calibration this server would write now (None until its cost model is ready)."""
    timings = policy.cost_timings()
    if timings is None:
        return None
    calibration = Calibration(server=identity, timings=CostTimings.model_validate(timings))
    return calibration.model_dump(mode="json")
