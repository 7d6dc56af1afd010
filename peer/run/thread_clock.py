"""How a stretch of work spent its wall time: its thread's own CPU, and its wait for a core.

An owner's slice reduce is a few milliseconds of CPU; on a machine whose cores are all busy (an
overlapped round beside training, several peers on one machine) it can take ten times that in wall
time. Whether the difference is the work itself or the wait for a core is what this tells, from
the thread's own counters: `time.thread_time()` for its CPU, and on Linux the run-queue delay the
kernel keeps per thread (/proc/thread-self/schedstat: time runnable but not running). Elsewhere the
wait is None (not 0: unknown is not "none").

The peers record it for their owned slices' reduces in each round's record ("slices" -> "reduce"),
and scripts/wan_emulation.py reports it beside the exchange's timeline (benchmarks/wan.md).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

T = TypeVar("T")
SCHEDSTAT = "/proc/thread-self/schedstat"


def core_wait_s() -> float | None:
    """This thread's total time runnable but waiting for a core (s), or None where the OS does not say."""
    try:
        stat = getattr(_SCHEDSTAT, "file", None)
        if stat is None or stat.path != SCHEDSTAT:
            stat = _SCHEDSTAT.file = _ThreadStat(SCHEDSTAT)
        return int(os.pread(stat.fd, 128, 0).split()[1]) / 1e9  # "<on-cpu ns> <run-queue ns> <timeslices>"
    except (OSError, IndexError, ValueError):
        return None


class _ThreadStat:
    """This thread's schedstat, opened once: /proc/thread-self names the thread that opens it, and
    re-reading an open file is ~8x cheaper than opening it per read (two reads per slice reduce).
    Closed with the thread (its threading.local goes, and this with it)."""

    __slots__ = ("path", "fd")

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)  # first: where it fails, there is nothing to close
        self.path = path

    def __del__(self) -> None:
        fd = getattr(self, "fd", None)
        if fd is not None:
            os.close(fd)


_SCHEDSTAT = threading.local()


@dataclass(slots=True)
class CoreTally:
    """Sums, over the calls it timed (from any threads), their wall time, their thread's CPU and
    their wait for a core. Thread-safe; `take()` reads and resets."""

    calls: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    core_wait_s: float | None = 0.0  # None once any call could not read it
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """fn(*args, **kwargs) on this thread, its times added to the tally (also when it raises)."""
        wall, cpu, waited = time.monotonic(), time.thread_time(), core_wait_s()
        try:
            return fn(*args, **kwargs)
        finally:
            wall, cpu, after = time.monotonic() - wall, time.thread_time() - cpu, core_wait_s()
            with self._lock:
                self.calls += 1
                self.wall_s += wall
                self.cpu_s += cpu
                self.core_wait_s = None if self.core_wait_s is None or waited is None or after is None \
                    else self.core_wait_s + (after - waited)

    def take(self) -> dict[str, Any]:
        """{"calls", "wall_s", "cpu_s", "core_wait_s"} so far, and start again from zero."""
        with self._lock:
            out = {"calls": self.calls, "wall_s": self.wall_s, "cpu_s": self.cpu_s, "core_wait_s": self.core_wait_s}
            self.calls, self.wall_s, self.cpu_s, self.core_wait_s = 0, 0.0, 0.0, 0.0
        return out
