"""gRPC face of the coordinator: validates every request, maps failures to status codes.

No request, however malformed, raises out of a handler: unexpected errors become INTERNAL with
a message and are counted, and the server keeps serving.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import grpc

from peer.coordinator import VERSION, Coordinator
from peer.registry import PeerRecord
from protocol import streaming
from protocol._generated import swarm_pb2, swarm_pb2_grpc
from protocol.ratelimit import RateLimiter
from protocol.rpc_errors import RpcAbort, guarded
from protocol.signing import SignatureError, open_signed

log = logging.getLogger("swarmloco.coordinator")

JOIN_TAG = "swarmloco/join/v1"
HEARTBEAT_TAG = "swarmloco/heartbeat/v1"
MAX_CLOCK_SKEW_S = 300.0


_guarded = guarded(lambda s: s.limiter, lambda s, reason: s.coordinator.registry.reject(reason))
_guarded_stream = guarded(lambda s: s.limiter, lambda s, reason: s.coordinator.registry.reject(reason), streaming=True)


def _fresh(fields: dict[str, Any]) -> bool:
    stamp = fields.get("timestamp")
    return isinstance(stamp, (int, float)) and abs(time.time() - stamp) < MAX_CLOCK_SKEW_S


class CoordinatorServicer(swarm_pb2_grpc.CoordinatorServicer):
    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator
        self.limiter = RateLimiter(rate_per_s=100.0, burst=400.0)

    @_guarded
    def GetRunInfo(self, request, context):
        c = self.coordinator
        with c.lock:
            return swarm_pb2.RunInfo(
                run_id=c.cfg.run_id,
                config_json=c.cfg.to_json(),
                coordinator_public_key=c.identity.public_key,
                software_version=VERSION,
                round=c.round,
                param_hash=c.param_hash,
                initial_peers=c.initial_peers,
                finished=c.finished,
            )

    @_guarded
    def Join(self, request, context):
        c = self.coordinator
        try:
            fields, peer_id = open_signed(request, JOIN_TAG)
        except SignatureError as exc:
            c.registry.reject(exc.reason)
            raise RpcAbort(grpc.StatusCode.UNAUTHENTICATED, f"join refused: {exc}")
        if fields.get("run_id") != c.cfg.run_id:
            c.registry.reject("wrong-run")
            return swarm_pb2.JoinReply(accepted=False, reason=f"this coordinator runs {c.cfg.run_id!r}, not {fields.get('run_id')!r}")
        if not _fresh(fields):
            c.registry.reject("stale-join")
            return swarm_pb2.JoinReply(accepted=False, reason="join timestamp is too old or in the future: check the clock")
        if c.cfg.allowed_peers and request.public_key.hex() not in {k.lower() for k in c.cfg.allowed_peers}:
            c.registry.reject("not-allowed")
            raise RpcAbort(grpc.StatusCode.PERMISSION_DENIED, f"peer {peer_id} is not on this run's allow-list; ask the run owner to add its public key {request.public_key.hex()}")
        endpoint = fields.get("endpoint", "")
        if not isinstance(endpoint, str) or len(endpoint) > 256:
            c.registry.reject("malformed")
            raise RpcAbort(grpc.StatusCode.INVALID_ARGUMENT, "endpoint must be a HOST:PORT string")
        with c.lock:
            if c.registry.is_banned(peer_id):
                return swarm_pb2.JoinReply(accepted=False, reason=f"banned: {c.registry.get(peer_id).banned_reason}")
            c.registry.upsert(
                PeerRecord(
                    peer_id=peer_id,
                    public_key=bytes(request.public_key),
                    endpoint=endpoint,
                    client_mode=bool(fields.get("client_mode", False)),
                    version=str(fields.get("version", ""))[:32],
                    # Round 1 is the start phase: everyone who joins during it is awaited. Later, a
                    # peer joining a round already under way is awaited from the next one.
                    joined_round=c.round + (1 if c.round > 0 and c.book.commitments else 0),
                )
            )
            log.info("peer %s joined at round %d (%s)", peer_id[:8], c.round, endpoint or "client mode")
            return swarm_pb2.JoinReply(accepted=True, peer_id=peer_id, round=c.round, param_hash=c.param_hash)

    @_guarded
    def Heartbeat(self, request, context):
        c = self.coordinator
        try:
            fields, peer_id = open_signed(request, HEARTBEAT_TAG)
        except SignatureError as exc:
            c.registry.reject(exc.reason)
            raise RpcAbort(grpc.StatusCode.UNAUTHENTICATED, f"heartbeat refused: {exc}")
        if not _fresh(fields):
            c.registry.reject("stale-heartbeat")
            raise RpcAbort(grpc.StatusCode.INVALID_ARGUMENT, "heartbeat timestamp is stale: check the clock")
        with c.lock:
            record = c.registry.get(peer_id)
            if record is None:
                raise RpcAbort(grpc.StatusCode.NOT_FOUND, "unknown peer: Join first")
            record.last_seen = time.monotonic()
            for name, kind in (("state", str), ("param_hash", str)):
                value = fields.get(name)
                if isinstance(value, kind):
                    setattr(record, name, value[:80])
            for name in ("step", "bytes_sent", "bytes_received"):
                value = fields.get(name)
                if isinstance(value, int) and value >= 0:
                    setattr(record, name, value)
            if isinstance(fields.get("loss"), (int, float)):
                record.loss = float(fields["loss"])
            if isinstance(fields.get("utilization"), (int, float)):
                record.utilization = float(fields["utilization"])
            if isinstance(fields.get("round_bytes"), dict):
                record.round_bytes = {k: int(v) for k, v in list(fields["round_bytes"].items())[:4] if isinstance(v, int)}
            reported_round = fields.get("round")
            resync = (
                reported_round == c.round and isinstance(fields.get("param_hash"), str) and fields["param_hash"] != c.param_hash
            )
            return swarm_pb2.HeartbeatReply(
                round=c.round,
                param_hash=c.param_hash,
                resync=bool(resync),
                banned=bool(record.banned_reason),
                reason=record.banned_reason,
                finished=c.finished,
            )

    @_guarded
    def SubmitCommitment(self, request, context):
        if len(request.endpoint) > 256:
            self.coordinator.registry.reject("malformed")
            raise RpcAbort(grpc.StatusCode.INVALID_ARGUMENT, "endpoint too long")
        return self.coordinator.submit(request.header, request.endpoint)

    @_guarded
    def GetManifest(self, request, context):
        wait_s = request.wait_s if request.wait_s == request.wait_s else 0.0  # NaN -> 0
        remaining = context.time_remaining()
        if remaining is not None:
            wait_s = min(wait_s, max(0.0, remaining - 0.5))
        return self.coordinator.wait_manifest(request.round, wait_s)

    @_guarded_stream
    def StreamCheckpoint(self, request, context):
        c = self.coordinator
        with c.lock:
            data, round_ = c.checkpoint_bytes, c.round
        if not 0 <= request.offset <= len(data):
            c.registry.reject("bad-offset")
            raise RpcAbort(grpc.StatusCode.OUT_OF_RANGE, f"offset {request.offset} outside 0..{len(data)}")
        yield from streaming.iter_chunks(data, offset=request.offset, round_=round_)

    @_guarded
    def Status(self, request, context):
        return swarm_pb2.StatusReply(json=json.dumps(self.coordinator.status()))
