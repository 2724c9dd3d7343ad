"""The model name `nanospec serve` announces (`/v1/models`, responses' `model` field).

SGLang names a model by its `--model-path` unless `--served-model-name` says otherwise; for
our prepared models that is a folder in the local cache, a path on the host that clients
and a router in front of several servers would see change from host to host. A model we
prepared (registry or tiny) is served under its own name instead.
"""

from __future__ import annotations

from pathlib import Path

from nanospec_server.models.paths import model_paths
from nanospec_server.models.registry import model_names
from nanospec_server.models.tiny.build import tiny_cache_root
from nanospec_server.models.tiny.spec import TINY_MODELS


def served_name(model_path: str) -> str | None:
    """The registry or tiny name of a model we prepared at `model_path`, else None."""
    path = Path(model_path).expanduser().resolve()
    registry_name = path.parent.name
    if registry_name in model_names() and path == model_paths(registry_name).hf_dir.resolve():
        return registry_name
    if path.name in TINY_MODELS and path.parent == tiny_cache_root().resolve():
        return path.name
    return None
