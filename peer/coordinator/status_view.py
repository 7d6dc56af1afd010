"""The coordinator's state as `swarmloco status --json` prints it."""

from __future__ import annotations

import threading
import time
from typing import Any, Protocol

from peer.coordinator.followers import Followers
from peer.coordinator.lease import ActGuard
from peer.coordinator.registry import PeerRegistry
from peer.coordinator.round_book import AdaptiveDeadline, RoundBook, RoundResult, result_dict
from peer.exchange.coordinator_side import CoordinatorExchange
from peer.run.config import RunConfig
from protocol.accounting import ByteCounter
from protocol.identity import Identity


class StatusSource(Protocol):
    """What the status reads of the coordinator (peer/coordinator/state.py's Coordinator)."""

    cfg: RunConfig
    identity: Identity
    lock: threading.RLock
    round: int
    finished: bool
    param_hash: str
    endpoint: str
    initial_peers: list[str]
    deadline: AdaptiveDeadline
    exchange: CoordinatorExchange
    book: RoundBook
    term: int
    standby_endpoints: list[str]
    followers: Followers
    lease: ActGuard
    registry: PeerRegistry
    initial_val_loss: float
    history: list[RoundResult]
    counter: ByteCounter
    started_at: float


def coordinator_status(c: StatusSource) -> dict[str, Any]:
    with c.lock:
        return {
            "run_id": c.cfg.run_id,
            "round": c.round,
            "rounds": c.cfg.rounds.rounds,
            "finished": c.finished,
            "param_hash": c.param_hash,
            "coordinator_id": c.identity.peer_id,
            "endpoint": c.endpoint,
            "initial_peers": c.initial_peers,
            "deadline_s": round(c.deadline.current, 2),
            "exchange": c.exchange.status(),
            "open_round": {
                "phase": "reducing" if c.book.closed else "committing",
                "committed": sorted(c.book.commitments),
                "verified": c.book.verified(),
                "excluded": dict(c.book.excluded),
            },
            # The control plane: who coordinates (term bumps on every takeover), its lease, and who
            # stands by (the standbys heard from: the round each holds, whether a takeover may start there).
            "coordinator": {"fingerprint": c.identity.peer_id, "term": c.term, "role": "active",
                            "coordinators": list(c.cfg.control.coordinators), "standby_endpoints": list(c.standby_endpoints),
                            "standbys": c.followers.status(), "lease": c.lease.status()},
            "codec": c.cfg.compression.codec,
            "outer": c.cfg.outer.name,
            "aggregator": c.cfg.aggregation.name,
            "peers": c.registry.status(),
            "rejections": dict(c.registry.rejections),
            "initial_val_loss": c.initial_val_loss,
            "history": [result_dict(r) for r in c.history],
            "coordinator_traffic": c.counter.total().as_dict(),
            # remote -> counts: callers by peer_id (they name themselves), callees by endpoint
            "traffic_by_peer": {k: v.as_dict() for k, v in c.counter.by_peer().items()},
            # round -> RPC -> counts ("served:X": calls others made to us): what the coordinator carried
            "traffic_by_method": c.counter.by_method(),
            "uptime_s": round(time.monotonic() - c.started_at, 1),
        }
