"""An opt-in watch on the coordinator's state lock: who held it too long, and what it was doing.

    SWARMLOCO_LOCK_WATCH=1 swarmloco coordinator ...

Every RPC handler, the round clock and `status()` share one lock (peer/coordinator/state.py); a
thread that waits on the network while holding it stalls them all, heartbeats included, and the
peers it keeps waiting are counted as gone (issue 22's chaos run: status() answered every 6.0 s
for 19 s at a partition). With the variable set, the lock is a `WatchedLock` and a watchdog thread
prints the holder's stack to stderr once a hold passes `HELD_S` (and again every `HELD_S` it
lasts). A thread that holds the GIL in a C call stops the watchdog too: the watchdog also arms
faulthandler, whose own C thread dumps every thread's stack when the watchdog has not run for
`STARVED_S`. Unset, the lock is a plain RLock and nothing runs.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
import traceback
import weakref

ENV = "SWARMLOCO_LOCK_WATCH"
HELD_S = 1.0  # a hold longer than this prints the holder's stack
POLL_S = 0.2  # how often the watchdog looks
STARVED_S = 2.0  # the watchdog did not run for this long: faulthandler dumps every thread


class WatchedLock:
    """A reentrant lock that knows its holder and since when (its outermost acquire). It offers
    what threading.Condition uses of an RLock, so Conditions built on it wait and wake as before."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.RLock()
        self.holder: int | None = None  # thread ident
        self.since = 0.0  # monotonic
        self._depth = 0
        self.watchdog: threading.Thread | None = None

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = self._lock.acquire(blocking, timeout)
        if got:
            self._depth += 1
            if self._depth == 1:
                self.holder, self.since = threading.get_ident(), time.monotonic()
        return got

    def release(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.holder = None
        self._lock.release()

    __enter__ = acquire

    def __exit__(self, *exc) -> None:
        self.release()

    # threading.Condition's hooks: a wait releases every level of the lock and takes them back
    def _is_owned(self) -> bool:
        return self._lock._is_owned()  # type: ignore[attr-defined]

    def _release_save(self):
        depth, self._depth, self.holder = self._depth, 0, None
        return depth, self._lock._release_save()  # type: ignore[attr-defined]

    def _acquire_restore(self, saved) -> None:
        depth, inner = saved
        self._lock._acquire_restore(inner)  # type: ignore[attr-defined]
        self._depth, self.holder, self.since = depth, threading.get_ident(), time.monotonic()


def _watch(ref: weakref.ref) -> None:
    """The watchdog: runs until the lock is gone (a coordinator's lives as long as its process)."""
    reported = (None, 0.0, 0.0)  # (holder, since, held_s when last printed)
    last = time.monotonic()
    while (lock := ref()) is not None:
        # faulthandler writes to a file descriptor: the process's real stderr
        faulthandler.dump_traceback_later(STARVED_S, repeat=False, file=sys.__stderr__, exit=False)
        holder, since = lock.holder, lock.since
        del lock  # not kept alive by the sleep below
        time.sleep(POLL_S)
        now = time.monotonic()
        if now - last > STARVED_S + POLL_S:
            print(f"{ENV}: the watchdog did not run for {now - last:.1f} s (the GIL held, or the process stopped)",
                  file=sys.stderr, flush=True)
        last = now
        if holder is None:
            continue
        held_s = now - since
        if held_s < HELD_S or (reported[:2] == (holder, since) and held_s - reported[2] < HELD_S):
            continue
        frame = sys._current_frames().get(holder)
        if frame is None or (lock := ref()) is None or (lock.holder, lock.since) != (holder, since):
            continue  # released meanwhile
        reported = (holder, since, held_s)
        name = next((t.name for t in threading.enumerate() if t.ident == holder), str(holder))
        print(f"{ENV}: {lock.name} held {held_s:.1f} s by thread {name}:\n{''.join(traceback.format_stack(frame))}",
              file=sys.stderr, flush=True)
        del lock
    faulthandler.cancel_dump_traceback_later()


def coordinator_lock(name: str = "the coordinator's lock") -> threading.RLock | WatchedLock:
    """A plain RLock, or with SWARMLOCO_LOCK_WATCH=1 a WatchedLock and its watchdog thread."""
    if os.environ.get(ENV, "") in ("", "0"):
        return threading.RLock()
    lock = WatchedLock(name)
    lock.watchdog = threading.Thread(target=_watch, args=(weakref.ref(lock),), name="swarmloco-lock-watch", daemon=True)
    lock.watchdog.start()  # it ends (and disarms faulthandler) once the lock is gone
    return lock
