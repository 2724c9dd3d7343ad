"""Train a registry target's EAGLE head the first time it is asked for (`nanospec models prepare`)."""

from __future__ import annotations

from pathlib import Path

from nanospec_server.models.eagle_heads import HeadSpec, head_dir, is_ready
from nanospec_server.train.recipe import recipe_for
from nanospec_server.train.run import TrainRequest, train_eagle


def prepare_head(spec: HeadSpec, root: Path | None = None) -> tuple[Path, bool]:
    """(the head's directory, whether it was already there); trains it when missing.

    Training writes to a sibling ``.partial`` directory renamed at the end, so an
    interrupted run never leaves a half head behind (its feature cache resumes).
    """
    path = head_dir(spec, root)
    if is_ready(path):
        return path, True
    partial = path.with_name(path.name + ".partial")
    train_eagle(TrainRequest(target=spec.target, output=partial, recipe=recipe_for(spec.target)))
    partial.rename(path)
    return path, False
