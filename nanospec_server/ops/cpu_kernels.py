"""The CPU fast path (``ops/kernels/vocab_cpu.cpp``, ``ops/kernels/topk_cpu.cpp``), built with
the system C++ compiler.

The sources have no torch headers, so they build in a few seconds; the shared library is
built for the host's CPU (``-march=native``: the top-k pass reads a step's logits at about
the speed of memory only with the wider vector units), cached by the hash of the sources and
of the CPU's feature flags under ``$NANOSPEC_CACHE`` (default ``~/.cache/nanospec``), so a
cache shared by hosts of different CPUs never hands one the other's build, and called
through ctypes. State tensors never move, so their pointers are taken once.
"""

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
from pathlib import Path

import torch
from torch import Tensor

from nanospec_server.env import cache as cache_env
from nanospec_server.ops.build import KERNEL_DIR
from nanospec_server.ops.w_max import w_max_per_row

SOURCES = (KERNEL_DIR / "vocab_cpu.cpp", KERNEL_DIR / "topk_cpu.cpp")
# The pass is bound by memory: starting a thread costs more than it saves below this many
# rows (a 152k vocabulary on 2 cores: one thread beat two at 16 and 32 rows).
ROWS_PER_THREAD = 64


@functools.cache
def library() -> ctypes.CDLL:
    compiler = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    if compiler is None:
        raise FileNotFoundError("no C++ compiler")
    content = b"".join(path.read_bytes() for path in SOURCES) + _cpu_features()
    digest = hashlib.sha256(content).hexdigest()[:16]
    cache = Path(raw if (raw := cache_env()) is not None else Path.home() / ".cache" / "nanospec")
    target = cache / f"cpu_kernels-{digest}.so"
    if not target.exists():
        cache.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(f".{os.getpid()}.tmp")  # atomic for concurrent builds
        sources = [str(path) for path in SOURCES]
        command = [compiler, "-O3", "-std=c++17", "-shared", "-fPIC", "-pthread", *sources, "-o"]
        native = [*command[:2], "-march=native", *command[2:]]
        try:
            subprocess.run([*native, str(partial)], check=True, capture_output=True)
        except subprocess.CalledProcessError:  # a compiler without -march=native
            subprocess.run([*command, str(partial)], check=True, capture_output=True)
        partial.rename(target)
    lib = ctypes.CDLL(str(target))
    lib.nanospec_append.restype = ctypes.c_int64
    lib.nanospec_refresh.restype = ctypes.c_int64
    lib.nanospec_topk_rows.restype = None
    return lib


def _cpu_features() -> bytes:
    """What a native build depends on: the CPU's feature flags (Linux), else its name."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line.encode()
    except OSError:
        pass
    return platform.machine().encode() + platform.processor().encode()


def _ptr(tensor: Tensor) -> ctypes.c_void_p:
    assert tensor.is_contiguous() and tensor.device.type == "cpu"
    return ctypes.c_void_p(tensor.data_ptr())


def _int(value: int) -> ctypes.c_int64:
    return ctypes.c_int64(value)


class CpuVocabKernels:
    """WindowState.append and WindowState.refresh/release + UnionHead.apply, fused in C++,
    for one (window, head) pair."""

    def __init__(self, window, head):
        self.lib = library()
        element = head.buf.element_size()
        sizes = (_int(window.w_cap), _int(window.vocab_size))
        self.append_state = (_ptr(window.ring), _ptr(window.latest), _ptr(window.length))
        self.append_state += sizes
        self.refresh_state = (
            _ptr(window.ring), _ptr(window.latest), _ptr(window.length),
            _ptr(window.members), _ptr(window.in_set), _ptr(head.ids), _ptr(head.row_of),
            _ptr(head.ref), _ptr(head.count), _ptr(head.buf), _int(head.buf.stride(0) * element),
            _ptr(head.weight), _int(head.weight.stride(0) * element),
            _int(head.buf.shape[1] * element), _int(head.capacity),
        )  # fmt: skip
        self.sizes = sizes

    @staticmethod
    def applies(window, head) -> bool:
        """CPU tensors with dense rows."""
        return head.buf.device.type == "cpu" and head.weight.is_contiguous()

    def append(self, slots: Tensor, tokens: Tensor, valid: Tensor | None) -> None:
        tokens = tokens.to(torch.int64).contiguous()
        valid_ptr = None if valid is None else _ptr(valid.to(torch.bool).contiguous())
        batch, cols = tokens.shape
        invalid = self.lib.nanospec_append(
            _int(batch), _int(cols), _ptr(slots), _ptr(tokens), valid_ptr, *self.append_state
        )
        if invalid:
            raise IndexError(f"{invalid} appended token ids are outside [0, vocab_size)")

    def refresh(self, slots: Tensor, w_max: int | Tensor, release: bool = False) -> int:
        """``w_max``: one for all slots, or one per row of ``slots``. Returns how many new
        tokens found no row in the union buffer (not admitted)."""
        w_max = w_max_per_row(w_max, slots)
        return self.lib.nanospec_refresh(
            _int(len(slots)), _ptr(slots), _ptr(w_max), *self.sizes, ctypes.c_bool(release),
            *self.refresh_state,
        )  # fmt: skip


def topk_rows(logits: Tensor, k: int, nan_rows: Tensor | None = None) -> Tensor:
    """Indices [rows, k] (int64) of each row's k largest entries of a CPU float32 or
    bfloat16 matrix: descending value, the lowest index first among equal values, NaN
    never among them (a row with fewer than k entries above -inf gets the lowest indices
    not taken). ``nan_rows`` (bool [rows], when given) is set to which rows hold a NaN, in
    the same pass. Rows are split among torch's intra-op threads, ``ROWS_PER_THREAD`` or
    more each."""
    rows, cols = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    out = torch.empty((rows, k), dtype=torch.int64)
    if nan_rows is not None:
        assert nan_rows.shape == (rows,) and nan_rows.dtype == torch.bool
        nan_rows.zero_()
    library().nanospec_topk_rows(
        _ptr_any(logits), _int(rows), _int(cols), _int(logits.stride(0)), _int(k),
        ctypes.c_bool(logits.dtype == torch.bfloat16), _ptr(out),
        None if nan_rows is None else _ptr(nan_rows),
        _int(max(1, min(torch.get_num_threads(), rows // ROWS_PER_THREAD))),
    )  # fmt: skip
    return out


def _ptr_any(tensor: Tensor) -> ctypes.c_void_p:
    """The data pointer of a CPU tensor whose rows are dense (its row stride may be larger)."""
    assert tensor.device.type == "cpu" and tensor.stride(-1) == 1
    return ctypes.c_void_p(tensor.data_ptr())
