"""A test hook: a peer of a known speed in a compute-window run, with no timing in what it trains.

    SWARMLOCO_STEP_S=0.2 swarmloco peer ...

makes this peer count each inner step as 0.2 s of its compute window (rounds.window_s), whatever
the step really took: its phase takes exactly the steps a machine of that speed fits in the window
(peer/run/window_share.window_steps: ceil(window_s / 0.2), within rounds.min_steps and
rounds.max_steps, as preflight computes them) and, when those ran sooner, it waits for the
window's real close before it commits, as that machine would still be computing. So a
real-process test runs a throttled peer (a larger SECONDS) beside full-speed ones and asserts
exact step counts and weights (tests/test_window_swarm.py). Where the steps really take longer
than SECONDS each, the phase lasts longer than the window (the count stays exact; the round waits).
A CPU quota makes a real slow machine (scripts/bench_heterogeneous.py's cgroups), but its step
counts depend on the load.

Unset (the default) nothing changes; with the window off (rounds.window_s = 0) it does nothing.
Read once; `check_environment()` at the node's start turns a bad value into a ValueError there.
"""

from __future__ import annotations

import math
import os
import time

from peer.run.config_sections import RoundConfig
from peer.run.window_share import window_steps

ENV = "SWARMLOCO_STEP_S"
_UNREAD = object()
_step_s: float | None | object = _UNREAD


def parse_step_s(text: str) -> float | None:
    """'' -> None (unset); '0.2' -> 0.2; anything but a positive finite number is a ValueError."""
    if not text.strip():
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{ENV}={text!r}: give the seconds one inner step counts for in the compute window, "
                         f"a number > 0 (e.g. {ENV}=0.2), or leave it unset")
    return value


def check_environment() -> float | None:
    """This process's SWARMLOCO_STEP_S, read and checked once (None when unset)."""
    global _step_s
    if _step_s is _UNREAD:
        _step_s = parse_step_s(os.environ.get(ENV, ""))
    return _step_s  # type: ignore[return-value]


def paced_steps(rounds: RoundConfig) -> int | None:
    """The steps this peer's window holds under SWARMLOCO_STEP_S, or None: unset, or no window."""
    step_s = check_environment()
    if step_s is None or not rounds.window_s:
        return None
    return window_steps(window_s=rounds.window_s, step_s=step_s, min_steps=rounds.min_steps, max_steps=rounds.max_steps)


def wait_for_close(closes: float) -> None:
    """Sleep until time.monotonic() >= closes (the window's real close)."""
    while (left := closes - time.monotonic()) > 0:
        time.sleep(left)
