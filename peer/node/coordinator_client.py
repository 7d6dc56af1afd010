"""A peer's calls to its coordinator, with deadlines on every call and backoff on transient failures.

Every refusal, whether the reply carries it or a gRPC error does, comes out as one typed exception,
`Refused` (protocol.rpc_errors), whose `refusal` the node branches on.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from datetime import timedelta
from typing import Callable, TypeVar

import grpc

from peer.node.errors import RunOver
from protocol.wire import swarm_pb2, swarm_pb2_grpc
from protocol import manifest_wire
from protocol.accounting import ByteCounter
from protocol.channels import DEFAULT_DEADLINE, TRANSFER_DEADLINE, create_channel, wait_ready
from protocol.rpc_errors import Refused
from protocol.streaming import TransferError, receive_chunks

log = logging.getLogger("swarmloco.peer")
T = TypeVar("T")
TRANSIENT = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED}
# The coordinator is gone, or answers nothing (a frozen process keeps its connections open): ask
# whether another one holds the run now.
LOST = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
# Something that is not a coordinator answers at the address ("Method not found"): the dead
# coordinator's port was given to another process. While a locator may find the run's coordinator
# elsewhere (failover), that is as good as gone; without one it is a wrong address.
NOT_HERE = grpc.StatusCode.UNIMPLEMENTED
MAX_CHECKPOINT_BYTES = 8 << 30
RECONNECT_EVERY_S = 3.0
# A lost coordinator: the run's coordinators are asked this often who holds the run now (the
# endpoints the run named, probed at once; the DHT less often: peer/node/trust.py). Every tenth of
# a second a peer keeps looking after the successor answers is a tenth the round in flight waits.
LOCATE_EVERY_S = 0.2
FAILOVER_RETRY_S = 0.2  # the longest backoff while a locator may find a successor (a takeover lands within a lease)
EARLY_ANSWER_PAUSE_S = 0.5  # a long-poll answered at once with no news (every slot taken): pause instead of spinning


class CoordinatorUnavailable(ConnectionError):
    pass


def _not_a_coordinator(endpoint: str, what: str, exc: grpc.RpcError) -> str:
    return (f"{endpoint} does not serve the coordinator's service ({what}: {exc.details() if hasattr(exc, 'details') else exc}): "
            "is it the coordinator's address (its --listen port), and does the coordinator run the same swarmloco version?")


class CoordinatorClient:
    def __init__(self, endpoint: str, counter: ByteCounter, *, retry_for: timedelta = timedelta(seconds=120),
                 locate: Callable[[], str | None] | None = None) -> None:
        self.endpoint = endpoint
        self.counter = counter
        self.retry_for = retry_for
        # Failover: `locate` names the run's active coordinator now (peer/node/trust.py), or None.
        # `generation` counts switches, so a round in flight knows its coordinator changed.
        self.locate = locate
        # The run finished while its coordinator is unreachable (peer/node/trust.py, from the DHT):
        # the reason, else "". A join that comes as the run ends stops retrying (RunOver).
        self.run_over: Callable[[], str] = lambda: ""
        self.generation = 0
        self._located_at = 0.0
        self._lock = threading.Lock()
        self.channel = create_channel(endpoint, counter)  # counted under the endpoint, like every callee
        self.stub = swarm_pb2_grpc.CoordinatorStub(self.channel)
        self._retired: list[grpc.Channel] = []
        self._rebuilt_at = time.monotonic()

    def _switch(self, endpoint: str) -> None:
        """A fresh channel (to `endpoint`): the old one is kept open (another thread may be
        mid-call on it) and closed with the client."""
        self._retired.append(self.channel)
        self.endpoint = endpoint
        self.channel = create_channel(endpoint, self.counter)
        self.stub = swarm_pb2_grpc.CoordinatorStub(self.channel)
        self._rebuilt_at = time.monotonic()

    def _reconnect(self) -> None:
        """The coordinator went away. Another coordinator of the run may be active now (a standby
        that took over): ask `locate`, at most every LOCATE_EVERY_S. Else a fresh channel to the same
        address: grpc's own reconnect backoff grows to minutes, while a restarted coordinator is
        usually back within seconds."""
        if self.relocate():
            return
        with self._lock:
            if time.monotonic() - self._rebuilt_at >= RECONNECT_EVERY_S:
                self._switch(self.endpoint)

    def relocate(self) -> bool:
        """Ask `locate` (at most every LOCATE_EVERY_S) for the run's active coordinator and switch to it
        when it is another one: the one we talk to is gone, or was superseded by a higher term
        (peer/node/trust.py). True when it switched."""
        with self._lock:
            now = time.monotonic()
            if self.locate is None or now - self._located_at < LOCATE_EVERY_S:
                return False
            self._located_at = now
            found = self.locate()
            if found is None or found == self.endpoint:
                return False
            log.warning("coordinator %s is gone or superseded; the run's active coordinator is now %s: switching", self.endpoint, found)
            self._switch(found)
            self.generation += 1
            return True

    def wait_ready(self, timeout: timedelta) -> None:
        wait_ready(self.channel, self.endpoint, timeout)

    def call(self, what: str, fn: Callable[[], T]) -> T:
        """Run fn, retrying transient failures with exponential backoff (jittered) up to retry_for.
        A gRPC error that carries a refusal is raised as Refused."""
        deadline = time.monotonic() + self.retry_for.total_seconds()
        delay = 0.25
        while True:
            try:
                return fn()
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                not_here = code is NOT_HERE
                if not_here:
                    if self.locate is None:
                        raise CoordinatorUnavailable(_not_a_coordinator(self.endpoint, what, exc)) from None
                    code = grpc.StatusCode.UNAVAILABLE
                if code not in TRANSIENT or time.monotonic() + delay > deadline:
                    if not_here:  # the run's locator never named another coordinator: maybe not a failover at all
                        raise CoordinatorUnavailable(_not_a_coordinator(self.endpoint, what, exc)
                                                     + f" (no other coordinator of the run found for {self.retry_for.total_seconds():.0f}s)") from None
                    if code in TRANSIENT:
                        raise CoordinatorUnavailable(
                            f"coordinator {self.endpoint} unreachable for {self.retry_for.total_seconds():.0f}s ({what}): "
                            f"{exc.details() if hasattr(exc, 'details') else exc}"
                        ) from None
                    raise Refused.from_rpc_error(exc) or exc
                log.info("%s: coordinator unavailable (%s), retrying in %.1fs", what, code, delay)
                if code in LOST:
                    generation = self.generation
                    self._reconnect()
                    if self.generation != generation:  # another coordinator took the run over: ask it at once
                        delay = 0.25
                        continue
                    if over := self.run_over():
                        raise RunOver(f"{over} ({what}: coordinator {self.endpoint} is gone)") from None
                time.sleep(delay * (0.5 + random.random()))
                # Capped low while a locator may find a successor: a standby takes over within a lease,
                # and every second a peer waits past it is a second the round in flight waits for it.
                delay = min(delay * 2, FAILOVER_RETRY_S if self.locate is not None else 5.0)

    def run_info(self, round_: int | None = None, *, state_only: bool = False) -> swarm_pb2.RunInfo:
        """The run's info; its signed run state is the current one, or (round_) the one at the start of
        that round. state_only: without the config, state manifest and holders (what a peer checks
        after every round)."""
        request = swarm_pb2.RunInfoRequest(at_round=round_ is not None, round=round_ or 0, state_only=state_only)
        return self.call("run info", lambda: self.stub.GetRunInfo(request, timeout=DEFAULT_DEADLINE.total_seconds()))

    def join(self, signed: swarm_pb2.Signed) -> swarm_pb2.JoinReply:
        """The accepted JoinReply; raises Refused (e.g. BANNED, NOT_ALLOWED) otherwise."""
        return Refused.check(self.call("join", lambda: self.stub.Join(signed, timeout=DEFAULT_DEADLINE.total_seconds())))

    def heartbeat(self, signed: swarm_pb2.Signed) -> swarm_pb2.HeartbeatReply:
        """One try (the next heartbeat is the retry); a lost coordinator gets a fresh channel.
        Raises Refused (UNKNOWN_PEER: join again) when the heartbeat was not recorded."""
        try:
            reply = self.stub.Heartbeat(signed, timeout=DEFAULT_DEADLINE.total_seconds())
        except grpc.RpcError as exc:
            if exc.code() in LOST or exc.code() is NOT_HERE:
                self._reconnect()
            raise Refused.from_rpc_error(exc) or exc
        return Refused.check(reply)

    def submit(self, signed: swarm_pb2.Signed, endpoint: str) -> swarm_pb2.CommitReply:
        """The accepted CommitReply; raises Refused (STALE_ROUND, WRONG_BASE, UNKNOWN_PEER, ...) otherwise."""
        request = swarm_pb2.CommitRequest(header=signed, endpoint=endpoint)
        return Refused.check(
            self.call("commit", lambda: self.stub.SubmitCommitment(request, timeout=DEFAULT_DEADLINE.total_seconds()))
        )

    def manifest(self, round_: int, wait_s: float) -> swarm_pb2.ManifestReply:
        """The manifest travels compressed (protocol/manifest_wire.py) and comes back as the
        coordinator signed it; EnvelopeError when a compressed body does not inflate."""
        reply = self._poll("manifest", wait_s, lambda w: self.stub.GetManifest(
            swarm_pb2.ManifestRequest(round=round_, wait_s=w, compact=True), timeout=w + DEFAULT_DEADLINE.total_seconds()),
            lambda reply: reply.ready or reply.finished or reply.current_round > round_)
        if reply.HasField("manifest"):
            reply.manifest.CopyFrom(manifest_wire.expand(reply.manifest))
        return reply

    def submit_slice_results(self, signed: swarm_pb2.Signed) -> swarm_pb2.CommitReply:
        """An owner's signed batch of slice results (one per round); the reply says whether it was
        taken (never raises Refused: refused results only mean their slices are covered by their
        other owners or recomputed)."""
        return self.call("submit slice results", lambda: self.stub.SubmitSliceResult(signed, timeout=DEFAULT_DEADLINE.total_seconds()))

    def slice_results(self, round_: int, wait_s: float, *, until_applied: bool = False) -> swarm_pb2.SliceResultsReply:
        return self._poll("slice results", wait_s, lambda w: self.stub.GetSliceResults(
            swarm_pb2.SliceResultsRequest(round=round_, wait_s=w, until_applied=until_applied), timeout=w + DEFAULT_DEADLINE.total_seconds()),
            lambda reply: (reply.applied if until_applied else reply.ready) or reply.finished or reply.current_round > round_)

    def _poll(self, what: str, wait_s: float, ask: Callable[[float], T], news: Callable[[T], bool]) -> T:
        """One long-poll of up to wait_s (ask(w) asks to wait w). When the client switches to another
        coordinator mid-poll (failover), the successor is asked not to wait and the answer comes
        back at once: it cannot have news before we commit there, and a full poll against it is
        what the round in flight waited for after every takeover (5 s of a 6 s reopened round)."""
        generation = self.generation

        def moved() -> bool:
            return self.generation != generation

        return _long_poll(lambda: self.call(what, lambda: ask(0.0 if moved() else wait_s)), wait_s, news, moved=moved)

    def report_evidence(self, signed: swarm_pb2.Signed) -> swarm_pb2.CommitReply:
        return self.call("report", lambda: self.stub.ReportEvidence(signed, timeout=DEFAULT_DEADLINE.total_seconds()))

    def report_gathered(self, signed: swarm_pb2.Signed) -> swarm_pb2.CommitReply:
        """Our signed "gathered round r" (protocol.envelope.GATHERED_TAG); the reply says whether it
        was taken (never raises Refused: a refused report only means the coordinator applies the
        round at its result timeout instead of once we are done)."""
        return self.call("gathered", lambda: self.stub.ReportGathered(signed, timeout=DEFAULT_DEADLINE.total_seconds()))

    def push(self, chunks) -> swarm_pb2.PushReply:
        """Client mode: hand our payload to the coordinator; raises Refused as submit() does."""
        stub = swarm_pb2_grpc.PeerStub(self.channel)
        try:
            reply = stub.PushPayload(chunks, timeout=TRANSFER_DEADLINE.total_seconds())
        except grpc.RpcError as exc:
            raise Refused.from_rpc_error(exc) or exc
        return Refused.check(reply)

    def checkpoint(self) -> tuple[bytes, int]:
        """Download the current checkpoint; resume from the byte a broken transfer stopped at, and
        keep trying (with backoff, over a fresh channel) for up to retry_for: the coordinator may be restarting."""
        received = b""
        sha = None  # the object `received` is a prefix of
        deadline = time.monotonic() + self.retry_for.total_seconds()
        delay = 0.5
        while True:
            stream = _Observed(self.stub.StreamCheckpoint(
                swarm_pb2.CheckpointRequest(offset=len(received)), timeout=TRANSFER_DEADLINE.total_seconds()
            ))
            try:
                data, first = receive_chunks(stream, max_size=MAX_CHECKPOINT_BYTES, expected_sha256=sha, prefix=received)
                return data, first.round
            except TransferError as exc:
                # The same object continues where it broke; a new round's checkpoint (another sha256,
                # or shorter than what we hold: offset out of range) starts over.
                changed = sha is not None and stream.sha256 not in (None, sha)
                if changed or stream.code == grpc.StatusCode.OUT_OF_RANGE:
                    received, sha = b"", None
                else:
                    received, sha = exc.received, sha or stream.sha256
                if time.monotonic() + delay > deadline:
                    raise CoordinatorUnavailable(f"could not download the checkpoint from {self.endpoint}: {exc}") from None
                log.info("checkpoint transfer broke (%s), resuming at byte %d", exc, len(received))
                if stream.code in LOST:
                    self._reconnect()
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 5.0)

    def close(self) -> None:
        for channel in [*self._retired, self.channel]:
            channel.close()


class _Observed:
    """A response stream that remembers the first chunk's sha256 and the gRPC code it failed with."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.sha256: str | None = None
        self.code: grpc.StatusCode | None = None

    def __iter__(self):
        try:
            for chunk in self.stream:
                if self.sha256 is None:
                    self.sha256 = chunk.sha256
                yield chunk
        except grpc.RpcError as exc:
            self.code = exc.code()
            raise


def _long_poll(ask: Callable[[], T], wait_s: float, news: Callable[[T], bool], moved: Callable[[], bool] = lambda: False) -> T:
    """A long-poll that the coordinator may answer at once when all its long-poll slots are taken
    (more waiting peers than slots): then ask again after a pause, until news, wait_s or `moved()`
    (the client switched coordinators: the caller commits there first), instead of
    handing the caller an early empty answer it would re-ask in a tight loop (each answer carrying
    the round's results list: scripts/measure_scale.py saw MBs per peer per round at 12 peers)."""
    deadline = time.monotonic() + wait_s
    while True:
        asked = time.monotonic()
        reply = ask()
        now = time.monotonic()
        if news(reply) or moved() or now - asked >= min(wait_s, EARLY_ANSWER_PAUSE_S) or now + EARLY_ANSWER_PAUSE_S >= deadline:
            return reply
        time.sleep(EARLY_ANSWER_PAUSE_S)
