"""EAGLE draft heads for the registry targets: committed when small, trained on demand otherwise.

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


def prepare_head(spec: HeadSpec, root: Path | None = None) -> tuple[Path, bool]:
    """(the head's directory, whether it was already there); trains it when missing.

    Training writes to a sibling ``.partial`` directory renamed at the end, so an
    interrupted run never leaves a half head behind (its feature cache resumes).
    """
    path = head_dir(spec, root)
    if is_ready(path):
        return path, True
    from nanospec_server.train.recipe import recipe_for
    from nanospec_server.train.run import TrainRequest, train_eagle

    partial = path.with_name(path.name + ".partial")
    train_eagle(TrainRequest(target=spec.target, output=partial, recipe=recipe_for(spec.target)))
    partial.rename(path)
    return path, False
