"""The memory a CPU server needs, the memory free, and the refusal when one exceeds the other."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from safetensors.torch import load_file

from nanospec_server import env, memory_check
from nanospec_server.memory_check import GIB, Needs, cgroup_room, meminfo_available, refusal
from nanospec_server.models.tiny import tiny_model_path
from nanospec_server.ops import packed_linear

MEMINFO = "MemTotal:       23000000 kB\nMemFree:         1000000 kB\nMemAvailable:   12345678 kB\n"


def test_meminfo_available_reads_kib_as_bytes() -> None:
    assert meminfo_available(MEMINFO) == 12345678 * 1024
    assert meminfo_available("MemTotal: 1 kB\n") is None


@given(limit=st.integers(1, 2**50), usage=st.integers(0, 2**50))
def test_cgroup_v2_room_is_limit_minus_usage(tmp_path_factory, limit: int, usage: int) -> None:
    root = tmp_path_factory.mktemp("v2")
    (root / "memory.max").write_text(f"{limit}\n")
    (root / "memory.current").write_text(f"{usage}\n")
    assert cgroup_room(root) == limit - usage


@given(limit=st.integers(1, 2**50), usage=st.integers(0, 2**50))
def test_cgroup_v1_room_is_limit_minus_usage(tmp_path_factory, limit: int, usage: int) -> None:
    root = tmp_path_factory.mktemp("v1")
    (root / "memory").mkdir()
    (root / "memory" / "memory.limit_in_bytes").write_text(f"{limit}\n")
    (root / "memory" / "memory.usage_in_bytes").write_text(f"{usage}\n")
    assert cgroup_room(root) == limit - usage


def test_no_cgroup_limit_is_no_room_bound(tmp_path: Path) -> None:
    (tmp_path / "memory.max").write_text("max\n")
    (tmp_path / "memory.current").write_text("123\n")
    assert cgroup_room(tmp_path) is None
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text(f"{2**63 - 4096}\n")
    (v1 / "memory" / "memory.usage_in_bytes").write_text("123\n")
    assert cgroup_room(v1) is None
    assert cgroup_room(tmp_path / "none") is None


def test_free_memory_is_the_smaller_reading_unless_overridden(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv(env.FREE_MEMORY_BYTES, raising=False)
    (tmp_path / "memory.max").write_text(f"{3 * GIB}\n")
    (tmp_path / "memory.current").write_text(f"{GIB}\n")
    monkeypatch.setattr(memory_check, "CGROUP_ROOT", tmp_path)
    assert memory_check.free_bytes() <= 2 * GIB
    monkeypatch.setenv(env.FREE_MEMORY_BYTES, "12345")
    assert memory_check.free_bytes() == 12345


def test_weights_and_kv_pool_of_the_tiny_models(monkeypatch) -> None:
    monkeypatch.setenv(env.CPU_LINEAR, "0")  # no packed copies
    target, draft = tiny_model_path("tiny-target"), tiny_model_path("tiny-eagle")
    stored = sum(
        t.numel() for m in (target, draft) for t in load_file(m / "model.safetensors").values()
    )
    needs = memory_check.needs_of(target, draft, "bfloat16", 1000, packed_head=7)
    assert needs.weights == stored * torch.bfloat16.itemsize
    per_token = sum(memory_check.kv_bytes_per_token(m, 2) for m in (target, draft))
    assert needs.kv_pool == 1000 * per_token and needs.packed_head == 7


def test_fp32_counts_the_packed_copy_of_each_lm_head_nanospec_does_not_compute(
    monkeypatch,
) -> None:
    monkeypatch.delenv(env.CPU_LINEAR, raising=False)
    target, draft = tiny_model_path("tiny-target"), tiny_model_path("tiny-eagle")
    head = {m: load_file(m / "model.safetensors").get("lm_head.weight") for m in (target, draft)}
    target_head = json.loads((target / "config.json").read_text())
    target_copy = target_head["vocab_size"] * target_head["hidden_size"] * 4
    # a draft without its own head rows shares the target's head, and its one packed copy
    draft_copy = 0 if head[draft] is None else head[draft].numel() * 4
    full = memory_check.needs_of(target, draft, "float32", None, 0, nanospec=False)
    assert full.packed_head == target_copy + draft_copy
    nanospec = memory_check.needs_of(target, draft, "float32", None, 7, nanospec=True)
    assert nanospec.packed_head == 7 + target_copy
    monkeypatch.setenv(env.CPU_LINEAR, "0")
    assert memory_check.needs_of(target, draft, "float32", None, 7, nanospec=True).packed_head == 7
    assert memory_check.needs_of(target, None, "bfloat16", None, 0).kv_pool is None


@pytest.mark.parametrize("native", [True, False])
def test_bf16_counts_packed_heads_at_the_dtype_they_compute_in(monkeypatch, native) -> None:
    monkeypatch.delenv(env.CPU_LINEAR, raising=False)
    monkeypatch.setattr(packed_linear, "native_bf16", lambda: native)
    target = tiny_model_path("tiny-target")
    config = json.loads((target / "config.json").read_text())
    stored = sum(t.numel() for t in load_file(target / "model.safetensors").values())
    needs = memory_check.needs_of(target, None, "bfloat16", None, 0)
    packed = 2 if native else 4  # without native bf16 the layers are packed as fp32
    assert needs.packed_head == config["vocab_size"] * config["hidden_size"] * packed
    assert needs.weights == stored * packed
    assert memory_check.needs_of(target, None, "float16", None, 0).packed_head == 0


@given(
    weights=st.integers(0, 64 * GIB),
    kv=st.one_of(st.none(), st.integers(0, 64 * GIB)),
    free=st.integers(0, 128 * GIB),
    fraction=st.floats(0.05, 0.95),
)
def test_refused_exactly_when_a_rule_fails(weights, kv, free, fraction) -> None:
    needs = Needs(weights=weights, packed_head=GIB // 4, kv_pool=kv)
    loaded_fits = weights + GIB // 4 <= max(free - needs.overhead, 0) * fraction
    total_fits = kv is None or needs.total <= free
    message = refusal(needs, free, fraction)
    assert (message is None) == (loaded_fits and total_fits)
    if message is not None and free <= needs.overhead:
        assert "less than SGLang's processes take" in message, message
    elif message is not None:
        flags = ["--mem-fraction-static", "--dtype"] if not loaded_fits else ["--max-total-tokens"]
        assert all(flag in message for flag in flags), message


@pytest.mark.parametrize("dtype,size", [("float32", 4), ("bfloat16", 2), ("auto", 2)])
def test_served_dtype(dtype: str, size: int) -> None:
    # the tiny models are stored in bfloat16
    assert memory_check.served_dtype_bytes(dtype, tiny_model_path("tiny-target")) == size


def test_nanospec_serve_refuses_before_loading_any_weights(tmp_path: Path) -> None:
    free = memory_check.OVERHEAD_BYTES + 2**20  # NanoSpec's state alone takes more than 1 MiB
    environment = dict(os.environ, **{env.FREE_MEMORY_BYTES: str(free)})
    served = subprocess.run(
        [sys.executable, "-m", "nanospec_server.cli", "serve", "--tiny"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = served.stdout + served.stderr
    assert served.returncode == 2, out[-3000:]
    assert "nanospec: error: not enough memory: this server loads weights" in out, out[-3000:]
    assert "--mem-fraction-static" in out and "--dtype" in out
    assert "Load weight begin" not in out and "sglang::scheduler" not in out
