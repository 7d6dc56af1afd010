"""The open round on the coordinator: commitments, their verification, equivocation, deadline.

A round closes when its quorum of verified updates is in and either every expected peer has
committed (and each commitment is resolved) or the deadline, counted from the first commitment,
has passed. The deadline adapts: `slack` x the spread of arrivals in recent rounds, clamped to
[min_deadline_s, max_deadline_s], so a round never waits forever on a slow or dead peer.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from protocol.wire import swarm_pb2
from protocol.envelope import UpdateHeader
from peer.run.config import RoundConfig


@dataclass(slots=True)
class Commitment:
    header: UpdateHeader
    signed: swarm_pb2.Signed
    endpoint: str
    arrived: float
    status: str = "pending"  # pending -> verified | excluded
    reason: str = ""
    update: torch.Tensor | None = None  # decoded (d,), once verified


@dataclass(slots=True)
class RoundBook:
    round: int
    opened_at: float = field(default_factory=time.monotonic)
    first_arrival: float | None = None
    commitments: dict[str, Commitment] = field(default_factory=dict)
    excluded: dict[str, str] = field(default_factory=dict)  # peer_id -> reason
    # peer_id -> the first header a client-mode peer pushed this round (a second, different one is equivocation)
    pushed: dict[str, tuple[UpdateHeader, swarm_pb2.Signed]] = field(default_factory=dict)
    closed: bool = False  # sliced exchange: the manifest is out; owners are reducing
    continued: bool = False  # a takeover continued it from the previous active's manifest (its arrivals are not ours)

    def verified(self) -> list[str]:
        return sorted(p for p, c in self.commitments.items() if c.status == "verified" and p not in self.excluded)

    def pending(self) -> list[str]:
        return sorted(p for p, c in self.commitments.items() if c.status == "pending")


class AdaptiveDeadline:
    def __init__(self, cfg: RoundConfig) -> None:
        self.cfg = cfg
        self.current = cfg.deadline_s
        self.spreads: deque[float] = deque(maxlen=5)

    def observe(self, spread_s: float) -> None:
        self.spreads.append(spread_s)
        target = self.cfg.deadline_slack * max(self.spreads) + 1.0
        self.current = min(self.cfg.max_deadline_s, max(self.cfg.min_deadline_s, target))


def should_close(book: RoundBook, expected: list[str], deadline_s: float, min_peers: int, now: float) -> tuple[bool, str]:
    """(close?, why) for the open round."""
    verified = book.verified()
    if len(verified) < min_peers:
        return False, f"waiting for quorum: {len(verified)}/{min_peers} verified updates"
    if book.pending():
        # A pending fetch has its own transfer deadline, so this wait is bounded too.
        if book.first_arrival is not None and now - book.first_arrival < deadline_s:
            return False, f"verifying {len(book.pending())} payload(s)"
    committed = set(book.commitments) | set(book.excluded)
    missing = [p for p in expected if p not in committed]
    if not missing and not book.pending():
        return True, "every expected peer committed"
    if book.first_arrival is not None and now - book.first_arrival >= deadline_s:
        return True, f"deadline {deadline_s:.0f}s passed; missing {len(missing)} peer(s)"
    return False, f"waiting for {len(missing)} peer(s), deadline {deadline_s:.0f}s"


@dataclass(slots=True)
class RoundResult:
    round: int
    updates: int
    excluded: dict[str, str]
    seconds: float
    val_loss: float
    param_hash: str
    close_reason: str


def result_dict(r: RoundResult) -> dict[str, Any]:
    return {
        "round": r.round,
        "updates": r.updates,
        "excluded": r.excluded,
        "seconds": r.seconds,
        "val_loss": r.val_loss,
        "param_hash": r.param_hash,
        "close_reason": r.close_reason,
    }
