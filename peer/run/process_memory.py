"""Large tensors reuse freed memory instead of fresh pages from the kernel (issue 24).

glibc serves an allocation over its mmap threshold (at most 32 MB while the threshold adapts by
itself) with a fresh mmap and unmaps it on free, so every (d,) float32 temporary of a 10M-value
update (40 MB) is 9,766 new pages that the kernel faults in and zeroes: measured on this machine,
`x.half().float()` on 10M values took 23.6 ms with 11,231 minor faults, and 9.0 ms with 1,953 once
the threshold was raised. A round makes dozens of such temporaries (encode with error feedback,
decode, the outer step), so a peer does this once it is set up. Freed memory then stays with
the process instead of going back to the kernel: the peak resident size is what it was, it is
just not given back and faulted in again.

`one_arena`: every thread allocates from the main arena (M_ARENA_MAX = 1). By default glibc gives
each new thread an arena of its own, which grows from fresh pages the first time that thread makes
large temporaries; several threads doing so at once contend in the kernel for the process's memory
map. Measured in an 8-peer overlapped run on 2 cores: the first round whose rows carry work weights
(new temporaries on the slice threads) cost 80-130 ms of CPU per slice reduce (its torch ops 20-60x
their usual CPU) where the same reduce costs 3-6 ms; a 1.6-4.8 s reduce phase where the others take
0.1-0.9 s. With one arena they reuse what the process freed before (0.23 s; benchmarks/wan.md,
session 19). glibc fixes its arena limit the first time a second thread allocates, so the peer
process calls it first thing (peer/cli/main.py cmd_peer); called later, it changes nothing.
Nothing else changes: the same values, the same bits. Not glibc (musl, macOS): a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("swarmloco.memory")

MMAP_THRESHOLD = 1 << 30  # allocations below 1 GiB come from the heap, freed memory reused
TRIM_THRESHOLD = (1 << 31) - 1  # free memory at the top of the heap kept (mallopt's largest; 1 GiB measured 8x the faults)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8  # glibc's mallopt parameters


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process; True when glibc took both."""
    mallopt = _mallopt()
    took = mallopt is not None and mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    if not took:
        log.debug("mallopt refused the thresholds: large temporaries keep coming from mmap")
    return took


def one_arena() -> bool:
    """Every thread of this process allocates from glibc's main arena (before its second thread
    allocates: see the module's docstring); True when glibc took it."""
    mallopt = _mallopt()
    return mallopt is not None and mallopt(_M_ARENA_MAX, 1) == 1


def _mallopt():
    """glibc's mallopt, or None where there is none."""
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt
