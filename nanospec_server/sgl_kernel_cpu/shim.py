"""Decide whether to put nanospec's ``sgl_kernel`` stand-in on the import path, and do it.

SGLang's CPU path (``SGLANG_USE_CPU_ENGINE=1``) imports ``sgl_kernel`` for a few CPU ops.
On hosts where no real sgl_kernel loads (no CPU build installed, or only the CUDA wheel
without a driver) and CUDA is absent, ``activate_shim()`` prepends ``shim_dir()`` to
``sys.path`` and ``PYTHONPATH``. ``PYTHONPATH`` matters: SGLang's scheduler and detokenizer
subprocesses import sgl_kernel while unpickling their arguments, before any plugin runs.

Environment switch ``NANOSPEC_CPU_SHIM``: ``0`` never activates, ``1`` always activates
(testing), unset/anything else decides automatically. A CUDA host never activates
automatically.
"""

from __future__ import annotations

import functools
import importlib.machinery
import os
import subprocess
import sys
from pathlib import Path

from nanospec_server import seams
from nanospec_server.env import CPU_SHIM, cpu_shim_switch

__all__ = ["activate_shim", "needs_shim", "real_sgl_kernel_loads", "shim_dir"]

_PROBE_TIMEOUT_S = 120
_MODULE = seams.SGL_KERNEL.target


def shim_dir() -> Path:
    """The directory holding the stand-in ``sgl_kernel`` package."""
    return Path(__file__).resolve().parent / "import_root"


def _without_shim(paths: list[str]) -> list[str]:
    shim = str(shim_dir())
    return [p for p in paths if p and os.path.abspath(p) != shim]


@functools.lru_cache(maxsize=1)
def real_sgl_kernel_loads() -> bool:
    """True if a real (non-shim) sgl_kernel is importable and its import succeeds.

    The import is tried in a subprocess: the CUDA wheel raises (or worse) at import time
    on a host without a driver, and a failed extension import can leave this process
    half-initialised. The subprocess sees neither the shim dir nor ``NANOSPEC_CPU_SHIM``.
    """
    loaded = sys.modules.get(_MODULE)
    if loaded is not None:
        return not getattr(loaded, "IS_NANOSPEC_SHIM", False)
    search_path = _without_shim(sys.path)
    if importlib.machinery.PathFinder.find_spec(_MODULE, search_path) is None:
        return False
    env = dict(os.environ)
    env.pop(CPU_SHIM, None)
    env["PYTHONPATH"] = os.pathsep.join(_without_shim(env.get("PYTHONPATH", "").split(os.pathsep)))
    probe = (
        f"import sys; sys.path[:] = [p for p in sys.path if p != {str(shim_dir())!r}]\n"
        f"import {_MODULE}\n"
        f"sys.exit(3 if getattr({_MODULE}, 'IS_NANOSPEC_SHIM', False) else 0)\n"
    )
    try:
        result = subprocess.run(
            [sys.executable, "-c", probe],
            env=env,
            capture_output=True,
            timeout=_PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def _cuda_available() -> bool:
    try:
        # deferred: imports torch only when called
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def needs_shim() -> bool:
    """Whether this process should use the stand-in (honours ``NANOSPEC_CPU_SHIM``)."""
    switch = cpu_shim_switch()
    if switch == "0":
        return False
    if switch == "1":
        return True
    # GPU hosts always get the real sgl_kernel; check CUDA first, it is the cheap test.
    if _cuda_available():
        return False
    return not real_sgl_kernel_loads()


def activate_shim() -> bool:
    """Put the stand-in first on ``sys.path`` and ``PYTHONPATH`` when needed.

    Idempotent (never adds the directory twice). Returns True if the shim is active in this
    process after the call, False if it is not needed or switched off.
    """
    if not needs_shim():
        return False
    loaded = sys.modules.get(_MODULE)
    if loaded is not None and not getattr(loaded, "IS_NANOSPEC_SHIM", False):
        # A real sgl_kernel is already imported here; putting the shim on the path
        # now would only split the process from its subprocesses.
        return False
    shim = str(shim_dir())
    if shim not in sys.path:
        sys.path.insert(0, shim)
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if shim not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([shim, *parts])
    return True
