"""Refuse a CPU server whose configuration cannot fit in the memory free now, before any
weights load: a server that only finds out while loading pushes other processes out
(or is OOM-killed mid warm-up).

Needed: the weights at the served dtype (target + draft, counted from the safetensors
headers; bf16 linear layers packed as fp32 where the CPU has no native bf16), the packed
heads (NanoSpec's draft head; in fp32 and bf16 the oneDNN copy of each LM head, beside the
plain rows), the KV pool of `--max-total-tokens` (target +
draft layers), and `OVERHEAD_BYTES` for SGLang's three processes. Free: the smaller of
`/proc/meminfo`'s MemAvailable and the cgroup's limit minus its usage. SGLang itself
sizes a CPU KV pool within `--mem-fraction-static` of the memory free when its scheduler
starts loading, and fails only after loading when the weights leave nothing for it
("Loaded weights leave no GPU memory for the KV cache"): that rule is checked here first.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

from nanospec_server.env import cpu_linear, free_memory_bytes

# Documented override of the free-memory reading (bytes), for hosts whose limits the
# kernel files do not show, and for tests.
# The launcher (HTTP + tokenizer), scheduler and detokenizer of a server on the tiny models,
# i.e. torch, SGLang and their imports, measured after one request, with speculation or
# without: 1.9 GiB proportional set size, 1.6 GiB unique (the three RSS add up to 2.7 GiB,
# counting the shared libraries once per process).
OVERHEAD_BYTES = 2 * 2**30
CGROUP_ROOT = Path("/sys/fs/cgroup")
# cgroup v1 reports "no limit" as a page-rounded 2^63 - 1.
NO_LIMIT_V1 = 2**60
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}
SAFETENSORS_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "I8": 1, "U8": 1}
GIB = 2**30


@dataclass(frozen=True)
class Needs:
    weights: int
    packed_head: int
    kv_pool: int | None  # None: SGLang sizes it from what is left
    overhead: int = OVERHEAD_BYTES

    @property
    def total(self) -> int:
        return self.weights + self.packed_head + (self.kv_pool or 0) + self.overhead


def meminfo_available(text: str) -> int | None:
    """MemAvailable in bytes, from `/proc/meminfo`'s text."""
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def cgroup_room(root: Path | None = None) -> int | None:
    """The cgroup's memory limit minus its usage (v2, else v1); None without a limit."""
    root = CGROUP_ROOT if root is None else root
    v2_limit, v2_usage = root / "memory.max", root / "memory.current"
    if v2_limit.exists() and v2_usage.exists():
        limit = v2_limit.read_text().strip()
        if limit == "max":
            return None
        return int(limit) - int(v2_usage.read_text())
    v1_limit = root / "memory" / "memory.limit_in_bytes"
    v1_usage = root / "memory" / "memory.usage_in_bytes"
    if v1_limit.exists() and v1_usage.exists():
        limit = int(v1_limit.read_text())
        if limit >= NO_LIMIT_V1:
            return None
        return limit - int(v1_usage.read_text())
    return None


def free_bytes() -> int:
    """Memory free for a new server: $NANOSPEC_FREE_MEMORY_BYTES, else the smaller of
    MemAvailable and the cgroup's room."""
    if (override := free_memory_bytes()) is not None:
        return override
    readings = [meminfo_available(Path("/proc/meminfo").read_text()), cgroup_room()]
    return min(r for r in readings if r is not None)


def parameter_count(model_dir: Path) -> int:
    """Elements of every tensor in the model's safetensors files (headers only)."""
    return sum(math.prod(shape) for shape in tensor_shapes(model_dir).values())


def tensor_shapes(model_dir: Path) -> dict[str, list[int]]:
    """Every tensor's shape, from the model's safetensors headers."""
    shapes: dict[str, list[int]] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        with open(path, "rb") as file:
            (length,) = struct.unpack("<Q", file.read(8))
            header = json.loads(file.read(length))
        shapes.update({k: v["shape"] for k, v in header.items() if k != "__metadata__"})
    return shapes


def packed_lm_head_copies(target: Path, draft: Path | None, nanospec: bool) -> int:
    """Elements of the oneDNN-packed LM-head copies a CPU server makes on first use
    (`sglang_plugin/cpu/linear.py`), beside the plain rows the embedding (tied) or SGLang's
    head module (untied) keeps: the target's head, and a draft's own head unless NanoSpec
    computes it."""
    if not cpu_linear():
        return 0
    config = json.loads((target / "config.json").read_text())
    elements = config["vocab_size"] * config["hidden_size"]
    if draft is not None and not nanospec:
        elements += math.prod(tensor_shapes(draft).get("lm_head.weight", [0]))
    return elements


def served_dtype(dtype: str, model_dir: Path) -> str:
    """`--dtype`'s name (`auto`: the checkpoint's own dtype)."""
    if dtype == "auto":
        config = json.loads((model_dir / "config.json").read_text())
        dtype = str(config.get("torch_dtype") or config.get("dtype") or "float32")
    return dtype.removeprefix("torch.")


def served_dtype_bytes(dtype: str, model_dir: Path) -> int:
    """Bytes per element at `--dtype` (`auto`: the checkpoint's own dtype)."""
    return DTYPE_BYTES.get(served_dtype(dtype, model_dir), 4)


def packed_bytes(dtype: str) -> int | None:
    """Bytes per element of the oneDNN-packed weights at a served dtype (fp32; bf16 where
    the CPU computes in bf16, else fp32), or None where nothing is packed."""
    if not cpu_linear():
        return None
    # deferred: imports torch only when called
    import torch

    from nanospec_server.ops import packed_linear

    torch_dtype = getattr(torch, dtype, None)
    if torch_dtype not in packed_linear.PACKABLE_DTYPES:
        return None
    return packed_linear.compute_dtype(torch_dtype).itemsize


def kv_bytes_per_token(model_dir: Path, element_size: int) -> int:
    """K and V of every layer for one token."""
    config = json.loads((model_dir / "config.json").read_text())
    heads = config.get("num_key_value_heads") or config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return 2 * config["num_hidden_layers"] * heads * head_dim * element_size


def size(bytes_: float) -> str:
    return f"{bytes_ / GIB:.2f} GiB" if bytes_ >= GIB else f"{bytes_ / 2**20:.1f} MiB"


def refusal(needs: Needs, free: int, mem_fraction_static: float) -> str | None:
    """Why this server cannot fit in `free` bytes (None: it fits). SGLang's rule first:
    weights and head within `mem_fraction_static` of what is free once its processes run;
    then, with a KV pool of a set size, everything within what is free."""
    loaded = needs.weights + needs.packed_head
    parts = f"weights {size(needs.weights)} + NanoSpec's packed head {size(needs.packed_head)}"
    if free <= needs.overhead:
        return (
            f"only {size(free)} is free, less than SGLang's processes take "
            f"({size(needs.overhead)}) before loading {parts}; free memory on this "
            "host, or serve where more is free"
        )
    budget = (free - needs.overhead) * mem_fraction_static
    if loaded > budget:
        return (
            f"this server loads {parts} = {size(loaded)}, more than "
            f"--mem-fraction-static={mem_fraction_static} of the {size(free)} free "
            f"less {size(needs.overhead)} for SGLang's processes "
            f"({size(budget)}); raise --mem-fraction-static, or serve a smaller "
            "--dtype (bfloat16) or model"
        )
    if needs.kv_pool is not None and needs.total > free:
        return (
            f"this server needs {parts} + KV cache {size(needs.kv_pool)} + SGLang's "
            f"processes {size(needs.overhead)} = {size(needs.total)}, more "
            f"than the {size(free)} free; lower --max-total-tokens, or serve a "
            "smaller --dtype (bfloat16)"
        )
    return None


def packed_head_bytes(draft_dir: Path, element_size: int, w_cap: int, slots: int) -> int:
    """NanoSpec's state beside the draft: window slots and the packed head's rows."""
    from nanospec_server.vocab.dynamic_vocab import DynamicVocab

    config = json.loads((draft_dir / "config.json").read_text())
    return DynamicVocab.state_bytes(
        config["vocab_size"], w_cap, slots + 1, config["hidden_size"], element_size
    )


def needs_of(
    target: Path,
    draft: Path | None,
    dtype: str,
    max_total_tokens: int | None,
    packed_head: int,
    nanospec: bool = False,
) -> Needs:
    element_size = served_dtype_bytes(dtype, target)
    packed = packed_bytes(served_dtype(dtype, target))
    models = [target] if draft is None else [target, draft]
    # bf16 layers packed as fp32 (no native bf16) take fp32's bytes: counted for all weights
    weights = sum(parameter_count(model) for model in models) * max(element_size, packed or 0)
    if packed is not None:  # the LM heads get packed copies beside their plain rows
        packed_head += packed_lm_head_copies(target, draft, nanospec) * packed
    kv_pool = None
    if max_total_tokens is not None:
        kv_pool = max_total_tokens * sum(kv_bytes_per_token(m, element_size) for m in models)
    return Needs(weights=weights, packed_head=packed_head, kv_pool=kv_pool)


# SGLang's CPU default for --max-running-requests, which sizes NanoSpec's window slots.
DEFAULT_RUNNING_REQUESTS = 2048


def check_server(server_args, config) -> str | None:
    """Why SGLang's resolved `server_args` cannot serve here (None: it fits, or its
    models are no local safetensors directories to read)."""
    from sglang.srt.arg_groups.overrides import resolution_result

    from nanospec_server.config import Mode

    def resolved(field: str):  # SGLang's resolution declares defaults beside the raw flags
        return resolution_result(server_args, field, getattr(server_args, field))

    target = Path(server_args.model_path)
    draft_path = server_args.speculative_draft_model_path
    draft = Path(draft_path) if draft_path else None
    if not all(m.is_dir() and any(m.glob("*.safetensors")) for m in [target, draft] if m):
        return None
    packed_head, nanospec = 0, draft is not None and config.mode == Mode.NANOSPEC
    if nanospec:
        slots = resolved("max_running_requests") or DEFAULT_RUNNING_REQUESTS
        element_size = served_dtype_bytes(resolved("dtype"), target)
        packed_head = packed_head_bytes(draft, element_size, config.w_cap, slots)
    dtype, tokens = resolved("dtype"), resolved("max_total_tokens")
    needs = needs_of(target, draft, dtype, tokens, packed_head, nanospec)
    return refusal(needs, free_bytes(), resolved("mem_fraction_static"))
