"""How soon a thread that waits for the interpreter lock gets it (`sys.setswitchinterval`).

CPython lets a thread that wants the lock wait out the switch interval (5 ms by default) before it
asks the holder to let go. A peer's overlapped round is many short bursts on its exchange threads
(a stream's next slice to prove and keep, a slice's inputs complete and reduced, an RPC's answer
read) while the training thread runs Python between its torch ops; a burst that finds the lock
held waits up to the interval, and the burst after it again. Lowering the training thread's CPU
priority (peer/node/thread_priority.py) does not help there: the lock is the process's, not the
core's. A coordinator's RPC handlers wait the same way behind its own background work (fetching
and checking the aggregate, writing checkpoints).

The CLI process sets it (peer/cli/main.py, before its verb runs: `swarmloco peer`, `coordinator`, the
demo's forked processes, the WAN bench's), not a test that calls main() in its own process. Swarm
processes use 0.5 ms: a thread that computes for long stretches hands the lock over ten
times as often (a few microseconds each), and one that waits for it gets it within half a
millisecond. What it bought on the emulated WAN (benchmarks/wan.md, session 29; 8 peers overlapped,
the default configuration, runs alternating with the build before it): fetch in 1.39 / 1.30 / 1.31
/ 1.50 / 1.27x the bound against 1.37 / 1.37 / 1.33 / 1.33 / 1.36x, and in a first try with the
interval set in every process of the testbed 1.40 / 1.29 / 1.37 / 1.25 / 1.34x against 1.40 / 1.35
/ 1.46x: medians 1.33x against 1.37x over ten and eight runs, no difference beyond the testbed's
spread. It stays because it costs nothing measurable (utilization 96.2-97.1% either way) and the
wait it removes is real wherever a peer's cores are not the bottleneck. The same values, the same bits.
"""

from __future__ import annotations

import sys

SWITCH_INTERVAL_S = 0.0005


def quicken_handoffs() -> None:
    """This process's threads hand the interpreter lock over within SWITCH_INTERVAL_S."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)
