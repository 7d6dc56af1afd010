"""What a measured local swarm costs the machine: its memory (with a floor that stops it) and the
coordinator's CPU per round, both read from /proc while the swarm runs (Linux).

Used by scripts/measure_scale.py's run_swarm (storm rows) and scripts/scale_lab.py (lab rows).
"""

from __future__ import annotations

import os
import re
import threading
import time

CLOSED_RE = re.compile(r"^coordinator \| round (\d+)/\d+ closed")  # peer/run/progress.coordinator_line
TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def mem_available_gib() -> float:
    """MemAvailable from /proc/meminfo (Linux), in GiB."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    raise RuntimeError("/proc/meminfo has no MemAvailable line")


class MemoryGuard(threading.Thread):
    """Watches the machine's available memory while a swarm runs; below `floor_gib` it stops the
    swarm (every child, at once) instead of letting the kernel's OOM killer pick a process of
    whoever shares the machine. `needed_gib` is how far MemAvailable fell from where it was at the
    start: what the swarm took, give or take the other jobs' own swings."""

    def __init__(self, swarm, floor_gib: float) -> None:
        super().__init__(daemon=True, name="memory-guard")
        self.swarm, self.floor_gib = swarm, floor_gib
        self.start_gib = self.lowest_gib = mem_available_gib()
        self.tripped_at: float | None = None
        self.done = threading.Event()
        self._began = time.monotonic()

    def run(self) -> None:
        while not self.done.wait(0.5):
            self.lowest_gib = min(self.lowest_gib, mem_available_gib())
            if self.lowest_gib < self.floor_gib and self.tripped_at is None:
                self.tripped_at = time.monotonic() - self._began
                self.swarm.stop_all(grace_s=0.0)

    @property
    def needed_gib(self) -> float:
        return self.start_gib - self.lowest_gib


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, user + system CPU seconds) of a live process, from /proc/PID/stat."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS_PER_S  # ppid; utime, stime


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(the process's own CPU seconds, with every live descendant's): the coordinator alone, and
    with its forked DHT process and p2pd (they run in process groups of their own: found by ppid)."""
    own = _stat(pid)
    if own is None:
        return float("nan"), float("nan")
    parents: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None:
            parents[int(entry)] = stat
    tree, total, grew = {pid}, own[1], True
    while grew:  # descendants: any process whose parent is in the tree
        grew = False
        for child, (ppid, cpu) in parents.items():
            if ppid in tree and child not in tree:
                tree.add(child)
                total += cpu
                grew = True
    return own[1], total


class CoordinatorCpu(threading.Thread):
    """Reads the coordinator's CPU time each time it prints a round's close: per round r, the CPU
    seconds it spent since the previous close (round 0: since it started, joins included), alone
    and with its DHT process and p2pd. A watcher of its printed lines (the launcher's Child.lines),
    polling every `poll_s`: a close is seen within that, while a round lasts seconds."""

    def __init__(self, child, poll_s: float = 0.05) -> None:
        super().__init__(daemon=True, name="coordinator-cpu")
        self.child, self.poll_s = child, poll_s
        self.done = threading.Event()
        self.closes: list[dict] = []  # {round, at_s, cpu_s, tree_cpu_s}: cumulative at each close
        self._began = time.monotonic()

    def run(self) -> None:
        seen = 0
        while not self.done.wait(self.poll_s):
            lines = self.child.lines
            for line in lines[seen:len(lines)]:
                if (m := CLOSED_RE.match(line)) is not None:
                    own, tree = cpu_seconds(self.child.process.pid)
                    self.closes.append({"round": int(m.group(1)) - 1, "at_s": time.monotonic() - self._began,
                                        "cpu_s": own, "tree_cpu_s": tree})
            seen = len(lines)

    def per_round(self) -> list[dict]:
        """{round, cpu_s, tree_cpu_s, wall_s}: what each round cost, from consecutive closes."""
        out, before = [], {"at_s": 0.0, "cpu_s": 0.0, "tree_cpu_s": 0.0}
        for close in self.closes:
            out.append({"round": close["round"], **{k: close[k] - before[k] for k in ("cpu_s", "tree_cpu_s")},
                        "wall_s": close["at_s"] - before["at_s"]})
            before = close
        return out
