"""SIGTERM and Ctrl-C unwind a measurement script like an exception, so its `finally` blocks run:
the swarm it started is stopped and the cgroups it made are removed. Without this, SIGTERM's default
action ends the process on the spot and leaves both behind (a SIGTERMed bench_heterogeneous left
its /sys/fs/cgroup/cpu/swlH* groups)."""

from __future__ import annotations

import signal
import sys


def unwind_on_stop_signals() -> None:
    """SIGTERM exits with 143 through the finally blocks; SIGINT raises KeyboardInterrupt, also
    where a shell started the script with SIGINT ignored. Call from the main thread."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)
