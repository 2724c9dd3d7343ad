"""The scheduler's malloc thresholds: a block under 32 MiB comes from the heap, not a
mapping of its own, and freeing it does not hand the memory back to the system."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# Run in a fresh process: mallopt's thresholds are the process's for its life.
CHILD = """
import ctypes, ctypes.util, json, sys
from nanospec_server.sglang_plugin.cpu.heap import keep_freed_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
before = libc.mallinfo2()
block = libc.malloc(16 << 20)
held = libc.mallinfo2()
libc.free(block)
after = libc.mallinfo2()
print(json.dumps({"kept": kept, "mapped": held.hblkhd - before.hblkhd,
                  "heap_after_free": after.arena - before.arena}))
"""
BLOCK = 16 << 20


def allocate_in_child(mode: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_a_freed_block_stays_in_the_heap_where_glibc_would_map_it() -> None:
    glibc_own = allocate_in_child("default")
    assert glibc_own["mapped"] >= BLOCK  # glibc maps a fresh process's 16 MiB block itself
    kept = allocate_in_child("keep")
    assert kept["kept"] is True
    assert kept["mapped"] == 0
    assert kept["heap_after_free"] >= BLOCK  # not trimmed: the next step reuses it
