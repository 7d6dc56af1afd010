"""Every wait a training peer does, in one object derived from the run config.

A peer waits on its coordinator in long-polls: each call parks at most `poll` on the server (so
between calls the peer can check that its commitment is still held, or that the run's
coordinator changed), and a whole wait gives up after its bound, which follows the run's own
clock: the commit phase closes within rounds.max_deadline_s of its first commitment (after at
most rounds.start_timeout_s for the expected peers of round 0), the owners' results are final
within exchange.result_timeout_s, and the coordinator applies a round within another
result_timeout_s of that. A bound only ends a wait on a coordinator that is lost; the peer then
resynchronises from the swarm's state instead of hanging.

Joining comes before the run config is known, so its bounds come from the command line
(`--connect-timeout`): `JoinTimeouts` is the one place they are derived.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from peer.run.config import RunConfig
from protocol.backoff import Backoff


@dataclass(frozen=True, kw_only=True, slots=True)
class PeerTimeouts:
    poll: timedelta = timedelta(seconds=5)  # one long-poll call parks this long on the server
    manifest: timedelta = timedelta(seconds=720)  # commit -> the round's signed manifest
    results: timedelta = timedelta(seconds=720)  # manifest -> final slice results, and -> the applied round
    coordinator_retry: timedelta = timedelta(seconds=120)  # retrying a coordinator call that fails transiently

    def __post_init__(self) -> None:
        for name in ("poll", "manifest", "results", "coordinator_retry"):
            if getattr(self, name) <= timedelta(0):
                raise ValueError(f"PeerTimeouts.{name} must be positive")
        if self.poll > min(self.manifest, self.results):
            raise ValueError("PeerTimeouts.poll must not exceed the waits it slices")

    @classmethod
    def of(cls, cfg: RunConfig) -> "PeerTimeouts":
        rounds, exchange = cfg.rounds, cfg.exchange
        slack = timedelta(seconds=rounds.peer_timeout_s)  # a coordinator that restarts comes back within this
        return cls(
            manifest=timedelta(seconds=rounds.start_timeout_s + rounds.max_deadline_s) + slack,
            results=timedelta(seconds=2 * exchange.result_timeout_s + rounds.max_deadline_s) + slack,
        )


JOIN_WINDOW = timedelta(seconds=120)  # --connect-timeout's default
JOIN_ATTEMPT = timedelta(seconds=15)
JOIN_MAX_SLEEP = timedelta(seconds=8)


@dataclass(frozen=True, kw_only=True, slots=True)
class JoinTimeouts:
    """How long a peer keeps trying to join: the DHT bootstrap, the run's record in the DHT and the
    first connection to its coordinator share one window (`--connect-timeout`), each step retried
    with jittered backoff (protocol/backoff.py) within what is left of it; one attempt of a step
    (a DHT start, a connection) is given at most `attempt` of it."""

    window: timedelta = JOIN_WINDOW
    attempt: timedelta = JOIN_ATTEMPT
    max_sleep: timedelta = JOIN_MAX_SLEEP  # the longest pause between two attempts

    def __post_init__(self) -> None:
        if self.window <= timedelta(0):
            raise ValueError(f"--connect-timeout must be positive (got {self.window.total_seconds():g} s)")
        if self.attempt <= timedelta(0) or self.max_sleep <= timedelta(0):
            raise ValueError("JoinTimeouts.attempt and max_sleep must be positive")

    @classmethod
    def of(cls, connect_timeout_s: float) -> "JoinTimeouts":
        window = timedelta(seconds=connect_timeout_s)
        return cls(window=window, attempt=min(window, JOIN_ATTEMPT), max_sleep=min(window, JOIN_MAX_SLEEP))

    def backoff(self) -> Backoff:
        return Backoff(window=self.window, first=min(self.max_sleep, timedelta(seconds=0.5)), cap=self.max_sleep)
