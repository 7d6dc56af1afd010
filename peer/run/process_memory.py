"""Large tensors reuse freed memory instead of fresh pages from the kernel (issue 24).

glibc serves an allocation over its mmap threshold (at most 32 MB while the threshold adapts by
itself) with a fresh mmap and unmaps it on free, so every (d,) float32 temporary of a 10M-value
update (40 MB) is 9,766 new pages that the kernel faults in and zeroes: measured on this machine,
`x.half().float()` on 10M values took 23.6 ms with 11,231 minor faults, and 9.0 ms with 1,953 once
the threshold was raised. A round makes dozens of such temporaries (encode with error feedback,
decode, the outer step), so a peer does this once it is set up. Freed memory then stays with
the process instead of going back to the kernel: the peak resident size is what it was, it is
just not given back and faulted in again.
Nothing else changes: the same values, the same bits. Not glibc (musl, macOS): a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("swarmloco.memory")

MMAP_THRESHOLD = 1 << 30  # allocations below 1 GiB come from the heap, freed memory reused
TRIM_THRESHOLD = (1 << 31) - 1  # free memory at the top of the heap kept (mallopt's largest; 1 GiB measured 8x the faults)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process; True when glibc took both."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    took = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    if not took:
        log.debug("mallopt refused the thresholds: large temporaries keep coming from mmap")
    return took
