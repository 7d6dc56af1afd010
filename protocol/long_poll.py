"""The one loop a peer waits in: ask the coordinator again and again until there is news, the
wait's deadline passes, the peer stops, or the run's coordinator changed."""

from __future__ import annotations

import enum
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class PollEnd(enum.Enum):
    NEWS = "news"  # done(reply) held
    DEADLINE = "deadline"  # the wait's bound passed without news
    STOPPED = "stopped"  # the peer is shutting down
    MOVED = "moved"  # the run's coordinator changed: the caller restarts the round there
    GAVE_UP = "gave-up"  # between() said stop (e.g. our commitment was refused)


@dataclass(frozen=True, slots=True)
class Polled(Generic[T]):
    end: PollEnd
    reply: T | None  # the last reply (None when no call completed)
    waited_s: float


def long_poll(ask: Callable[[float], T], done: Callable[[T], bool], *, deadline: timedelta, poll: timedelta,
              stop: threading.Event, moved: Callable[[], bool] = lambda: False,
              between: Callable[[], bool] = lambda: True) -> Polled[T]:
    """Call `ask(wait_s)` (one long-poll of at most `poll`, shortened to what is left of
    `deadline`) until `done(reply)`. After each call without news, `between()` runs (False ends
    the wait: GAVE_UP). Never longer than `deadline` plus one call."""
    t0 = time.monotonic()
    until = t0 + deadline.total_seconds()
    reply: T | None = None
    while True:
        if stop.is_set():
            return Polled(PollEnd.STOPPED, reply, time.monotonic() - t0)
        left = until - time.monotonic()
        if left <= 0:
            return Polled(PollEnd.DEADLINE, reply, time.monotonic() - t0)
        reply = ask(min(poll.total_seconds(), left))
        if moved():
            return Polled(PollEnd.MOVED, reply, time.monotonic() - t0)
        if done(reply):
            return Polled(PollEnd.NEWS, reply, time.monotonic() - t0)
        if not between():
            return Polled(PollEnd.GAVE_UP, reply, time.monotonic() - t0)
