"""Tiny Llama test models, built offline and deterministically into a cache.

Six models share one byte-level BPE tokenizer (``tokenizer.py``, vocab 997)
and are all bfloat16 safetensors (see ``spec.TINY_MODELS``):

* ``tiny-target``: random 2-layer ``LlamaForCausalLM`` (hidden 64, 4 heads,
  2 KV heads, intermediate 128); ``tiny-eagle``: random 1-layer EAGLE draft
  (``LlamaForCausalLMEagle``) for it; ``tiny-standalone``: random 1-layer
  ``LlamaForCausalLM`` draft. For plumbing and engine smoke tests.
* ``agree-target`` / ``agree-eagle`` / ``agree-standalone``: a context-free
  target and two drafts that predict exactly its greedy next token, so greedy
  speculative decoding accepts every draft token (acceptance length
  num_steps + 1). See ``weights`` for the construction.

Each model directory is self-contained (config.json, model.safetensors,
tokenizer.json, tokenizer_config.json) so SGLang loads the tokenizer from the
model path. Directories live under ``<cache>/tiny-models/<name>`` where
``<cache>`` is the ``cache_dir`` argument, else ``$NANOSPEC_CACHE``, else
``~/.cache/nanospec-server``. A model is built into a temporary sibling and
renamed into place, so concurrent test processes never see a half-built one.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path

from safetensors.torch import save_file

from nanospec_server.env import cache
from nanospec_server.models.tiny.spec import TINY_MODELS, config_dict
from nanospec_server.models.tiny.tokenizer import write_tokenizer
from nanospec_server.models.tiny.weights import model_tensors

__all__ = ["TINY_MODELS", "build_tiny_models", "tiny_cache_root", "tiny_model_path"]

# Bump when the construction changes: cached models with another version are rebuilt.
BUILD_VERSION = 1
MANIFEST = "nanospec_tiny.json"


def tiny_cache_root(cache_dir: Path | None = None) -> Path:
    """The directory holding one subdirectory per tiny model."""
    if cache_dir is None:
        env = cache()
        cache_dir = Path(env) if env else Path.home() / ".cache" / "nanospec-server"
    return Path(cache_dir) / "tiny-models"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _is_complete(model_dir: Path) -> bool:
    try:
        manifest = json.loads((model_dir / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return manifest.get("build_version") == BUILD_VERSION and all(
        (model_dir / file).is_file() for file in manifest.get("files", {})
    )


def _write_model(name: str, out_dir: Path) -> None:
    """Write every file of model ``name`` into the existing ``out_dir``."""
    # Fixed metadata, no timestamps: identical bytes on every build.
    save_file(
        dict(model_tensors(name)), str(out_dir / "model.safetensors"), metadata={"format": "pt"}
    )
    (out_dir / "config.json").write_text(
        json.dumps(config_dict(TINY_MODELS[name]), indent=2, sort_keys=True) + "\n",
        encoding="utf-8",
    )
    write_tokenizer(out_dir)
    for path in out_dir.iterdir():
        path.chmod(0o644)  # safetensors writes owner-only files; the cache is shared
    files = {p.name: _sha256(p) for p in sorted(out_dir.iterdir())}
    manifest = {"build_version": BUILD_VERSION, "name": name, "files": files}
    # The manifest goes last: its presence (checked before use) marks completeness.
    (out_dir / MANIFEST).write_text(
        json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )


def _install(name: str, root: Path) -> Path:
    """Build ``name`` under ``root`` unless a complete copy is already there."""
    final = root / name
    if _is_complete(final):
        return final
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.build-", dir=root))
    staging.chmod(0o755)  # mkdtemp makes it private; the cache is meant to be shared
    try:
        _write_model(name, staging)
        if final.exists():
            # Stale (older build version or interrupted by hand): move it aside
            # first; rename onto a non-empty directory would fail.
            trash = Path(tempfile.mkdtemp(prefix=f".{name}.stale-", dir=root))
            try:
                final.rename(trash / name)
            except OSError:
                pass  # another process moved or replaced it first
            shutil.rmtree(trash, ignore_errors=True)
        try:
            staging.rename(final)
        except OSError:
            # Another process installed it between our check and rename.
            if not _is_complete(final):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def tiny_model_path(name: str, cache_dir: Path | None = None) -> Path:
    """Path of tiny model ``name``, building it on first use."""
    if name not in TINY_MODELS:
        raise KeyError(f"unknown tiny model {name!r}; known: {sorted(TINY_MODELS)}")
    return _install(name, tiny_cache_root(cache_dir))


def build_tiny_models(cache_dir: Path | None = None) -> dict[str, Path]:
    """Build (or reuse) all tiny models; returns name -> model directory."""
    return {name: tiny_model_path(name, cache_dir) for name in TINY_MODELS}
