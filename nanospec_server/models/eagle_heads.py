"""EAGLE draft heads for the registry targets: committed when small, trained on demand otherwise
(``train/on_demand.py``).

A head under 50 MB lives in ``models/heads/<name>/``; a larger one (the 1.5B target's is
~100 MB) is produced by ``nanospec train-eagle`` with the target's recipe the first time
``nanospec models prepare <name>`` asks for it (~50 min on 2 CPU cores), into
``<nanospec cache>/models/<name>/``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nanospec_server.models.paths import cache_root

COMMITTED_DIR = Path(__file__).parent / "heads"


@dataclass(frozen=True)
class HeadSpec:
    name: str
    target: str  # registry name of the target it drafts for
    committed: bool  # shipped in COMMITTED_DIR rather than trained on demand


HEADS: tuple[HeadSpec, ...] = (
    HeadSpec("qwen2.5-coder-0.5b-instruct-eagle", "qwen2.5-coder-0.5b-instruct", committed=True),
    HeadSpec("qwen2.5-coder-1.5b-instruct-eagle", "qwen2.5-coder-1.5b-instruct", committed=False),
)


def get_head_spec(name: str) -> HeadSpec | None:
    return next((spec for spec in HEADS if spec.name == name), None)


def head_dir(spec: HeadSpec, root: Path | None = None) -> Path:
    if spec.committed:
        return COMMITTED_DIR / spec.name
    return (root or cache_root()) / "models" / spec.name


def is_ready(path: Path) -> bool:
    return (path / "config.json").is_file() and (path / "model.safetensors").is_file()
