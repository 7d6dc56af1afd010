"""Client streams that receive nothing for too long are cut off, and their holder is not asked again
at once.

A holder whose link went down (issue 22's chaos partition, a netns link cut) or whose process froze
answers nothing: a FetchPayload stream to it waits for its deadline (TRANSFER_DEADLINE, 120 s) or
until the kernel gives up on the connection (gRPC's TCP_USER_TIMEOUT, the keepalive timeout: 10 s),
and the fallback that asks it again for each missing slice waits once more. Measured on loopback
through a netns link cut right after the author committed: the owners' fetch of its slices took
12.3 s (the chaos run: 12.3 s too), the round closed 14.5 s after it opened; a SIGSTOPped author on
loopback held the round past 40 s (the kernel still acknowledges its connection).

`STALLS.watch(call, holder, stall_s)` wraps a response stream: each message is progress; one daemon
thread cancels a call that had none for `stall_s`, and remembers its holder as stalled for that long
(`stalled(holder)`), so that the fallback goes to the other holders instead of waiting on it again.
The bound is on silence, not on the transfer: a slow link that keeps sending is never cut.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Iterator

POLL_S = 0.1  # how often the watcher looks


class Watched:
    """One watched stream: iterate `messages()` instead of the call."""

    def __init__(self, call: Any, holder: str, stall_s: float) -> None:
        self.call, self.holder, self.stall_s = call, holder, stall_s
        self.last = time.monotonic()
        self.stalled = False  # cut off by the watcher

    def messages(self) -> Iterator[Any]:
        for message in self.call:
            self.last = time.monotonic()
            yield message

    def why(self) -> str:
        return f"sent nothing for {self.stall_s:g} s: cut off (its link or process is down)"


class StallWatch:
    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._watched: set[Watched] = set()
        self._stalled: dict[str, float] = {}  # holder -> monotonic time until which it is not asked again
        self._thread: threading.Thread | None = None

    def watch(self, call: Any, holder: str, stall_s: float) -> Watched:
        watched = Watched(call, holder, stall_s)
        with self._lock:
            self._watched.add(watched)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="swarmloco-stall-watch", daemon=True)
                self._thread.start()
            self._lock.notify()
        return watched

    def done(self, watched: Watched) -> None:
        with self._lock:
            self._watched.discard(watched)

    def mark(self, holder: str, stall_s: float) -> None:
        """A stream from `holder` was cut off for silence elsewhere (a batched fetch on the fetch
        loop bounds each read itself: protocol/batched_fetch.py): not asked again for `stall_s`."""
        with self._lock:
            self._stall(holder, time.monotonic() + stall_s)

    def _stall(self, holder: str, until: float) -> None:  # under self._lock
        self._stalled[holder] = max(self._stalled.get(holder, 0.0), until)

    def stalled(self, holder: str) -> bool:
        """Whether a stream from `holder` was cut off for silence within its stall bound."""
        with self._lock:
            until = self._stalled.get(holder)
            if until is not None and until <= time.monotonic():
                del self._stalled[holder]
                return False
            return until is not None

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._watched:
                    self._lock.wait()
                now = time.monotonic()
                late = [w for w in self._watched if now - w.last > w.stall_s]
                for w in late:
                    w.stalled = True
                    self._watched.discard(w)
                    self._stall(w.holder, now + w.stall_s)
            for w in late:
                w.call.cancel()  # its iteration ends with CANCELLED on the thread that reads it
            time.sleep(POLL_S)


STALLS = StallWatch()
