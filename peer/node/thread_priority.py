"""The training thread's CPU priority in overlapped rounds (`swarmloco peer --train-priority`).

An overlapped round's exchange (decode, reduce, serving and reading gRPC streams) runs on other
threads of the same process while the next inner phase trains; on a machine whose cores are all
busy, each of its CPU steps waits behind training, and the average lands later
(benchmarks/wan.md). Lowering only the training thread lets the exchange's short bursts run
first; training takes what is left, so its steps slow down only while the exchange needs the CPU.

- "auto" (the default): "idle" where the OS has per-thread scheduling policies (Linux), else "normal".
- "idle": the training thread runs under SCHED_IDLE (Linux): it gets a core only when no thread of
  normal priority on the machine wants one, and a woken exchange thread takes its core at once.
- "low": the training thread's nice value + 5 (Linux per-thread nice).
- "normal": unchanged.

Why idle by default (session 25, benchmarks/wan.md, wan_s25_*): at 8 peers on 2 cores, overlapped,
the peers sharing the scheduling groups, five alternating pairs fetched in 1.34-1.50x the bound
(median 1.40x) under idle against 1.41-1.83x (median 1.62x) under low, utilization 96-100% either
way. A nice value only weighs the training thread's share of a core (nice + 5: a third of a normal
thread's, + 19 changed nothing measurable either, session 24); under SCHED_IDLE the scheduler also
treats a core running only idle threads as free, so an exchange thread that wakes (a slice arrived,
a stream wants its next write) runs there at once instead of waiting out the training thread's
time slice. Training loses nothing it would have had on a machine whose other threads wait on the
network most of the time; beside another busy program it yields almost entirely, as volunteer
computing's clients (BOINC, Folding@home) run their work by default. A GPU peer's training thread
mostly waits on the GPU; its kernel launches are delayed only while the exchange runs on every
core. `--train-priority low` (session 19's default) keeps training a share beside other programs.

Lowering needs no privilege; raising it back would (leaving SCHED_IDLE needs CAP_SYS_NICE or a
raised RLIMIT_NICE), so it is done once, for the rest of the run, right after the first exchange
started (that worker thread keeps the normal priority; threads the training thread starts later
inherit the lower one, so the node starts its own threads before: peer/node/node.py's state writer).
Only the Python training thread is lowered: with `--threads` above 1, torch's worker threads, started
at set-up, keep their priority (the benchmarks run one thread per peer). Where the OS refuses the
change (a sandbox), training keeps its priority and a warning says so. Only Linux has per-thread
priorities: elsewhere "low" and "idle" are refused at start with what to do, and "auto" is "normal".
"""

from __future__ import annotations

import logging
import os
import sys
import threading

log = logging.getLogger(__name__)

MODES = ("auto", "normal", "low", "idle")
LOW_NICE_STEP = 5


def check_mode(mode: str) -> None:
    """A ValueError saying what to pass where the mode is unknown or this OS cannot apply it."""
    if mode not in MODES:
        raise ValueError(f"--train-priority {mode!r}: use one of {', '.join(MODES)}")
    if mode in ("low", "idle") and not _per_thread_priorities():
        raise ValueError(f"--train-priority {mode}: per-thread priorities need Linux; use --train-priority normal (or auto) here")


def resolve(mode: str) -> str:
    """The mode that applies here: "auto" is "idle" where per-thread priorities exist, else "normal"."""
    if mode == "auto":
        return "idle" if _per_thread_priorities() else "normal"
    return mode


def _per_thread_priorities() -> bool:
    return sys.platform.startswith("linux")


def lower_this_thread(mode: str) -> None:
    """Lower the calling thread's CPU priority as `mode` says (no-op for "normal")."""
    resolved = resolve(mode)
    tid = threading.get_native_id()
    try:
        if resolved == "idle":
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        elif resolved == "low":
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + LOW_NICE_STEP))
    except OSError as exc:  # a sandbox that refuses the policy: training goes on at its priority, said once
        log.warning("--train-priority %s: could not lower the training thread (%s); it keeps its priority "
                    "(pass --train-priority normal to silence this)", mode, exc)
