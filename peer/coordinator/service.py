"""gRPC face of the coordinator: validates every request, maps failures to status codes.

No request, however malformed, raises out of a handler: unexpected errors become INTERNAL with
a message and are counted, and the server keeps serving.
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
import time
from typing import Any

import grpc

from peer import VERSION
from peer.coordinator.state import Coordinator
from protocol.envelope import GATHERED_TAG, HEARTBEAT_TAG, JOIN_TAG
from peer.coordinator.registry import PeerRecord, RegistryFull
from protocol import streaming
from protocol.wire import swarm_pb2, swarm_pb2_grpc
from protocol.ratelimit import CallerLimits, RateLimiter
from protocol.reasons import Reason
from protocol.rpc_errors import RpcAbort, guarded, refusal_for
from protocol.keys import CoordinatorKeys
from protocol.signing import SignatureError, open_signed

log = logging.getLogger("swarmloco.coordinator")

MAX_CLOCK_SKEW_S = 300.0


ENDPOINT_RE = re.compile(r"^[A-Za-z0-9.\-]{1,253}:[0-9]{1,5}$|^\[[0-9A-Fa-f:.]{2,45}\]:[0-9]{1,5}$")
MAX_STATUS_JSON = 900_000  # a status reply must fit one gRPC message (channels.MAX_MESSAGE_BYTES)


_guarded = guarded(lambda s: s.limits, lambda s, reason: s.coordinator.registry.reject(reason))
_guarded_stream = guarded(
    lambda s: s.limits, lambda s, reason: s.coordinator.registry.reject(reason), streaming=True, max_stream_s=lambda s: s.max_stream_s
)


def _fresh(fields: dict[str, Any]) -> bool:
    stamp = fields.get("timestamp")
    if not isinstance(stamp, (int, float)) or isinstance(stamp, bool):
        return False
    try:
        return abs(time.time() - float(stamp)) < MAX_CLOCK_SKEW_S  # NaN compares False
    except OverflowError:  # an int past float range
        return False


def valid_endpoint(endpoint: str) -> bool:
    """'' (client mode) or HOST:PORT with a port in 1..65535."""
    return endpoint == "" or (ENDPOINT_RE.match(endpoint) is not None and 0 < int(endpoint.rsplit(":", 1)[1]) < 65536)


class CoordinatorServicer(swarm_pb2_grpc.CoordinatorServicer):
    def __init__(
        self,
        coordinator: Coordinator,
        *,
        limits: CallerLimits | None = None,
        new_peers_per_s: float = 5.0,
        new_peers_burst: float = 200.0,
        max_long_polls: int = 8,
        max_stream_s: float = 120.0,
    ) -> None:
        self.coordinator = coordinator
        self.limits = limits or CallerLimits(per_peer_rate=100.0, per_peer_burst=400.0)
        # Admission of *new* identities is one global bucket: keys are free to make (Sybil flood).
        self.admission = RateLimiter(rate_per_s=new_peers_per_s, burst=new_peers_burst)
        # Long-polls park a server thread; keep some threads free for every other call.
        self.long_polls = threading.BoundedSemaphore(max_long_polls)
        self.max_stream_s = max_stream_s

    @_guarded
    def GetRunInfo(self, request, context):
        c = self.coordinator
        with c.lock:
            run_state = c.state_at(request.round if request.at_round else None)
            if request.state_only:
                return swarm_pb2.RunInfo(run_id=c.cfg.run_id, round=c.round, finished=c.finished, run_state=run_state,
                                         coordinator_endpoints=c.standby_endpoints)
            return swarm_pb2.RunInfo(
                run_id=c.cfg.run_id,
                config_json=c.cfg.to_json(),
                coordinator_public_key=c.identity.public_key,
                software_version=VERSION,
                round=c.round,
                param_hash=c.param_hash,
                initial_peers=c.initial_peers,
                finished=c.finished,
                state_manifest=c.state_manifest,
                state_holders=c.state_holders(),
                run_state=run_state,
                coordinator_endpoints=c.standby_endpoints,
            )

    def _open(self, request: swarm_pb2.Signed, tag: str, what: str) -> tuple[dict[str, Any], str]:
        """Verify a signed body or refuse the call as UNAUTHENTICATED, counting the reason."""
        try:
            return open_signed(request, tag)
        except SignatureError as exc:
            self.coordinator.registry.reject(exc.reason)
            raise RpcAbort(grpc.StatusCode.UNAUTHENTICATED, f"{what} refused: {exc}", refusal_for(exc.reason)) from None

    @_guarded
    def Join(self, request, context):
        c = self.coordinator
        fields, peer_id = self._open(request, JOIN_TAG, "join")
        if fields.get("run_id") != c.cfg.run_id:
            c.registry.reject(Reason.WRONG_RUN)
            return swarm_pb2.JoinReply(
                accepted=False, refusal=swarm_pb2.WRONG_RUN, reason=f"this coordinator runs {c.cfg.run_id!r}, not {fields.get('run_id')!r}"
            )
        if not _fresh(fields):
            c.registry.reject(Reason.STALE_JOIN)
            return swarm_pb2.JoinReply(
                accepted=False, refusal=swarm_pb2.CLOCK_SKEW, reason="join timestamp is too old or in the future: check the clock"
            )
        expected = c.cfg.data.tokenizer_sha256 if c.cfg.data.tokenizer == "bpe" else ""
        if expected and fields.get("tokenizer_sha256") != expected:
            c.registry.reject(Reason.WRONG_TOKENIZER)
            said = fields.get("tokenizer_sha256")
            return swarm_pb2.JoinReply(
                accepted=False, refusal=swarm_pb2.WRONG_RUN,
                reason=f"this peer tokenizes with BPE {str(said)[:16] or 'none'}..., the run with {expected[:16]}...: get the run's "
                       "tokenizer.json from the run owner and pass it as data.tokenizer_path (its tokens would not match the swarm's)")
        if c.cfg.allowed_peers and request.public_key.hex() not in {k.lower() for k in c.cfg.allowed_peers}:
            c.registry.reject(Reason.NOT_ALLOWED)
            raise RpcAbort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"peer {peer_id} is not on this run's allow-list; ask the run owner to add its public key {request.public_key.hex()}",
                swarm_pb2.NOT_ALLOWED,
            )
        endpoint = fields.get("endpoint", "")
        if not isinstance(endpoint, str) or not valid_endpoint(endpoint):
            c.registry.reject(Reason.MALFORMED)
            raise RpcAbort(grpc.StatusCode.INVALID_ARGUMENT, "endpoint must be a HOST:PORT string (or empty with --client-mode)", swarm_pb2.MALFORMED)
        with c.lock:
            if c.registry.is_banned(peer_id):
                return swarm_pb2.JoinReply(accepted=False, refusal=swarm_pb2.BANNED, reason=f"banned: {c.registry.get(peer_id).banned_reason}")
            if c.registry.get(peer_id) is None and not self.admission.allow("new-peer"):
                c.registry.reject(Reason.ADMISSION_LIMITED)
                raise RpcAbort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED, "too many new peers are joining right now: retry in a few seconds", swarm_pb2.RATE_LIMITED
                )
            try:
                self._admit(peer_id, request, fields, endpoint)
            except RegistryFull as exc:
                c.registry.reject(Reason.REGISTRY_FULL)
                raise RpcAbort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc), swarm_pb2.REGISTRY_FULL)
            log.info("peer %s joined at round %d (%s)", peer_id[:8], c.round, endpoint or "client mode")
            return swarm_pb2.JoinReply(accepted=True, peer_id=peer_id, round=c.round, param_hash=c.param_hash)

    def _admit(self, peer_id: str, request: swarm_pb2.Signed, fields: dict[str, Any], endpoint: str) -> None:
        c = self.coordinator
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

    @_guarded
    def Heartbeat(self, request, context):
        c = self.coordinator
        fields, peer_id = self._open(request, HEARTBEAT_TAG, "heartbeat")
        if not _fresh(fields):
            c.registry.reject(Reason.STALE_HEARTBEAT)
            raise RpcAbort(grpc.StatusCode.INVALID_ARGUMENT, "heartbeat timestamp is stale: check the clock", swarm_pb2.CLOCK_SKEW)
        if fields.get("role") == "standby":
            return self._standby_heartbeat(fields, peer_id)
        with c.lock:
            record = c.registry.get(peer_id)
            if record is None:  # a restarted coordinator that lost it, or it never joined
                return swarm_pb2.HeartbeatReply(
                    round=c.round, param_hash=c.param_hash, finished=c.finished,
                    refusal=swarm_pb2.UNKNOWN_PEER, reason="unknown peer: Join the run first",
                )
            record.last_seen = time.monotonic()
            for name, kind in (("state", str), ("param_hash", str)):
                value = fields.get(name)
                if isinstance(value, kind):
                    setattr(record, name, value[:80])
            for name in ("step", "bytes_sent", "bytes_received"):
                value = fields.get(name)
                if isinstance(value, int) and 0 <= value < 1 << 62:
                    setattr(record, name, value)
            # Self-reported numbers are display only; keep them finite and small.
            for name in ("loss", "utilization"):
                value = fields.get(name)
                if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) < 1e12:  # NaN fails too
                    setattr(record, name, float(value))
            if isinstance(fields.get("left_out"), list):
                record.left_out = [r for r in fields["left_out"][-16:] if isinstance(r, int) and not isinstance(r, bool)]
            if isinstance(fields.get("round_bytes"), dict):
                record.round_bytes = {
                    str(k)[:16]: v for k, v in list(fields["round_bytes"].items())[:4] if isinstance(v, int) and 0 <= v < 1 << 62
                }
            return swarm_pb2.HeartbeatReply(
                round=c.round,
                param_hash=c.param_hash,
                banned=bool(record.banned_reason),
                reason=record.banned_reason,
                finished=c.finished,
            )

    def _standby_heartbeat(self, fields: dict[str, Any], peer_id: str) -> swarm_pb2.HeartbeatReply:
        """A standby says which round's state it holds (peer/coordinator/followers.py). The reply
        refuses with UNKNOWN_PEER when it is not counted: it may not take over from what it holds."""
        c = self.coordinator
        holding, holding_hash, endpoint = fields.get("holding_round"), fields.get("holding_hash"), fields.get("endpoint", "")
        if not CoordinatorKeys.of(c.cfg.control.coordinators).matches(peer_id) or fields.get("run_id") != c.cfg.run_id:
            c.registry.reject(Reason.NOT_ALLOWED)
            raise RpcAbort(grpc.StatusCode.PERMISSION_DENIED, f"{peer_id[:16]} is not one of run {c.cfg.run_id!r}'s coordinator keys",
                           swarm_pb2.NOT_ALLOWED)
        if type(holding) is not int or not isinstance(holding_hash, str) or not isinstance(endpoint, str) or not valid_endpoint(endpoint):
            c.registry.reject(Reason.MALFORMED)
            raise RpcAbort(grpc.StatusCode.INVALID_ARGUMENT, "a standby heartbeat needs holding_round, holding_hash and endpoint",
                           swarm_pb2.MALFORMED)
        counted = c.followers.heard(peer_id, endpoint=endpoint, holding_round=holding, holding_hash=holding_hash[:80],
                                    leaving=fields.get("leaving") is True)
        with c.lock:
            return swarm_pb2.HeartbeatReply(
                round=c.round, param_hash=c.param_hash, finished=c.finished,
                refusal=swarm_pb2.REFUSAL_UNSPECIFIED if counted else swarm_pb2.UNKNOWN_PEER,
                reason="" if counted else f"standby not counted: it must hold the state of round {c.followers.recorded}")

    @_guarded
    def SubmitCommitment(self, request, context):
        if not valid_endpoint(request.endpoint):
            self.coordinator.registry.reject(Reason.MALFORMED)
            raise RpcAbort(grpc.StatusCode.INVALID_ARGUMENT, "endpoint must be HOST:PORT, or empty for a pushed payload", swarm_pb2.MALFORMED)
        return self.coordinator.submit(request.header, request.endpoint)

    @_guarded
    def GetManifest(self, request, context):
        wait_s = self._long_poll_s(request.wait_s, context)
        if wait_s <= 0 or not self.long_polls.acquire(blocking=False):
            # Every long-poll slot is taken: answer at once rather than starve other calls of threads.
            return self.coordinator.wait_manifest(request.round, 0.0)
        try:
            return self.coordinator.wait_manifest(request.round, wait_s)
        finally:
            self.long_polls.release()

    def _long_poll_s(self, requested: float, context) -> float:
        """How long a long-poll may park this thread: 0 when every slot is taken (then answer at once)."""
        wait_s = requested if math.isfinite(requested) else 0.0  # NaN, ±inf -> answer now
        remaining = context.time_remaining()
        if remaining is not None:
            wait_s = min(wait_s, max(0.0, remaining - 0.5))
        return wait_s

    # The slice-result RPCs belong to the exchange mode; one without slice results refuses them
    # (FAILED_PRECONDITION, peer/exchange/coordinator_side.py).

    @_guarded
    def SubmitSliceResult(self, request, context):
        return self.coordinator.exchange.submit_result(request)

    @_guarded
    def GetSliceResults(self, request, context):
        exchange = self.coordinator.exchange
        wait_s = self._long_poll_s(request.wait_s, context)
        if wait_s <= 0 or not self.long_polls.acquire(blocking=False):
            return exchange.wait_results(request.round, 0.0, request.until_applied)
        try:
            return exchange.wait_results(request.round, wait_s, request.until_applied)
        finally:
            self.long_polls.release()

    @_guarded
    def ReportEvidence(self, request, context):
        return self.coordinator.exchange.report_evidence(request)

    @_guarded
    def ReportGathered(self, request, context):
        return self.coordinator.exchange.report_gathered(*self._open(request, GATHERED_TAG, "gathered report"))

    @_guarded_stream
    def StreamCheckpoint(self, request, context):
        c = self.coordinator
        with c.lock:
            data, round_ = c.checkpoint_bytes, c.round
        if not 0 <= request.offset <= len(data):
            c.registry.reject(Reason.BAD_OFFSET)
            raise RpcAbort(grpc.StatusCode.OUT_OF_RANGE, f"offset {request.offset} outside 0..{len(data)}", swarm_pb2.MALFORMED)
        yield from streaming.iter_chunks(data, offset=request.offset, round_=round_)

    @_guarded
    def Status(self, request, context):
        status = self.coordinator.status()
        text = json.dumps(status)
        if len(text) > MAX_STATUS_JSON:  # many peers: keep the ones that matter, say how many were left out
            kept = [p for p in status["peers"] if p["state"] != "gone" or p["banned_reason"]]
            status["peers"], status["peers_omitted"] = kept[:500], len(status["peers"]) - len(kept[:500])
            for p in status["peers"]:
                p["evidence"] = p["evidence"][:2]
            text = json.dumps(status)
        return swarm_pb2.StatusReply(json=text)
