"""What every result file records: the command, versions, hardware and settings."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from nanospec_server.env import cache
from nanospec_server.host import cpu_model

_PACKAGES = ("sglang", "torch", "transformers", "nanospec-server")


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=True)  # fmt: skip
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()  # fmt: skip
        return out.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def hardware() -> dict:
    info = {"cpu": cpu_model(), "cores": os.cpu_count(), "platform": platform.platform()}
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        info["memory_gib"] = round(pages * page_size / 2**30, 1)
    except (ValueError, OSError):
        pass
    try:
        # deferred: imports torch only when called
        import torch

        info["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        info["cuda"] = None
    info["omp_num_threads"] = os.environ.get("OMP_NUM_THREADS")
    return info


def bench_root() -> Path:
    """Where results go unless told otherwise: ``$NANOSPEC_CACHE/bench``."""
    root = cache() or Path.home() / ".cache/nanospec-server"
    return Path(root) / "bench"


def command_line() -> str:
    """The command as the user typed it (`python -m nanospec_server.cli` reads as `nanospec`)."""
    program = Path(sys.argv[0]).name
    head = "nanospec" if program in ("cli.py", "nanospec") else sys.argv[0]
    return " ".join([head, *sys.argv[1:]])


def provenance(settings: dict) -> dict:
    return {
        "command": command_line(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": {p: _version(p) for p in _PACKAGES}
        | {"git": _git_commit(), "python": platform.python_version()},  # fmt: skip
        "hardware": hardware(),
        "settings": settings,
    }
