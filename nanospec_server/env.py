"""Every ``NANOSPEC_*`` environment variable nanospec-server reads: its name, default and meaning.

Each accessor reads the environment when called, so a variable set at runtime (by a test, or
by ``nanospec serve`` for SGLang's processes) is seen. Path-like values come back as the raw
string: each caller keeps its own default and expansion.
"""

from __future__ import annotations

import os

ADMIN_KEY = "NANOSPEC_ADMIN_KEY"
ADMIN_KEY_FILE = "NANOSPEC_ADMIN_KEY_FILE"
CACHE = "NANOSPEC_CACHE"
CONFIG = "NANOSPEC_CONFIG"
CPU_KEEP_FREED = "NANOSPEC_CPU_KEEP_FREED"
CPU_LINEAR = "NANOSPEC_CPU_LINEAR"
CPU_SHIM = "NANOSPEC_CPU_SHIM"
CPU_THREADS = "NANOSPEC_CPU_THREADS"
FREE_MEMORY_BYTES = "NANOSPEC_FREE_MEMORY_BYTES"
FORWARD_LOG = "NANOSPEC_FORWARD_LOG"
FUSED_TOPK = "NANOSPEC_FUSED_TOPK"
OPS = "NANOSPEC_OPS"
RECORD_STREAMS = "NANOSPEC_RECORD_STREAMS"
SETTINGS_TOKEN = "NANOSPEC_SETTINGS_TOKEN"
SPECBENCH = "NANOSPEC_SPECBENCH"
STATIC_SHAPES = "NANOSPEC_STATIC_SHAPES"
STATS_HISTORY = "NANOSPEC_STATS_HISTORY"
URL = "NANOSPEC_URL"
WORKER_NAME = "NANOSPEC_WORKER_NAME"


def admin_key() -> str | None:
    """NANOSPEC_ADMIN_KEY: the admin key; `nanospec serve` turns it into --admin-api-key. Unset: none."""
    return os.environ.get(ADMIN_KEY)


def admin_key_file() -> str | None:
    """NANOSPEC_ADMIN_KEY_FILE: a file holding the admin key (a Docker secret). Unset: none."""
    return os.environ.get(ADMIN_KEY_FILE)


def cache() -> str | None:
    """NANOSPEC_CACHE: the cache root (models, tiny models, compiled kernels, bench results).
    Unset: each caller's default under ``~/.cache``."""
    return os.environ.get(CACHE)


def config_json() -> str | None:
    """NANOSPEC_CONFIG: the NanoSpecConfig as JSON, set by `nanospec serve` for SGLang's
    processes. Unset: the default config."""
    return os.environ.get(CONFIG)


def cpu_keep_freed() -> bool:
    """NANOSPEC_CPU_KEEP_FREED: ``0`` leaves the scheduler's malloc at glibc's own thresholds
    (`sglang_plugin/cpu/heap.py`). Default on."""
    return os.environ.get(CPU_KEEP_FREED, "1") != "0"


def cpu_linear() -> bool:
    """NANOSPEC_CPU_LINEAR: ``0`` turns off the packed fp32 CPU linear layers. Default on."""
    return os.environ.get(CPU_LINEAR, "1") != "0"


def free_memory_bytes() -> int | None:
    """NANOSPEC_FREE_MEMORY_BYTES: the memory `nanospec serve`'s check takes as free on a CPU,
    for a host whose kernel misreports it (and for tests). Unset: read from the host."""
    value = os.environ.get(FREE_MEMORY_BYTES)
    return int(value) if value else None


def cpu_shim_switch() -> str:
    """NANOSPEC_CPU_SHIM: ``0`` never puts the ``sgl_kernel`` stand-in on the import path, ``1``
    always does. Default empty: decide from the host."""
    return os.environ.get(CPU_SHIM, "").strip()


def cpu_threads() -> int | None:
    """NANOSPEC_CPU_THREADS: threads per scheduler process. Unset: from the host's cores."""
    value = os.environ.get(CPU_THREADS)
    return int(value) if value else None


def forward_log() -> str | None:
    """NANOSPEC_FORWARD_LOG: a path prefix; each scheduler process appends a line per model forward to PREFIX.PID (`sglang_plugin/stats/forward_log.py`). Unset: none."""
    return os.environ.get(FORWARD_LOG) or None


def fused_topk() -> bool:
    """NANOSPEC_FUSED_TOPK: ``0`` keeps SGLang's own softmax and top-k over full-width logits
    instead of the top-k fused into the packed head. Default on."""
    return os.environ.get(FUSED_TOPK, "1") != "0"


def ops_backend() -> str | None:
    """NANOSPEC_OPS: ``reference|cpu|triton|cuda`` allows only that ops backend (plus the
    reference). Unset or empty: every backend that loads."""
    return os.environ.get(OPS) or None


def record_streams() -> str | None:
    """NANOSPEC_RECORD_STREAMS: a file to record every request's candidate stream into.
    Unset: nothing recorded."""
    return os.environ.get(RECORD_STREAMS)


def settings_token() -> str | None:
    """NANOSPEC_SETTINGS_TOKEN: the secret that authenticates live settings on SGLang's
    internal-state channel. Unset: the server makes one at start."""
    return os.environ.get(SETTINGS_TOKEN)


def specbench() -> str | None:
    """NANOSPEC_SPECBENCH: the Spec-Bench ``question.jsonl``. Unset: the one in ``shared/``."""
    return os.environ.get(SPECBENCH)


def static_shapes() -> bool:
    """NANOSPEC_STATIC_SHAPES: ``1`` forces the packed head's fixed (CUDA-graph) shapes on CPU.
    Default off there; CUDA always uses them."""
    return os.environ.get(STATIC_SHAPES) == "1"


def stats_history() -> str | None:
    """NANOSPEC_STATS_HISTORY: finished requests `/stats/vocab` keeps per DP rank, set by
    `nanospec serve`. Unset: the config's default."""
    return os.environ.get(STATS_HISTORY)


def url() -> str | None:
    """NANOSPEC_URL: the server `nanospec stats` and `nanospec config` talk to.
    Unset: the local default."""
    return os.environ.get(URL)


def worker_name() -> str | None:
    """NANOSPEC_WORKER_NAME: the Prometheus `worker` label. Unset: host:port."""
    return os.environ.get(WORKER_NAME)
