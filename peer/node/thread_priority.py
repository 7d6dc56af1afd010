"""The training thread's CPU priority in overlapped rounds (`swarmloco peer --train-priority`).

An overlapped round's exchange (decode, reduce, serving and reading gRPC streams) runs on other
threads of the same process while the next inner phase trains; on a machine whose cores are all
busy, each of its CPU steps waits behind training, and the average lands later
(benchmarks/wan.md). Lowering only the training thread lets the exchange's short bursts run
first; training takes what is left, so its steps slow down only while the exchange needs the CPU.

- "auto" (the default): "low" where the OS has per-thread priorities (Linux), else "normal".
- "low": the training thread's nice value + 5 (Linux per-thread nice).
- "normal": unchanged.

Why low by default (session 19, benchmarks/wan.md, on the coordinator's phase window): at 8 peers
on 2 cores the average landed 0.24-0.28 of the phase's steps in (0.28-0.32 of H) against
0.29-0.31 (0.36-0.40 of H) at normal priority, with the same utilization (95.7-96.2% against
95.7-96.7%); at 4 peers 0.24-0.27 against 0.29-0.31, the same utilization. A GPU peer's training
thread mostly waits on the GPU, so it loses nothing there either; and a volunteer's training
yields to the rest of the machine a little more, which is what a volunteer wants of it.

(SCHED_IDLE was considered as a fourth mode and left out, not measured: beside other busy
processes, as on the shared benchmark machine, it would leave training almost no CPU.)

Lowering needs no privilege; raising it back would, so it is done once, for the rest of the run,
right after the first exchange started (that worker thread keeps the normal priority; threads the
training thread starts later inherit the lower one). Only Linux has per-thread priorities: elsewhere
"low" is refused at start with what to do, and "auto" is "normal".
"""

from __future__ import annotations

import os
import sys
import threading

MODES = ("auto", "normal", "low")
LOW_NICE_STEP = 5


def check_mode(mode: str) -> None:
    """A ValueError saying what to pass where the mode is unknown or this OS cannot apply it."""
    if mode not in MODES:
        raise ValueError(f"--train-priority {mode!r}: use one of {', '.join(MODES)}")
    if mode == "low" and not _per_thread_priorities():
        raise ValueError(f"--train-priority {mode}: per-thread priorities need Linux; use --train-priority normal (or auto) here")


def resolve(mode: str) -> str:
    """The mode that applies here: "auto" is "low" where per-thread priorities exist, else "normal"."""
    if mode == "auto":
        return "low" if _per_thread_priorities() else "normal"
    return mode


def _per_thread_priorities() -> bool:
    return sys.platform.startswith("linux")


def lower_this_thread(mode: str) -> None:
    """Lower the calling thread's CPU priority as `mode` says (no-op for "normal")."""
    if resolve(mode) == "low":
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + LOW_NICE_STEP))
