"""The coordinator's state as `swarmloco status --json` prints it."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from peer.coordinator.round_book import result_dict

if TYPE_CHECKING:
    from peer.coordinator.state import Coordinator


def coordinator_status(c: "Coordinator") -> dict[str, Any]:
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
            "exchange": {"mode": c.cfg.exchange.mode, "slices": c.math.layout.num_slices if c.sliced else None,
                         "replicas": c.cfg.exchange.replicas if c.sliced else None},
            "open_round": {
                "phase": "reducing" if c.book.closed else "committing",
                "committed": sorted(c.book.commitments),
                "verified": c.book.verified(),
                "excluded": dict(c.book.excluded),
            },
            # The control plane: who coordinates (term bumps on every takeover) and who stands by.
            "coordinator": {"fingerprint": c.identity.peer_id, "term": c.term, "role": "active",
                            "coordinators": list(c.cfg.control.coordinators), "standby_endpoints": list(c.standby_endpoints)},
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
            "uptime_s": round(time.monotonic() - c.started_at, 1),
        }
