"""activate_shim / needs_shim decisions, without touching the real process state."""

from __future__ import annotations

import os
import sys

import pytest

from nanospec_server.sglang_plugin import cpu_shim


@pytest.fixture
def clean_paths(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(cpu_shim.shim_dir())])
    monkeypatch.setenv("PYTHONPATH", "/some/where")
    monkeypatch.delenv("NANOSPEC_CPU_SHIM", raising=False)
    return monkeypatch


def test_shim_dir_holds_the_stand_in_package() -> None:
    assert (cpu_shim.shim_dir() / "sgl_kernel" / "__init__.py").is_file()


def test_env_switch_off_and_force(clean_paths: pytest.MonkeyPatch) -> None:
    clean_paths.setenv("NANOSPEC_CPU_SHIM", "0")
    assert not cpu_shim.needs_shim()
    assert not cpu_shim.activate_shim()
    assert str(cpu_shim.shim_dir()) not in sys.path

    clean_paths.setenv("NANOSPEC_CPU_SHIM", "1")
    assert cpu_shim.needs_shim()


def test_activate_is_idempotent_and_exports_pythonpath(clean_paths: pytest.MonkeyPatch) -> None:
    clean_paths.setenv("NANOSPEC_CPU_SHIM", "1")
    assert cpu_shim.activate_shim()
    assert cpu_shim.activate_shim()
    shim = str(cpu_shim.shim_dir())
    assert sys.path.count(shim) == 1 and sys.path[0] == shim
    parts = os.environ["PYTHONPATH"].split(os.pathsep)
    assert parts == [shim, "/some/where"]


def test_gpu_host_never_activates_automatically(clean_paths: pytest.MonkeyPatch) -> None:
    clean_paths.setattr(cpu_shim, "_cuda_available", lambda: True)
    assert not cpu_shim.needs_shim()


def test_auto_follows_real_sgl_kernel(clean_paths: pytest.MonkeyPatch) -> None:
    clean_paths.setattr(cpu_shim, "_cuda_available", lambda: False)
    clean_paths.setattr(cpu_shim, "real_sgl_kernel_loads", lambda: True)
    assert not cpu_shim.needs_shim()
    clean_paths.setattr(cpu_shim, "real_sgl_kernel_loads", lambda: False)
    assert cpu_shim.needs_shim()


def test_probe_ignores_the_shim_itself(clean_paths: pytest.MonkeyPatch) -> None:
    """With only the shim importable the probe must report no real sgl_kernel."""
    clean_paths.setattr(sys, "path", [str(cpu_shim.shim_dir()), *sys.path])
    clean_paths.delitem(sys.modules, "sgl_kernel", raising=False)
    cpu_shim.real_sgl_kernel_loads.cache_clear()
    try:
        import importlib.machinery

        others = [p for p in sys.path if p != str(cpu_shim.shim_dir())]
        if importlib.machinery.PathFinder.find_spec("sgl_kernel", others) is not None:
            pytest.skip("a real sgl_kernel is installed here")
        assert cpu_shim.real_sgl_kernel_loads() is False
    finally:
        cpu_shim.real_sgl_kernel_loads.cache_clear()
