"""activate_shim / needs_shim decisions, without touching the real process state."""

from __future__ import annotations

import os
import sys

import pytest

from nanospec_server.sgl_kernel_cpu import shim as cpu_shim


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


# Every name SGLang 0.5.23's CPU path imports from sgl_kernel or looks up on torch.ops.
_SGLANG_CPU_NAMES = (
    "decode_attention_cpu",
    "extend_attention_cpu",
    "assign_req_to_token_pool_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_draft_cache_locs_contiguous_cpu",
    "copy_all_layer_kv_cache_cpu",
    "build_tree_kernel_efficient_cpu",
    "verify_tree_greedy_cpu",
    "fill_bonus_tokens_cpu",
    "fill_accept_out_cache_loc_cpu",
    "build_draft_decode_metadata_cpu",
)


def test_stand_in_package_imports_in_a_fresh_process() -> None:
    """What a spawned SGLang subprocess sees: PYTHONPATH with the shim dir, plain import."""
    import subprocess

    code = (
        "import sgl_kernel, torch\n"
        "assert sgl_kernel.IS_NANOSPEC_SHIM\n"
        f"for name in {_SGLANG_CPU_NAMES!r}:\n"
        "    assert callable(getattr(sgl_kernel, name)), name\n"
        "    assert hasattr(torch.ops.sgl_kernel, name), name\n"
        "assert not hasattr(torch.ops.sgl_kernel, 'convert_weight_packed')\n"
    )
    env = dict(os.environ, PYTHONPATH=str(cpu_shim.shim_dir()), OMP_NUM_THREADS="1")
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
