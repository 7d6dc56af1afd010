"""A peer's heartbeat: liveness, progress and its own byte counters, to the coordinator.

Every 2 s, and at once when a round ends (node.heartbeat_now), so `status` shows that round's
bytes. The reply carries bans and the end of the run; a coordinator that lost us gets a rejoin.
The same loop keeps the peer's DHT record alive: it is rewritten well before it expires.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import grpc

from protocol.discovery import RECORD_TTL_S
from protocol.envelope import HEARTBEAT_TAG
from protocol.rpc_errors import Refused
from protocol.signing import sign_body
from protocol.wire import swarm_pb2

if TYPE_CHECKING:
    from peer.node.node import PeerNode

log = logging.getLogger("swarmloco.peer")


def heartbeat_body(node: "PeerNode") -> dict[str, Any]:
    total = node.counter.total()
    return {
        "peer_id": node.identity.peer_id,
        "round": node.round,
        "param_hash": node.current_hash,
        "state": node.phase.value,
        "step": node.step,
        "loss": node.last_loss,
        "bytes_sent": total.sent,
        "bytes_received": total.received,
        "round_bytes": node.round_traffic,
        "utilization": round(node.utilization(), 4),
        "left_out": node.left_out[-16:],
        "timestamp": time.time(),
    }


def beat(node: "PeerNode"):
    """One signed heartbeat; the reply, or None when it did not land (the next one retries)."""
    try:
        reply = node.client.heartbeat(sign_body(node.identity, HEARTBEAT_TAG, heartbeat_body(node)))
    except Refused as exc:
        if exc.refusal == swarm_pb2.UNKNOWN_PEER:  # a restarted coordinator that lost us: rejoin
            try:
                node.send_join()
            except Exception as join_exc:  # noqa: BLE001 - the main loop sees a refusal on its next commit
                log.info("rejoin after heartbeat failed: %s", join_exc)
        else:
            log.info("heartbeat refused: %s", exc)
        return None
    except grpc.RpcError as exc:  # transient: the main loop has its own retries
        log.debug("heartbeat failed: %s", exc)
        return None
    except Exception as exc:  # noqa: BLE001
        log.debug("heartbeat failed: %s", exc)
        return None
    return reply


def heartbeat_loop(node: "PeerNode") -> None:
    announced = time.monotonic()  # node.connect() wrote the first record
    while not node.stop.is_set():
        # Every 2 s, and at once when a round ends, so status shows that round's bytes.
        node.heartbeat_now.wait(2.0)
        node.heartbeat_now.clear()
        if node.stop.is_set():
            break
        if time.monotonic() - announced > RECORD_TTL_S / 3:
            announced = time.monotonic()
            try:
                node.announce()
            except Exception as exc:  # noqa: BLE001 - the next refresh retries; the gRPC path works without it
                log.info("refreshing the DHT record failed: %s", exc)
        reply = beat(node)
        if reply is None:
            continue
        if reply.banned:
            node.banned_reason = reply.reason or "banned"
        if reply.finished:
            node.finished = True
