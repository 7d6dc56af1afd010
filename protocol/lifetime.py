"""Every process this project forks dies with its parent, whatever kills the parent.

A parent killed by SIGKILL or the OOM killer runs no cleanup, so its children have to notice on
their own. Before this module, a SIGKILLed coordinator left its hivemind DHT process and that
process's p2pd daemon running, orphaned, still listening on the DHT port.

Two mechanisms, the first where it can be used, the second always:
- Linux: prctl(PR_SET_PDEATHSIG) in the child, set between fork and exec (`preexec_for_child`) or
  first thing in a forked Python child (`bind_forked_process`): the kernel signals the child as
  soon as its parent is gone. The signal is inherited across exec, so it also covers a child that
  is another program (p2pd). Linux sends it when the *thread* that forked the child ends, not the
  process, so it is set only when the fork happens on the main thread (which lives as long as the
  process); a child forked from another thread relies on the watchdog below.
- Everywhere: a forked Python child runs a daemon thread that polls os.getppid() and, once the
  parent is gone, kills the subprocesses the child started and exits (`die_with_parent`). This is
  the fallback where PR_SET_PDEATHSIG cannot be set (macOS, a non-main thread).

The chain: coordinator or peer -> hivemind DHT process (forked: `bind_forked_process`, hooked in
protocol/discovery.py's `start_dht`) -> p2pd (started by the DHT process with asyncio:
`adopt_asyncio_subprocesses` gives it a parent-death signal). `swarmloco demo` and the tests'
launcher (peer/cli/launcher.py) start the coordinator and peers with `preexec_for_child`.

The DHT process gets SIGKILL, p2pd SIGTERM (the signal hivemind itself stops it with, so it
removes its socket files).

Signals meant for the process group (Ctrl+C in a terminal, `kill -TERM -PGID`, the launcher's
stop) reach the CLI process only: the DHT process moves to a process group of its own as it
starts (`bind_forked_process`), and p2pd, which it starts, is in that group too. The CLI process
stops them in order (protocol/discovery.py, `stop_dht`). Before, the group's SIGINT also reached
p2pd, which exited at once; the DHT process's graceful shutdown then waited forever on the dead
daemon's control socket, hivemind's fallback `terminate()` (SIGTERM) was swallowed by the CLI's
handler the DHT process had inherited through fork, and the CLI process hung at exit in
multiprocessing's join of its DHT child. So the DHT process also gets SIGTERM's default action
back (its parent's `terminate()` ends it) and ignores SIGINT (as hivemind does once it runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import sys
import threading
import time
from multiprocessing.process import BaseProcess
from typing import Any, Callable

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
WATCH_INTERVAL_S = 0.5  # how often the watchdog looks at os.getppid()

_prctl: Callable[..., int] | None = None
_children: list[Any] = []  # asyncio Process objects this process started (the watchdog kills them)


def _load_prctl() -> Callable[..., int] | None:
    """libc's prctl, loaded once before any fork (a child between fork and exec must not load
    libraries); None where there is none (not Linux)."""
    global _prctl
    if _prctl is None and sys.platform.startswith("linux"):
        try:
            _prctl = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):
            return None
    return _prctl


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def set_parent_death_signal(sig: int) -> bool:
    """Ask the kernel to send `sig` to this process when its parent ends; False where it cannot."""
    prctl = _load_prctl()
    return prctl is not None and prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0


def preexec_for_child(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A `preexec_fn` for subprocess.Popen / asyncio.create_subprocess_exec that makes the child
    receive `sig` when this process ends. None where it cannot apply (not Linux, or called off
    the main thread: the signal would fire when the calling thread ends)."""
    prctl = _load_prctl()
    if prctl is None or not _on_main_thread():
        return None
    parent = os.getpid()

    def tie_to_parent() -> None:  # runs in the child between fork and exec: nothing but syscalls
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)

    return tie_to_parent


def die_with_parent(parent_pid: int, sig: int | None = signal.SIGKILL) -> None:
    """Called first thing in a forked child: arm the parent-death signal (when `sig` is given) and
    start the watchdog thread; exit at once when the parent is already gone."""
    if sig is not None:
        set_parent_death_signal(sig)
    if os.getppid() != parent_pid:
        os._exit(1)
    threading.Thread(target=_watch, args=(parent_pid,), name="swarmloco-parent-watchdog", daemon=True).start()


def _watch(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(WATCH_INTERVAL_S)
    for child in list(_children):
        if child.returncode is None:
            try:
                os.kill(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    os._exit(1)


def adopt_asyncio_subprocesses(sig: int = signal.SIGTERM) -> None:
    """Make every asyncio subprocess this process starts from now on (hivemind's p2pd) receive
    `sig` when this process ends, and let the watchdog kill it. Call in a child process of ours
    that runs third-party code (the DHT process), never in the CLI process itself."""
    original = asyncio.subprocess.create_subprocess_exec
    if getattr(original, "_swarmloco_adopting", False):
        return

    async def create_subprocess_exec(program: Any, *args: Any, **kwargs: Any) -> asyncio.subprocess.Process:
        if kwargs.get("preexec_fn") is None:
            kwargs["preexec_fn"] = preexec_for_child(sig)
        process = await original(program, *args, **kwargs)
        _children.append(process)
        return process

    create_subprocess_exec._swarmloco_adopting = True  # type: ignore[attr-defined]
    asyncio.subprocess.create_subprocess_exec = create_subprocess_exec  # type: ignore[assignment]
    asyncio.create_subprocess_exec = create_subprocess_exec  # type: ignore[assignment]


def detach_from_group_signals() -> None:
    """First thing in a forked child that its parent stops (the DHT process): a process group of its
    own, so the group's Ctrl+C or SIGTERM reaches the parent only; SIGINT ignored and SIGTERM back to
    its default (the fork copied the parent's Python handlers), so the parent's terminate() ends it."""
    try:
        os.setpgid(0, 0)
    except OSError:  # not permitted (a session leader cannot move): signals to the group still reach it
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def bind_forked_process(process: BaseProcess, sig: int = signal.SIGKILL) -> None:
    """Before `process.start()` (a fork-context multiprocessing process): the child ties itself to
    the process that starts it (`die_with_parent`) and the asyncio subprocesses it starts to
    itself (`adopt_asyncio_subprocesses`) before its own `run` begins. Start it on the thread
    this is called on."""
    parent = os.getpid()
    pdeathsig = sig if _on_main_thread() and _load_prctl() is not None else None
    run = process.run

    def bound_run() -> None:
        detach_from_group_signals()
        die_with_parent(parent, pdeathsig)
        adopt_asyncio_subprocesses()
        run()

    process.run = bound_run  # type: ignore[method-assign]


@contextlib.contextmanager
def timed_step(log: logging.Logger, what: str):
    """A shutdown step, logged with how long it took (`-v` shows which step a slow exit spent its time in)."""
    started = time.monotonic()
    try:
        yield
    finally:
        log.info("shutdown: %s took %.2fs", what, time.monotonic() - started)
