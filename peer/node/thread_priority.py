"""The training thread's CPU priority in overlapped rounds (`swarmloco peer --train-priority`).

An overlapped round's exchange (decode, reduce, serving and reading gRPC streams) runs on other
threads of the same process while the next inner phase trains; on a machine whose cores are all
busy, each of its CPU steps waits behind training, and the average lands later
(benchmarks/wan.md). Lowering only the training thread lets the exchange's short bursts run
first; training takes what is left, so its steps slow down only while the exchange needs the CPU.

- "normal" (the default): unchanged.
- "low": the training thread's nice value + 5 (Linux per-thread nice).

(SCHED_IDLE was considered as a third mode and left out, not measured: beside other busy
processes, as on the shared benchmark machine, it would leave training almost no CPU.)

Lowering needs no privilege; raising it back would, so it is done once, for the rest of the run,
right after the first exchange started (that worker thread keeps the normal priority; threads the
training thread starts later inherit the lower one). Only Linux has per-thread priorities: elsewhere
a mode other than "normal" is refused at start with what to do.
"""

from __future__ import annotations

import os
import sys
import threading

MODES = ("normal", "low")
LOW_NICE_STEP = 5


def check_mode(mode: str) -> None:
    """A ValueError saying what to pass where the mode is unknown or this OS cannot apply it."""
    if mode not in MODES:
        raise ValueError(f"--train-priority {mode!r}: use one of {', '.join(MODES)}")
    if mode != "normal" and not sys.platform.startswith("linux"):
        raise ValueError(f"--train-priority {mode}: per-thread priorities need Linux; use --train-priority normal here")


def lower_this_thread(mode: str) -> None:
    """Lower the calling thread's CPU priority as `mode` says (no-op for "normal")."""
    if mode == "low":
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + LOW_NICE_STEP))
