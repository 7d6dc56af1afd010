"""A peer's heartbeat: liveness, progress and its own byte counters, to the coordinator.

Every 2 s while it has news (a step, a phase, a round, its bytes of the last round), at once when
a round ends (`Heartbeat.now`), so `status` shows that round's bytes, and otherwise every
`keepalive_s` (the node passes a quarter of rounds.peer_timeout_s): a peer waiting on the
exchange has nothing to say but that it lives, and at 400 bytes a beat, a 2 s beat was a fifth of
a round's control bytes in a short round. It reads the node only through a frozen `NodeSnapshot` the node republishes when
something changes, and reports what the reply says (a ban, the end of the run, another process
of our key that took over, an endpoint nobody could fetch our update from) as events the node
drains on its own thread: the heartbeat thread writes nothing of the node's. A coordinator that
lost us gets a rejoin. The same loop keeps the peer's DHT record alive: it is rewritten well
before it expires, on a thread of its own (one at a time), so a slow DHT never delays a beat.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import grpc

from peer.node.errors import NotAdmitted
from protocol.accounting import ByteCounter
from protocol.coordinator_port import CoordinatorPort
from protocol.discovery import RECORD_TTL_S
from protocol.envelope import HEARTBEAT_TAG
from protocol.identity import Identity
from protocol.rpc_errors import Refused
from protocol.signing import sign_body
from protocol.wire import swarm_pb2

log = logging.getLogger("swarmloco.peer")
EVERY_S = 2.0


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """What the node says about itself, frozen: replaced whole, never changed in place."""

    round: int = 0
    param_hash: str = ""
    state: str = "starting"  # RoundPhase.value
    step: int = 0
    loss: float | None = None
    round_bytes: tuple[tuple[str, int], ...] = ()  # the last round's own traffic: (("round", r), ("sent", n), ...)
    left_out: tuple[int, ...] = ()  # rounds whose manifest left our valid commitment out without a reason
    compute_s: float = 0.0  # inner-step seconds since the first one
    training_started: float | None = None  # time.monotonic() of the first inner step

    def utilization(self, now: float) -> float:
        """Share of wall time spent in inner steps since the first one (start-up excluded)."""
        if self.training_started is None:
            return 0.0
        return self.compute_s / max(1e-9, now - self.training_started)

    def news(self) -> tuple[Any, ...]:
        """What a beat reports that is worth a beat when it changes (not the clock-driven
        utilization, not the byte totals that move on every transfer)."""
        return (self.round, self.param_hash, self.state, self.step, self.loss, self.round_bytes, self.left_out)


@dataclass(frozen=True, slots=True)
class Banned:
    reason: str


@dataclass(frozen=True, slots=True)
class RunFinished:
    pass


@dataclass(frozen=True, slots=True)
class MustStop:
    """The coordinator will not have this process (another process of our key took over, or a
    rejoin was refused for good): `reason` says why and what to do."""

    reason: str


@dataclass(frozen=True, slots=True)
class NotReachable:
    """Our update could not be fetched from the endpoint we announce: `advice` says what to do.
    Posted once per episode (again only after the coordinator stopped saying it)."""

    advice: str


HeartbeatEvent = Banned | RunFinished | MustStop | NotReachable
# A rejoin refused with these ends the peer: it can never take part under this key and endpoint.
STOPS = {swarm_pb2.DUPLICATE_SESSION, swarm_pb2.UNREACHABLE}


def heartbeat_body(peer_id: str, snapshot: NodeSnapshot, counter: ByteCounter, session: str = "") -> dict[str, Any]:
    total = counter.total()
    return {
        "peer_id": peer_id,
        "session": session,  # this process's (peer/node/local_state.py): another live one of our key is refused
        "round": snapshot.round,
        "param_hash": snapshot.param_hash,
        "state": snapshot.state,
        "step": snapshot.step,
        "loss": snapshot.loss,
        "bytes_sent": total.sent,
        "bytes_received": total.received,
        "round_bytes": dict(snapshot.round_bytes),
        "utilization": round(snapshot.utilization(time.monotonic()), 4),
        "left_out": list(snapshot.left_out[-16:]),
        "timestamp": time.time(),
    }


class Heartbeat:
    def __init__(self, *, client: CoordinatorPort, identity: Identity, counter: ByteCounter,
                 snapshot: Callable[[], NodeSnapshot], announce: Callable[[], None], rejoin: Callable[[], None],
                 stop: threading.Event, session: str = "", keepalive_s: float = EVERY_S) -> None:
        self.client = client
        self.keepalive_s = max(EVERY_S, keepalive_s)  # a beat with no news at least this often
        self.told: tuple[Any, ...] | None = None  # the news the last beat that landed carried
        self.beaten = -float("inf")  # time.monotonic() of the last beat sent
        self.identity = identity
        self.session = session
        self.told_unreachable = False  # NotReachable posted, and the coordinator still says it
        self.counter = counter
        self.snapshot = snapshot
        self.announce = announce
        self.rejoin = rejoin
        self.stop = stop
        self.now = threading.Event()  # set: beat at once (a round ended)
        self.events: queue.SimpleQueue[HeartbeatEvent] = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.announcer: threading.Thread | None = None  # the DHT record's refresh in flight, at most one

    def start(self) -> None:
        self.thread = threading.Thread(target=self.loop, name="swarmloco-heartbeat", daemon=True)
        self.thread.start()

    def join(self, timeout: float = 15.0) -> None:
        self.now.set()
        if self.thread is not None:
            self.thread.join(timeout=timeout)

    def drain(self) -> list[HeartbeatEvent]:
        """The events since the last drain, oldest first (the node's thread calls this)."""
        events = []
        while True:
            try:
                events.append(self.events.get_nowait())
            except queue.Empty:
                return events

    def beat(self) -> swarm_pb2.HeartbeatReply | None:
        """One signed heartbeat; the reply (its ban / end of run also posted as events), or None
        when it did not land (the next one retries)."""
        body = heartbeat_body(self.identity.peer_id, self.snapshot(), self.counter, self.session)
        try:
            reply = self.client.heartbeat(sign_body(self.identity, HEARTBEAT_TAG, body))
        except Refused as exc:
            if exc.refusal == swarm_pb2.UNKNOWN_PEER:  # a restarted coordinator that lost us: rejoin
                try:
                    self.rejoin()
                except NotAdmitted as join_exc:
                    if join_exc.refusal == swarm_pb2.BANNED:
                        self.events.put(Banned(join_exc.reason or "banned"))
                    elif join_exc.refusal in STOPS:
                        self.events.put(MustStop(str(join_exc)))
                    log.info("rejoin after heartbeat refused: %s", join_exc)
                except Exception as join_exc:  # noqa: BLE001 - the main loop sees a refusal on its next commit
                    log.info("rejoin after heartbeat failed: %s", join_exc)
            elif exc.refusal == swarm_pb2.BANNED:
                self.events.put(Banned(exc.reason or "banned"))
            elif exc.refusal == swarm_pb2.DUPLICATE_SESSION:  # another process of our key took over
                self.events.put(MustStop(exc.reason))
            else:
                log.info("heartbeat refused: %s", exc)
            return None
        except grpc.RpcError as exc:  # transient: the main loop has its own retries
            log.debug("heartbeat failed: %s", exc)
            return None
        except Exception as exc:  # noqa: BLE001
            log.debug("heartbeat failed: %s", exc)
            return None
        if reply.banned:
            self.events.put(Banned(reply.reason or "banned"))
        if reply.finished:
            self.events.put(RunFinished())
        if reply.unreachable and not self.told_unreachable:
            self.events.put(NotReachable(reply.unreachable))
        self.told_unreachable = bool(reply.unreachable)
        return reply

    def loop(self) -> None:
        announced = time.monotonic()  # node.connect() wrote the first record
        while not self.stop.is_set():
            forced = self.now.wait(EVERY_S)
            self.now.clear()
            if self.stop.is_set():
                break
            if time.monotonic() - announced > RECORD_TTL_S / 3 and not self.announcing():
                announced = time.monotonic()
                self.announcer = threading.Thread(target=self._announce, name="swarmloco-announce", daemon=True)
                self.announcer.start()
            news = self.snapshot().news()
            if self.due(news, forced=forced, now=time.monotonic()):
                self.beaten = time.monotonic()
                if self.beat() is not None:
                    self.told = news

    def announcing(self) -> bool:
        """Whether a refresh of our DHT record is still in flight."""
        return self.announcer is not None and self.announcer.is_alive()

    def _announce(self) -> None:
        # On its own thread: a DHT store waits on every replica it writes to, seconds each for one
        # that became unreachable (a partitioned peer's node), and beats must not wait with it: a
        # peer silent for peer_timeout_s is marked gone by the coordinator although it is working.
        try:
            self.announce()
        except Exception as exc:  # noqa: BLE001 - the next refresh retries; the gRPC path works without it
            log.info("refreshing the DHT record failed: %s", exc)

    def due(self, news: tuple[Any, ...], *, forced: bool, now: float) -> bool:
        """Whether the loop beats now: told to, news since the last beat that landed, or keepalive_s
        without a beat."""
        return forced or news != self.told or now - self.beaten >= self.keepalive_s
