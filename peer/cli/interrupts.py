"""Ctrl+C and SIGTERM stop a process cleanly, and only the process they were meant for.

hivemind forks its DHT worker, which inherits our handlers; a signal sent to the whole process
group (Ctrl+C in a terminal, or our launcher stopping a child) must unwind the main process
(which then shuts the DHT down in order) and be ignored by the forked worker.
"""

from __future__ import annotations

import os
import signal
from typing import Callable

def install(on_signal: Callable[[], None] | None = None) -> None:
    """On SIGINT/SIGTERM: call `on_signal` if given, else raise KeyboardInterrupt, in this process only."""
    main_pid = os.getpid()

    def handler(signum, frame) -> None:
        if os.getpid() != main_pid:
            return  # a forked worker: its parent shuts it down
        if on_signal is not None:
            on_signal()
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
