"""Ctrl+C and SIGTERM stop a process cleanly, and only the process they were meant for.

The first SIGINT or SIGTERM asks the process to stop: `on_signal` is called (the coordinator sets
its stop event and shuts down in order: gRPC server, then DHT) or KeyboardInterrupt is raised (a
peer unwinds through its `finally`). A second one while that shutdown runs ends the process at
once (os._exit): its forked DHT process and p2pd die with it (protocol/lifetime.py), so nothing is
left running either way. The exit status after a signal is 128 + its number, the shell's
convention: 130 after Ctrl+C, 143 after SIGTERM (`exit_status`).

hivemind forks its DHT worker, which inherits these handlers; it runs in a process group of its
own and resets them as it starts (protocol/lifetime.py, `detach_from_group_signals`), so a signal
to the whole group (Ctrl+C in a terminal, our launcher stopping a child) reaches the main process
only. The pid check below keeps any other forked child from acting on its parent's behalf.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
from typing import Callable

_received: list[int] = []  # the signals this process got, in order


def install(on_signal: Callable[[], None] | None = None) -> None:
    """On SIGINT/SIGTERM: call `on_signal` if given, else raise KeyboardInterrupt, in this process
    only; on a second one, exit at once with `exit_status()`."""
    main_pid = os.getpid()

    def handler(signum, frame) -> None:
        if os.getpid() != main_pid:
            return  # a forked worker: its parent shuts it down
        _received.append(signum)
        if len(_received) > 1:
            os.write(2, f"\n{signal.Signals(signum).name} again: exiting now\n".encode())
            os._exit(exit_status())
        if on_signal is not None:
            on_signal()
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def received() -> int | None:
    """The first stop signal this process got since `install`, None if none."""
    return _received[0] if _received else None


def exit_status(default: int = 0) -> int:
    """128 + the first stop signal's number (130 Ctrl+C, 143 SIGTERM); `default` when there was none."""
    return 128 + _received[0] if _received else default


_exit_code: list[int] = []  # what main() returned, once it did


def skip_finalization() -> None:
    """Once main() has returned and the exit handlers have run (threads joined, the DHT process and
    logs closed: everything the process owns is stopped), end the process at once instead of
    finalizing the interpreter: tearing down torch's and gRPC's modules took 2 s at load 10 on 2
    cores (measured: `python -c "import torch"` alone), over 10 s at the loads this machine sees,
    most of a Ctrl+C's exit. Registered before the heavy imports, so it runs after their own exit
    handlers (atexit runs last-registered first); a process whose main() did not return (an
    uncaught exception) finalizes as usual."""
    main_pid = os.getpid()

    def end() -> None:
        if os.getpid() != main_pid or not _exit_code:
            return
        logging.shutdown()  # registered before us, so it would run after us: flush the logs now
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(_exit_code[0])

    atexit.register(end)


def returning(code: int) -> int:
    """main()'s exit code, kept for skip_finalization's os._exit."""
    _exit_code[:] = [code]
    return code
