"""glibc's malloc in a CPU scheduler process keeps what it frees: no mmap below 32 MiB, no
trim of the heap's top below 1 GiB.

With glibc's own (dynamic) thresholds a decode step's large temporaries (the logits, each
request's gathered K/V per layer) may be mapped, faulted in page by page and handed back
every step, as often as the process's heap layout makes it: over one batch of 16 streamed
requests a speculative server took 279,000 page faults and plain decoding 134,000, over the
batch before 7,200 and 4,400; with these thresholds 10,600 and 5,000 (docs/results.md).
The next step reuses what a step frees; the process holds its peak heap instead of
returning it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

logger = logging.getLogger(__name__)

# mallopt's parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_BELOW_BYTES = 32 << 20  # glibc's own ceiling for its dynamic mmap threshold
TRIM_ABOVE_BYTES = 1 << 30  # mallopt takes an int


def keep_freed_memory() -> bool:
    """Set this process's malloc thresholds; False where the C library has no `mallopt`
    (not glibc) or refuses them."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    done = mallopt(M_MMAP_THRESHOLD, MMAP_BELOW_BYTES) == 1
    done = mallopt(M_TRIM_THRESHOLD, TRIM_ABOVE_BYTES) == 1 and done
    if not done:
        logger.warning("nanospec: mallopt refused; the scheduler keeps glibc's malloc thresholds")
    return done
