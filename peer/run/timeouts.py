"""Every wait a training peer does, in one object derived from the run config.

A peer waits on its coordinator in long-polls: each call parks at most `poll` on the server (so
between calls the peer can check that its commitment is still held, or that the run's
coordinator changed), and a whole wait gives up after its bound, which follows the run's own
clock: the commit phase closes within rounds.max_deadline_s of its first commitment (after at
most rounds.start_timeout_s for the expected peers of round 0), the owners' results are final
within exchange.result_timeout_s, and the coordinator applies a round within another
result_timeout_s of that. A bound only ends a wait on a coordinator that is lost; the peer then
resynchronises from the swarm's state instead of hanging.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from peer.run.config import RunConfig


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
