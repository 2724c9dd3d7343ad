"""Where prepared models live on disk: `<cache root>/models/<name>/{wheels,gguf,hf}`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nanospec_server.env import cache


def cache_root() -> Path:
    """The cache root: `$NANOSPEC_CACHE`, else `~/.cache/nanospec-server`."""
    override = cache()
    if override:
        return Path(override).expanduser()
    return Path.home() / ".cache" / "nanospec-server"


@dataclass(frozen=True)
class ModelPaths:
    model_dir: Path

    @property
    def wheels_dir(self) -> Path:
        return self.model_dir / "wheels"

    @property
    def gguf_dir(self) -> Path:
        return self.model_dir / "gguf"

    @property
    def hf_dir(self) -> Path:
        return self.model_dir / "hf"

    def gguf_file(self, filename: str) -> Path:
        return self.gguf_dir / filename


def model_paths(name: str, root: Path | None = None) -> ModelPaths:
    return ModelPaths((root if root is not None else cache_root()) / "models" / name)


def disk_usage_bytes(path: Path) -> int:
    """Bytes taken by the files under `path` (0 if it does not exist)."""
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
