"""gRPC face of the coordinator: validates every request, maps failures to status codes.

No request, however malformed, raises out of a handler: unexpected errors become INTERNAL with
a message and are counted, and the server keeps serving.

A Join is refused, with what to do, when another live process of the key holds the run
(DUPLICATE_SESSION: peer/coordinator/registry.py says how a restart is told from a second
process) and when the endpoint it announces cannot be dialled (UNREACHABLE): a peer nobody can
fetch from would train every round and count for nothing. The dial reuses preflight's
(peer/coordinator/preflight_service.py) and only reaches the endpoint the peer announces, which
the swarm dials anyway to fetch its updates; it runs outside the coordinator's lock, once per new
endpoint.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import math
import re
import threading
import time
from typing import Any

import grpc

from peer import VERSION
from peer.coordinator.preflight_service import dial
from peer.coordinator.state import Coordinator
from peer.run.faults import fail_point
from protocol.envelope import GATHERED_TAG, HEARTBEAT_TAG, JOIN_TAG
from peer.coordinator.registry import PeerRecord, RegistryFull, unreachable_advice
from protocol import streaming
from protocol.wire import swarm_pb2, swarm_pb2_grpc
from protocol.ratelimit import CallerLimits, RateLimiter
from protocol.reasons import Reason
from protocol.rpc_errors import RpcAbort, guarded, host_of, refusal_for
from protocol.async_wait import LoopNews
from protocol.keys import CoordinatorKeys
from protocol.signing import SignatureError, open_signed

log = logging.getLogger("swarmloco.coordinator")

MAX_CLOCK_SKEW_S = 300.0
MAX_LONG_POLL_S = 60.0  # the longest one long-poll waits, whatever it asks (as the sync waits bound it)


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


def _loopback(host: str) -> bool | None:
    """Whether host is a loopback address (None: a name other than localhost, or not an address)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return None


def unreachable_reason(endpoint: str, caller: str) -> str:
    """'' when the coordinator can dial the endpoint a peer announces (a valid HOST:PORT), else why
    not and what to do. `caller`: the peer as the coordinator sees it ('ipv4:203.0.113.5')."""
    host, port = endpoint.rsplit(":", 1)
    host = host.strip("[]")
    seen = caller.partition(":")[2].strip("[]")
    if _loopback(host) and _loopback(seen) is False:
        # Dialling it here would reach the coordinator's own machine, not the peer's.
        return (f"{unreachable_advice(endpoint)} ({host} is a loopback address: only the peer's own machine can dial it, "
                f"and this peer connects from {seen})")
    reply = dial(host, int(port))
    return "" if reply.connected else f"{unreachable_advice(endpoint)} (the coordinator's dial-back failed: {reply.error})"


class CoordinatorServicer(swarm_pb2_grpc.CoordinatorServicer):
    def __init__(
        self,
        coordinator: Coordinator,
        *,
        limits: CallerLimits | None = None,
        new_peers_per_s: float = 5.0,
        new_peers_burst: float = 200.0,
        max_long_polls: int = 4096,
        max_stream_s: float = 120.0,
        dial_back: bool = True,
    ) -> None:
        self.coordinator = coordinator
        self.dial_back = dial_back  # a Join's announced endpoint is dialled (off: tests whose peers serve nothing)
        self.limits = limits or CallerLimits(per_peer_rate=100.0, per_peer_burst=400.0)
        # Admission of *new* identities is one global bucket: keys are free to make (Sybil flood).
        self.admission = RateLimiter(rate_per_s=new_peers_per_s, burst=new_peers_burst)
        # Long-polls wait on the server's event loop, holding no thread (protocol/aio_server.py); a
        # bound still caps what a flood of them may hold (the excess is answered at once).
        self.long_polls = threading.BoundedSemaphore(max_long_polls)
        self.news = LoopNews(coordinator.lock)  # wakes them: every notify of round_closed, once the lock is free
        coordinator.round_closed.listen(self.news.wake)
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
        session, succeeds = fields.get("session", ""), fields.get("succeeds", "")
        if not all(isinstance(s, str) and len(s) <= 64 for s in (session, succeeds)):
            c.registry.reject(Reason.MALFORMED)
            raise RpcAbort(grpc.StatusCode.INVALID_ARGUMENT, "session and succeeds must be strings of at most 64 characters",
                           swarm_pb2.MALFORMED)
        with c.lock:
            if (refused := self._join_refusal(peer_id, session, succeeds)) is not None:
                return refused
            record = c.registry.get(peer_id)
            if record is None and not self.admission.allow("new-peer"):
                c.registry.reject(Reason.ADMISSION_LIMITED)
                raise RpcAbort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED, "too many new peers are joining right now: retry in a few seconds", swarm_pb2.RATE_LIMITED
                )
            dialed = record.dialed if record is not None else ""
        if endpoint and endpoint != dialed and self.dial_back:  # slow (up to a connect timeout): not under the lock
            if unreachable := unreachable_reason(endpoint, host_of(context)):
                c.registry.reject(Reason.UNREACHABLE_ENDPOINT)
                log.info("peer %s refused: %s", peer_id[:8], unreachable)
                return swarm_pb2.JoinReply(accepted=False, refusal=swarm_pb2.UNREACHABLE, reason=unreachable)
            dialed = endpoint
        with c.lock:
            if (refused := self._join_refusal(peer_id, session, succeeds)) is not None:  # again: the dial let others in
                return refused
            try:
                self._admit(peer_id, request, fields, endpoint, session=session, dialed=dialed)
            except RegistryFull as exc:
                c.registry.reject(Reason.REGISTRY_FULL)
                raise RpcAbort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc), swarm_pb2.REGISTRY_FULL)
            log.info("peer %s joined at round %d (%s)", peer_id[:8], c.round, endpoint or "client mode")
            return swarm_pb2.JoinReply(accepted=True, peer_id=peer_id, round=c.round, param_hash=c.param_hash)

    def _join_refusal(self, peer_id: str, session: str, succeeds: str) -> swarm_pb2.JoinReply | None:
        """The refusal of a Join from a banned key or a second live process of one (under the lock)."""
        registry = self.coordinator.registry
        record = registry.get(peer_id)
        if record is not None and record.banned_reason:
            return swarm_pb2.JoinReply(accepted=False, refusal=swarm_pb2.BANNED, reason=f"banned: {record.ban_message()}")
        if (live := registry.session_conflict(peer_id, session, succeeds)) is not None:
            registry.reject(Reason.DUPLICATE_SESSION)
            log.warning("peer %s: a second process of its key tried to join (the first is live): refused", peer_id[:8])
            return swarm_pb2.JoinReply(accepted=False, refusal=swarm_pb2.DUPLICATE_SESSION,
                                       reason=live.duplicate_message(time.monotonic(), registry.peer_timeout_s))
        return None

    def _admit(self, peer_id: str, request: swarm_pb2.Signed, fields: dict[str, Any], endpoint: str, *, session: str,
               dialed: str) -> None:
        c = self.coordinator
        previous = c.registry.get(peer_id)
        previous_session = previous.session if previous is not None else ""  # upsert updates the record in place
        record = c.registry.upsert(
            PeerRecord(
                peer_id=peer_id,
                public_key=bytes(request.public_key),
                endpoint=endpoint,
                client_mode=bool(fields.get("client_mode", False)),
                version=str(fields.get("version", ""))[:32],
                # Round 1 is the start phase: everyone who joins during it is awaited. Later, a
                # peer joining a round already under way is awaited from the next one.
                joined_round=c.round + (1 if c.round > 0 and c.book.commitments else 0),
                session=session,
                dialed=dialed,
            )
        )
        took_over = previous_session not in ("", session) and session != ""
        if took_over and (peer_id in c.book.commitments or peer_id in c.book.pushed):
            # The process it replaces already committed in the open round: a second update there
            # would be equivocation (a ban), so this one takes part from the next round.
            record.commit_from_round = c.round + 1

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
            session = fields.get("session")
            if isinstance(session, str) and session:
                if record.session and session != record.session:  # another process of this key took over
                    c.registry.reject(Reason.DUPLICATE_SESSION)
                    return swarm_pb2.HeartbeatReply(round=c.round, param_hash=c.param_hash, finished=c.finished,
                                                    refusal=swarm_pb2.DUPLICATE_SESSION, reason=record.superseded_message())
                record.session = record.session or session[:64]  # a restored record learns who is live
            record.last_seen = time.monotonic()
            for name, kind in (("state", str), ("param_hash", str)):
                value = fields.get(name)
                if isinstance(value, kind):
                    setattr(record, name, value[:80])
            if type(fields.get("round")) is int and isinstance(fields.get("param_hash"), str):
                record.hash_round = fields["round"]  # the round its reported hash opens (status pairs them)
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
                reason=record.ban_message() if record.banned_reason else "",
                finished=c.finished,
                unreachable=record.unreachable,
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
        manifest_round = fields.get("manifest_round", -1)  # absent from an older standby's heartbeat
        manifest_round = manifest_round if type(manifest_round) is int else -1
        counted = c.followers.heard(peer_id, endpoint=endpoint, holding_round=holding, holding_hash=holding_hash[:80],
                                    leaving=fields.get("leaving") is True, manifest_round=manifest_round)
        if counted and manifest_round >= 0:
            fail_point("manifest-followed", manifest_round)  # tests and bench_failover: die once the standby could continue it
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
    async def GetManifest(self, request, context):
        c = self.coordinator
        return await self._long_poll(request.wait_s, context, lambda: c.manifest_news(request.round),
                                     lambda: c.wait_manifest(request.round, 0.0, compact=request.compact))

    async def _long_poll(self, requested: float, context, news, answer):
        """Wait on the server's loop, holding no thread, until `news()` or the wait's end, then
        answer with `answer()` (it takes the coordinator's lock: on a pool thread, for that step
        only). Asked not to wait, or with every long-poll slot taken: answered at once."""
        wait_s = self._long_poll_s(requested, context)
        if wait_s > 0 and self.long_polls.acquire(blocking=False):
            try:
                await self.news.until(news, min(wait_s, MAX_LONG_POLL_S))
            finally:
                self.long_polls.release()
        return await asyncio.get_running_loop().run_in_executor(None, answer)

    def _long_poll_s(self, requested: float, context) -> float:
        """How long a long-poll may wait: what it asked, within its deadline."""
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
    async def GetSliceResults(self, request, context):
        c = self.coordinator
        exchange = c.exchange

        def answer() -> swarm_pb2.SliceResultsReply:
            reply = exchange.wait_results(request.round, 0.0, request.until_applied)
            if request.until_applied and reply.applied:  # the peer checks θ_{r+1} against it: no GetRunInfo of its own
                state = c.state_at(request.round + 1)
                if state is not None:
                    reply.run_state.CopyFrom(state)
            return reply

        return await self._long_poll(request.wait_s, context, lambda: exchange.results_news(request.round, request.until_applied),
                                     answer)

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
