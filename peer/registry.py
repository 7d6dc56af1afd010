"""What the coordinator knows about each peer: liveness, progress, traffic, bans and evidence."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class PeerRecord:
    peer_id: str
    public_key: bytes
    endpoint: str
    client_mode: bool
    version: str
    joined_round: int
    last_seen: float = field(default_factory=time.monotonic)
    last_round: int = -1  # last round whose update made it into a manifest
    param_hash: str = ""
    state: str = "joined"
    step: int = 0
    loss: float | None = None
    bytes_sent: int = 0  # as reported by the peer's own transport counters
    bytes_received: int = 0
    round_bytes: dict[str, int] = field(default_factory=dict)  # last completed round: sent/received
    utilization: float | None = None
    excluded_reason: str = ""
    banned_reason: str = ""
    evidence: list[dict[str, Any]] = field(default_factory=list)
    aggregation: dict[str, float] = field(default_factory=dict)  # last round: weight, distance, clip

    def as_status(self, now: float) -> dict[str, Any]:
        return {
            "peer_id": self.peer_id,
            "endpoint": self.endpoint,
            "client_mode": self.client_mode,
            "last_round": self.last_round,
            "param_hash": self.param_hash,
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
            "last_round_bytes": self.round_bytes,
            "utilization": self.utilization,
            "state": "banned" if self.banned_reason else self.state,
            "step": self.step,
            "loss": self.loss,
            "seconds_since_seen": round(now - self.last_seen, 1),
            "excluded_reason": self.excluded_reason,
            "banned_reason": self.banned_reason,
            "evidence": self.evidence,
            "aggregation": self.aggregation,
        }


class PeerRegistry:
    def __init__(self, peer_timeout_s: float) -> None:
        self.peer_timeout_s = peer_timeout_s
        self.lock = threading.RLock()
        self.peers: dict[str, PeerRecord] = {}
        self.rejections: Counter[str] = Counter()  # reason -> count, over all RPCs

    def reject(self, reason: str) -> None:
        with self.lock:
            self.rejections[reason] += 1

    def get(self, peer_id: str) -> PeerRecord | None:
        with self.lock:
            return self.peers.get(peer_id)

    def upsert(self, record: PeerRecord) -> PeerRecord:
        with self.lock:
            existing = self.peers.get(record.peer_id)
            if existing is None:
                self.peers[record.peer_id] = record
                return record
            # A rejoin (restart, new port) keeps the history, bans and evidence.
            existing.endpoint = record.endpoint
            existing.client_mode = record.client_mode
            existing.version = record.version
            existing.joined_round = record.joined_round
            existing.last_seen = time.monotonic()
            existing.state = "joined"
            return existing

    def is_banned(self, peer_id: str) -> bool:
        with self.lock:
            record = self.peers.get(peer_id)
            return bool(record and record.banned_reason)

    def ban(self, peer_id: str, reason: str, evidence: dict[str, Any] | None = None) -> None:
        with self.lock:
            record = self.peers.get(peer_id)
            if record is None:
                return
            record.banned_reason = reason
            if evidence is not None:
                record.evidence.append(evidence)

    def active(self, round_: int) -> list[str]:
        """Peers expected in round `round_`: joined before it opened, alive, not banned."""
        now = time.monotonic()
        with self.lock:
            return sorted(
                p.peer_id
                for p in self.peers.values()
                if not p.banned_reason and p.joined_round <= round_ and now - p.last_seen < self.peer_timeout_s
            )

    def mark_gone(self) -> None:
        now = time.monotonic()
        with self.lock:
            for p in self.peers.values():
                if now - p.last_seen >= self.peer_timeout_s and p.state != "gone":
                    p.state = "gone"

    def status(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        with self.lock:
            return [p.as_status(now) for p in sorted(self.peers.values(), key=lambda p: p.peer_id)]
