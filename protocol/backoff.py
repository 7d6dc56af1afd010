"""Retrying one step of a join within a bounded window: jittered exponential backoff.

A peer that starts in a storm (dozens of peers at once on a busy machine, a coordinator whose
DHT record lapsed for a moment, a coordinator that is still starting) meets failures that clear
up within seconds. `retry` runs one attempt after another, sleeping `Backoff.delays` between
them, until an attempt succeeds or the window is spent; it says once, on the terminal, what it
waits for, and fails at the end with the last error and the advice the caller gives.

The delays are "full jitter" over a capped exponential (the n-th is drawn uniformly from
[(1 - jitter)·d_n, d_n] with d_n = min(cap, first·factorⁿ)): a crowd started at one instant
spreads out instead of retrying in lockstep. With a seeded `random.Random` they are reproducible.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, Iterator, TypeVar

log = logging.getLogger("swarmloco.join")
T = TypeVar("T")


@dataclass(frozen=True, kw_only=True, slots=True)
class Backoff:
    window: timedelta  # the whole wait: attempts and sleeps together stay within it
    first: timedelta = timedelta(seconds=0.5)  # the first sleep's upper bound
    factor: float = 2.0
    cap: timedelta = timedelta(seconds=8)  # no sleep is longer than this
    jitter: float = 0.5  # each sleep is drawn from [(1 - jitter)·d, d]

    def __post_init__(self) -> None:
        if self.window <= timedelta(0):
            raise ValueError(f"Backoff.window must be positive (got {self.window}); raise --connect-timeout")
        if self.first <= timedelta(0) or self.cap < self.first:
            raise ValueError("Backoff needs 0 < first <= cap")
        if self.factor < 1.0:
            raise ValueError(f"Backoff.factor must be at least 1 (got {self.factor})")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError(f"Backoff.jitter must be within [0, 1] (got {self.jitter})")

    def bound(self, attempt: int) -> float:
        """The upper bound (seconds) of the sleep after failed attempt number `attempt` (from 1)."""
        return min(self.cap.total_seconds(), self.first.total_seconds() * self.factor ** (attempt - 1))

    def delays(self, rng: random.Random) -> Iterator[float]:
        """The sleeps between attempts, in seconds, until their sum would pass the window (the
        last one is cut to what is left of it). Attempts themselves take time too: `retry` checks
        the clock, this only bounds the sleeps."""
        left = self.window.total_seconds()
        attempt = 1
        while left > 0:
            high = self.bound(attempt)
            delay = min(left, rng.uniform((1.0 - self.jitter) * high, high))
            yield delay
            left -= delay
            attempt += 1


class RetryWindowSpent(ConnectionError):
    """Every attempt of a step failed within its window; the message says what to check."""


def retry(what: str, attempt: Callable[[float], T], *, backoff: Backoff, retryable: tuple[type[BaseException], ...],
          advice: str = "", deadline: float | None = None, rng: random.Random | None = None,
          say: Callable[[str], None] = lambda line: print(line, flush=True),
          clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> T:
    """attempt(seconds_left) until it returns; an exception in `retryable` is retried after the
    next backoff delay while the window (or the earlier `deadline`, a `clock()` value shared by
    several steps) lasts, any other exception is raised at once. The first retry prints
    "waiting for WHAT (attempt N, T s of W s) ..." once (T counted from the window's start: with a
    shared deadline, from the first step's); later ones are logged. At the end:
    RetryWindowSpent naming WHAT, the attempts, the last error and `advice`."""
    rng = rng or random.Random()
    started = clock()
    window = backoff.window.total_seconds()
    end = min(started + window, deadline) if deadline is not None else started + window
    # what the line counts from: the window's start (with a shared deadline, the first step's start)
    origin = min(started, deadline - window) if deadline is not None else started
    delays = backoff.delays(rng)
    attempts = 0
    while True:
        attempts += 1
        try:
            return attempt(max(0.0, end - clock()))
        except retryable as exc:
            last = exc
        delay = next(delays, None)
        now = clock()
        if delay is None or now + delay >= end:
            break
        spent = now - origin
        if attempts == 1:
            say(f"waiting for {what} (attempt {attempts + 1}, {spent:.0f} s of {end - origin:.0f} s) ...")
        else:
            log.info("still waiting for %s (attempt %d, %.0f s of %.0f s): %s", what, attempts + 1, spent, end - origin, last)
        sleep(delay)
    text = str(last).rstrip(". ")
    raise RetryWindowSpent(f"gave up waiting for {what} after {attempts} attempt{'s' if attempts != 1 else ''} over "
                           f"{clock() - started:.0f} s: {text}" + (f"; {advice}" if advice else "")) from last
