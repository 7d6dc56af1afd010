"""The standbys that follow the active coordinator, as the active sees them: which state each holds,
and whether a round may be recorded without it.

A standby heartbeats the active (a signed heartbeat with role "standby" and the round whose state it
holds) as soon as it holds a new round's checkpoint, and every HEARTBEAT_S otherwise. The active
records round r (history, run log, the state a takeover starts from) only once every *counted*
standby holds θ_{r+1}: a standby that takes over never lacks a round the active recorded, however
the active's process was frozen or killed right after (the split brain of issue 22: the standby
re-closed the round the frozen active had just closed, with another hash).

Counted: a standby is counted from a heartbeat that shows it holds the latest recorded state, and
every reply tells it whether it is (refusal UNKNOWN_PEER when it is not). One that lags a round
longer than `ack_wait_s` is no longer counted, and the active records without it once `grace_s`
has passed since its last counted reply. A standby takes over only within grace − margin of having
*sent* the heartbeat last answered "counted" (peer/coordinator/standby.py), so by the time the
active records without it, it has given up its right to take over. A dead standby is dropped the
same way, grace_s after its last heartbeat. A frozen or slow standby slows the round it lags by at
most ack_wait_s + grace_s; it never lets the two coordinators' histories part.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

HEARTBEAT_S = 0.5  # a standby's heartbeat when nothing changed
GRACE_LEASES = 4.0  # grace_s = this x the lease: a standby must notice the lapse and take over well within it
ACK_WAIT_LEASES = 1.0  # ack_wait_s = this x the lease
MAX_FOLLOWERS = 16


@dataclass(slots=True)
class Follower:
    fingerprint: str
    endpoint: str
    holding_round: int  # the round whose open state θ_round it holds (-1: none yet)
    holding_hash: str
    heard_at: float  # monotonic, the last heartbeat
    counted: bool = False
    counted_until: float = 0.0  # monotonic: no round is recorded without its ack before this
    manifest_round: int = -1  # the round whose signed manifest it follows (a takeover continues that round)


class Followers:
    """Thread-safe: heartbeats arrive on RPC threads, the clock thread waits in `wait_for`."""

    def __init__(self, lease_s: Callable[[], float], *, recorded: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.lease_s = lease_s  # the active's current lease (its grace and ack wait derive from it)
        self.clock = clock
        self.recorded = recorded  # the round of the latest state recorded (or being recorded): a takeover starts there
        self.pending: tuple[int, float] | None = None  # (round, since): the state being recorded
        self.by_key: dict[str, Follower] = {}
        self._changed = threading.Condition()

    def grace_s(self) -> float:
        return GRACE_LEASES * self.lease_s()

    def heard(self, fingerprint: str, *, endpoint: str, holding_round: int, holding_hash: str, leaving: bool = False,
              manifest_round: int = -1) -> bool:
        """A standby's heartbeat: True when it is counted (its ack is awaited; it may take over).
        `leaving`: it saw the run finish and will never take over: nothing waits for it."""
        now = self.clock()
        with self._changed:
            if leaving:
                self.by_key.pop(fingerprint, None)
                self._changed.notify_all()
                return False
            f = self.by_key.get(fingerprint)
            if f is None:
                if len(self.by_key) >= MAX_FOLLOWERS:
                    return False
                f = self.by_key[fingerprint] = Follower(fingerprint, endpoint, holding_round, holding_hash, now)
            f.endpoint, f.holding_round, f.holding_hash, f.heard_at = endpoint, holding_round, holding_hash, now
            f.manifest_round = manifest_round
            lagging = self.pending is not None and holding_round < self.pending[0] and \
                now - self.pending[1] > ACK_WAIT_LEASES * self.lease_s()
            f.counted = holding_round >= self.recorded and not lagging
            if f.counted:
                f.counted_until = now + self.grace_s()
            self._changed.notify_all()
            return f.counted

    def awaited(self, round_: int) -> list[Follower]:
        """The standbys whose ack the record of θ_round still needs."""
        now = self.clock()
        with self._changed:
            return [f for f in self.by_key.values() if f.counted_until > now and f.holding_round < round_]

    def wait_for(self, round_: int, stop: Callable[[], bool] = lambda: False) -> bool:
        """Block (the clock thread, no lock held) until every counted standby holds θ_round, or its
        grace ran out (False: `stop` said to give up). From then on θ_round is the state a standby must hold to be counted (set in
        the same step: a standby that heartbeats between this and the record is not counted on an
        older state)."""
        with self._changed:
            self.pending = (round_, self.clock())
            try:
                while not stop():
                    now = self.clock()
                    waiting = [f for f in self.by_key.values() if f.counted_until > now and f.holding_round < round_]
                    if not waiting:
                        self.recorded = max(self.recorded, round_)
                        return True
                    self._changed.wait(min(0.5, min(f.counted_until for f in waiting) - now + 0.01))
                return False
            finally:
                self.pending = None

    def revive(self, lapsed_at: float) -> None:
        """The active's lease ran out at `lapsed_at` and was renewed only now: it may have been frozen
        all that time, so a standby it counted then was not silent, it could not be heard. Every
        standby counted at `lapsed_at` is counted for another grace from now (if one took over
        meanwhile, this active records nothing before its lease renewals show the rival)."""
        now = self.clock()
        with self._changed:
            for f in self.by_key.values():
                if f.counted_until > lapsed_at:
                    f.counted_until = max(f.counted_until, now + self.grace_s())
            self._changed.notify_all()

    def endpoints(self) -> list[str]:
        now = self.clock()
        with self._changed:
            return sorted(f.endpoint for f in self.by_key.values() if f.endpoint and now - f.heard_at < self.grace_s())

    def status(self) -> list[dict]:
        """The standbys heard within grace: what `swarmloco status` lists."""
        now = self.clock()
        with self._changed:
            return [{"fingerprint": f.fingerprint, "endpoint": f.endpoint, "holding_round": f.holding_round,
                     "manifest_round": f.manifest_round, "counted": f.counted and f.counted_until > now, "seconds_since_heard": round(now - f.heard_at, 1)}
                    for f in sorted(self.by_key.values(), key=lambda f: f.fingerprint) if now - f.heard_at < self.grace_s()]
