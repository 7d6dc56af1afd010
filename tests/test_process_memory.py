"""peer/run/process_memory.py: glibc takes the raised thresholds, and a large temporary then
reuses freed memory instead of faulting in fresh pages (what it is for, counted in minor faults)."""

from __future__ import annotations

import platform
import resource
import subprocess
import sys

import pytest

PROBE = """
import resource, sys, torch
from peer.run.process_memory import keep_freed_memory
torch.set_num_threads(1)
took = keep_freed_memory() if sys.argv[1] == "on" else None
x = torch.randn(10_000_000)  # 40 MB: over glibc's default mmap threshold, which adapts only up to 32 MB
per = []
for _ in range(12):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x.half().float()
    per.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(took, min(per))
"""


@pytest.mark.skipif(platform.system() != "Linux" or not platform.libc_ver()[0] == "glibc", reason="glibc's mallopt")
def test_large_temporaries_reuse_freed_memory():
    def faults(mode: str) -> tuple[str, int]:
        out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=120, check=True)
        took, count = out.stdout.split()
        return took, int(count)

    took, kept = faults("on")
    _, default = faults("off")
    assert took == "True"
    # The fewest faults of one x.half().float() in 12: by default never under the 40 MB result's
    # 9,766 fresh pages (14,600 with the 20 MB half); with the thresholds raised the heap settles
    # within a few (where the freed blocks sit varies: the mean of the first 5 was 0-8,800 pages)
    # and then faults in nothing.
    assert default >= 9000
    assert kept < 1000
