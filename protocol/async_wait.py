"""Waiting for news on an event loop without a thread per waiter (the coordinator's long-polls).

The coordinator's state lives under a lock, and whatever changes it that a waiter may care about
(a round closes, results land, a round is applied) calls `notify_all` on one Condition of that
lock. Threads wait on that Condition as before; `Announcing` is that Condition, telling
listeners too, and `LoopNews` is one such listener: it wakes the coroutines of one event loop
(protocol/aio_server.py), each of which then checks its own `news()` predicate, a few dict and
attribute reads, and goes back to waiting, or answers. A waiting coroutine holds no thread and no
lock; a notification costs one `call_soon_threadsafe` however many wait.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Callable


class Announcing(threading.Condition):
    """A Condition whose notify_all also calls its listeners (under its lock, so they must be quick)."""

    def __init__(self, lock: threading.Lock | threading.RLock | None = None) -> None:
        super().__init__(lock)
        self._listeners: list[Callable[[], None]] = []

    def listen(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def notify_all(self) -> None:
        super().notify_all()
        for listener in self._listeners:
            listener()


class LoopNews:
    """Wakes the coroutines waiting in `until` on the event loop they wait on; `wake` may be
    called from any thread (an Announcing condition's listener).

    `lock`: the lock the notifier holds when it calls `wake` (the Condition's). A notifier may
    still be changing the state after its notify_all, within the same hold of the lock (a round
    opens, then its predecessor's hash is set), and the waiters read without the lock: so they
    are woken only once the lock is free again, by one pool thread that takes and releases it
    (one hop a notification, coalesced, whatever the number of waiters; the loop's default
    executor, protocol/aio_server.py). Without `lock` they are woken at once."""

    def __init__(self, lock: threading.Lock | threading.RLock | None = None) -> None:
        self._lock = lock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None
        self._hop = False  # a wake waits for the lock to be released
        self.waiting = 0  # coroutines in `until` now

    def wake(self) -> None:
        loop = self._loop
        if loop is None or not self.waiting or loop.is_closed():
            return
        if self._lock is not None:
            if self._hop:
                return  # the hop on its way takes the lock after this notifier lets it go
            self._hop = True
        try:
            loop.call_soon_threadsafe(self._bump if self._lock is None else self._after_lock)
        except RuntimeError:  # the loop closed meanwhile: nobody waits there any more
            self._hop = False

    def _after_lock(self) -> None:  # on the loop
        assert self._loop is not None and self._lock is not None
        lock, loop = self._lock, self._loop

        def released() -> None:  # a pool thread
            self._hop = False  # before taking the lock: a notify from here on sends its own hop
            with lock:
                pass
            try:
                loop.call_soon_threadsafe(self._bump)
            except RuntimeError:
                pass

        try:
            loop.run_in_executor(None, released)
        except RuntimeError:  # the pool is shut down: the server is stopping
            self._hop = False

    def _bump(self) -> None:  # on the loop
        if self._event is not None:
            self._event.set()
            self._event = None

    async def until(self, news: Callable[[], bool], wait_s: float) -> bool:
        """Return True once `news()` holds, False when `wait_s` passed first. `news` runs on the
        loop without any lock: it must only read, and what it reads must only ever turn true."""
        loop = self._loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        self.waiting += 1
        try:
            while True:
                if self._event is None:
                    self._event = asyncio.Event()
                event = self._event  # taken before the check: a wake after it sets this one
                if news():
                    return True
                left = deadline - loop.time()
                if left <= 0:
                    return False
                try:
                    await asyncio.wait_for(event.wait(), left)
                except asyncio.TimeoutError:
                    return news()
        finally:
            self.waiting -= 1
