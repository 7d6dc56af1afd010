"""A standby coordinator: follows the active one, takes over when its lease lapses.

The active coordinator's DHT run record is its lease (peer/coordinator/lease.py). A standby, whose
key the run lists in `[control] coordinators`, follows the active one round by round: it waits on
the round in flight (a GetManifest long-poll) and keeps its signed manifest, then (sliced exchange)
the owners' signed result batches once the active says they are final, downloads each new round's
checkpoint as soon as the active has written it (accepted only against the state the active
signed), and heartbeats the active with the round it holds (and the manifest it follows). The active records a round only once every standby it counts
holds its result (peer/coordinator/followers.py), so the state a standby holds is never older than
the last round the active recorded. When no live active record is left, it takes over with term =
the highest term seen + 1, from that state, keeping the run's history and initial loss (they are in
the checkpoint): the swarm continues from the last recorded round, and peers move to it without a
restart (peer/node/trust.py: highest term wins). When it holds the signed manifest of the round in
flight (based on the state it holds), it continues that round instead of reopening it: the same
manifest signed again in its term (Coordinator.continue_round), so the peers' commitments and the
owners' signed results stand, and nobody commits, trains or waits for a commit phase again.

No call to the active outlasts the lapse of its record as last read (`Following.call_s`): a frozen
or cut-off active would hold a call its whole deadline (up to 5 s), and the standby reads the DHT,
to take over, only between calls.

It takes over only while its *grant* holds: the active counted it in the reply to a heartbeat sent
less than (GRACE_LEASES − MARGIN) leases ago. Past that, the active may have recorded rounds
without it (it drops a standby that stays silent or behind), so it says why it will not take over
and keeps waiting for an active coordinator instead of forking the run's history.

A coordinator started without --standby follows too when the run already has a live active
coordinator (it came back after a takeover), and so does an active one that was demoted (a rival
with a higher term holds the run): two actives in one run are never started on purpose.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc

from peer.coordinator.followers import GRACE_LEASES, HEARTBEAT_S
from peer.coordinator.lease import MARGIN
from peer.exchange.modes import MODES
from peer.learn.model import param_hash
from peer.node.coordinator_client import CoordinatorClient, CoordinatorUnavailable
from peer.node.errors import PeerExit
from peer.node.trust import trust_run
from peer.run import checkpoint
from peer.run.config import ConfigError, RunConfig
from protocol import discovery
from protocol.accounting import ByteCounter
from protocol.channels import create_channel
from protocol.envelope import EnvelopeError, HEARTBEAT_TAG, open_manifest
from protocol.identity import Identity
from protocol.run_state import RunState, TermFence
from protocol.signing import sign_body
from protocol.state_manifest import open_state_manifest
from protocol.wire import swarm_pb2, swarm_pb2_grpc

log = logging.getLogger("swarmloco.coordinator")
POLL_S = 0.5  # DHT lookups of the run's records; waits while the active does not answer
STATE_POLL_S = 0.1  # while the active writes the checkpoint of a state it signed
MANIFEST_WAIT_S = 1.0  # long-poll on the round in flight
CALL_LEASES = 0.5  # deadline of one call to the active, in leases (1-5 s): a frozen one must not hold the standby past its grant
MAX_CHECKPOINT_MANIFEST_BYTES = 1 << 40  # the state manifest is read for its round only


MIN_CALL_S = 0.2  # a call to the active near its record's lapse still gets this long
MIN_WAIT_S = 0.1  # and a long-poll this long


def call_s(lease_s: float) -> float:
    return min(5.0, max(1.0, CALL_LEASES * lease_s))


class StandbyError(RuntimeError):
    """A standby that cannot follow this run; the message says what to change."""


@dataclass(slots=True)
class InFlight:
    """The round in flight as the standby followed it: the active's signed manifest (checked: a run
    key, the active's term, based on the state the standby holds) and, once the active said they
    were final, the owners' signed result batches."""

    round: int
    manifest: swarm_pb2.Signed
    updates: int  # the manifest's entries
    results: list[swarm_pb2.Signed] = field(default_factory=list)
    final: bool = False  # the results are the active's final ones (or the round moved on without them)


@dataclass(slots=True)
class Takeover:
    cfg: RunConfig  # the run's config, as the active coordinator signed it
    term: int  # the term this coordinator takes over with
    round: int  # the recorded round's state it holds
    lapsed_lease_s: float = 0.0  # the lease the active's last record announced (the one that lapsed)
    in_flight: InFlight | None = None  # round `round`'s manifest (and results), when followed: continued, not reopened


@dataclass(slots=True)
class Grant:
    """The standby's right to take over: the active counted it in its reply to the heartbeat sent
    at `sent` (monotonic), under a lease of at most `lease_s` (the active's only grows)."""

    sent: float | None = None
    lease_s: float = 0.0

    def valid(self, now: float) -> bool:
        return self.sent is not None and now - self.sent < (GRACE_LEASES - MARGIN) * self.lease_s

    def age(self, now: float) -> float | None:
        return None if self.sent is None else now - self.sent


def live_active(dht, run_id: str, pinned: str | None) -> tuple[discovery.RunRecord | None, int, discovery.RunRecord | None]:
    """The run's live active record (the one rule: highest term, then lowest key), the highest term
    seen, and the record of a coordinator that finished the run (role "finished"), if any."""
    records = discovery.vouched(discovery.run_records(dht, run_id), pinned)
    top_term = max((r.term for r in records), default=0)
    active = sorted((r for r in records if r.role == "active"), key=lambda r: (-r.term, r.coordinator_id))
    finished = [r for r in records if r.role == "finished"]
    return (active[0] if active else None), top_term, (finished[0] if finished else None)


class _Download:
    """One checkpoint download on a thread of its own: a frozen active must not hold the follow loop
    (its DHT checks, its takeover) for a whole transfer deadline. An abandoned one writes nothing."""

    def __init__(self, endpoint: str, counter: ByteCounter, state: RunState, retry_s: float) -> None:
        self.state = state
        self.result: tuple[bytes, Any] | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.client = CoordinatorClient(endpoint, counter, retry_for=timedelta(seconds=retry_s))
        threading.Thread(target=self._run, name="swarmloco-standby-fetch", daemon=True).start()

    def _run(self) -> None:
        try:
            data, _ = self.client.checkpoint()
            self.result = (data, checkpoint.from_bytes(data))
        except BaseException as exc:  # noqa: BLE001 - reported to the follow loop
            self.error = exc
        finally:
            self.client.close()
            self.done.set()


class Following:
    """The follow loop's state (one per follow() call)."""

    def __init__(self, *, dht, identity: Identity, run_id: str, checkpoint_path: Path, endpoint: str, pinned: str | None,
                 fence: TermFence) -> None:
        self.dht, self.identity, self.run_id = dht, identity, run_id
        self.checkpoint_path, self.endpoint, self.pinned, self.fence = checkpoint_path, endpoint, pinned, fence
        self.counter = ByteCounter(identity.peer_id)
        self.held: Takeover | None = None
        self.held_hash = ""
        self.grant = Grant()
        self.top_term = 0
        self.lease_s = 0.0  # the lease the active's record announces
        self.expires_at = 0.0  # when the active's record read last lapses (DHT time; 0: not known)
        self.channel: grpc.Channel | None = None
        self.stub: swarm_pb2_grpc.CoordinatorStub | None = None
        self.linked = ""  # the endpoint the channel goes to
        self.download: _Download | None = None
        self.closed_round = -1  # the round whose manifest was seen signed
        self.in_flight: InFlight | None = None  # the followed manifest of the round in flight
        self.beat_at = 0.0
        self.announced = 0.0
        self.printed = self.warned = False

    def lapse_in(self) -> float:
        """Seconds until the active's record read last can lapse (inf: not known)."""
        return self.expires_at - discovery.dht_time() if self.expires_at else float("inf")

    def call_s(self, lease_s: float) -> float:
        """A call's deadline: call_s(lease), cut at the record's lapse. A frozen or cut-off active
        would hold each call its whole deadline (up to 5 s), and the standby looks at the DHT, to
        take over, only between calls: then it would look seconds after the lapse."""
        return max(MIN_CALL_S, min(call_s(lease_s), self.lapse_in()))

    def wait_s(self) -> float:
        """A long-poll's wait, cut at the record's lapse like a call's deadline."""
        return max(MIN_WAIT_S, min(MANIFEST_WAIT_S, self.lapse_in()))

    def link(self, endpoint: str) -> swarm_pb2_grpc.CoordinatorStub:
        if self.linked != endpoint:
            self.close()
            self.channel, self.linked = create_channel(endpoint, self.counter), endpoint
            self.stub = swarm_pb2_grpc.CoordinatorStub(self.channel)
            self.closed_round = -1
        assert self.stub is not None
        return self.stub

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
        self.channel = self.stub = None
        self.linked = ""

    def beat(self, stub: swarm_pb2_grpc.CoordinatorStub, lease_s: float, *, leaving: bool = False) -> None:
        """Tell the active which round's state we hold; the reply says whether it counts us.
        `leaving`: the run is over and we go (the active's last record need not wait for us)."""
        held = self.held
        body = {"role": "standby", "run_id": self.run_id, "holding_round": held.round if held else -1,
                "holding_hash": self.held_hash, "endpoint": self.endpoint, "timestamp": time.time(), "leaving": leaving,
                "manifest_round": self.in_flight.round if self.in_flight is not None else -1}
        sent = time.monotonic()
        reply = stub.Heartbeat(sign_body(self.identity, HEARTBEAT_TAG, body), timeout=self.call_s(lease_s))
        self.beat_at = sent
        counted = reply.refusal == swarm_pb2.REFUSAL_UNSPECIFIED
        self.grant = Grant(sent=sent, lease_s=lease_s) if counted else Grant()
        if not counted:
            log.info("standby: not counted by the active yet (%s)", reply.reason)

    def collect(self, cfg: RunConfig) -> bool:
        """The finished download, if any, kept when it is the state the active signed for its round."""
        download = self.download
        if download is None or not download.done.is_set():
            return False
        self.download = None
        if download.error is not None:
            log.info("standby: checkpoint of round %d not fetched (%s)", download.state.round, download.error)
            return False
        data, ckpt = download.result  # type: ignore[misc]
        state = download.state
        if ckpt.config_hash != cfg.config_hash() or ckpt.round != state.round or ckpt.param_hash != state.param_hash \
                or param_hash(ckpt.params) != state.param_hash:
            log.info("standby: checkpoint (round %d) does not match the signed state of round %d yet", ckpt.round, state.round)
            return False
        checkpoint.write_atomic(self.checkpoint_path, data)
        self.held, self.held_hash = Takeover(cfg=cfg, term=0, round=state.round), state.param_hash
        log.info("standby: holding round %d (%s)", state.round, state.param_hash[:16])
        return True

    def follow_manifest(self, signed: swarm_pb2.Signed, state: RunState, keys) -> bool:
        """The active's signed manifest of the round in flight, kept when it is one to continue: a
        run key's, in the active's term, based on the state we hold. True when kept."""
        try:
            manifest = open_manifest(signed, keys=keys, run_id=self.run_id, round_=state.round)
        except EnvelopeError as exc:
            log.info("standby: the manifest of round %d does not verify (%s): not following it", state.round, exc)
            return False
        if manifest.term != state.term or manifest.base_param_hash != self.held_hash:
            log.info("standby: the manifest of round %d (term %d) is not based on the state we hold: not following it",
                     state.round, manifest.term)
            return False
        self.in_flight = InFlight(round=state.round, manifest=signed, updates=len(manifest.entries))
        log.info("standby: following round %d's manifest (%d updates)", state.round, len(manifest.entries))
        return True

    def in_flight_at(self, round_: int) -> InFlight | None:
        """The followed round, when it is the one a takeover from the state we hold would open."""
        held, flight = self.held, self.in_flight
        return flight if held is not None and flight is not None and flight.round == held.round == round_ else None


def follow(
    *, dht, identity: Identity, run_id: str, checkpoint_path: Path, endpoint: str, pinned: str | None,
    stop: threading.Event, wait_for_run_s: float = 60.0, fence: TermFence | None = None,
) -> Takeover | None:
    """Follow the run's active coordinator until its lease lapses; None when stopped or the run ended."""
    f = Following(dht=dht, identity=identity, run_id=run_id, checkpoint_path=checkpoint_path, endpoint=endpoint, pinned=pinned,
                 fence=fence or TermFence())
    started = time.monotonic()
    active: discovery.RunRecord | None = None
    looked = 0.0
    try:
        while not stop.is_set():
            now = time.monotonic()
            if active is None or now - looked >= POLL_S:
                active, seen, finished = live_active(dht, run_id, pinned)
                looked = now
                f.top_term = max(f.top_term, seen)
                if finished is not None:
                    print(f"standby {identity.peer_id[:8]} | run {run_id} finished (coordinator {finished.coordinator_id[:8]}, "
                          f"term {finished.term}): nothing to take over", flush=True)
                    return None
            if active is None or active.coordinator_id == identity.peer_id:
                if f.held is not None:
                    if f.grant.valid(time.monotonic()):
                        return Takeover(cfg=f.held.cfg, term=max(f.top_term, f.fence.term) + 1, round=f.held.round,
                                        lapsed_lease_s=f.lease_s, in_flight=f.in_flight_at(f.held.round))
                    if not f.warned:
                        age = f.grant.age(time.monotonic())
                        print(f"standby {identity.peer_id[:8]} | run {run_id} has no live active coordinator, but this standby "
                              f"was last counted by it {'never' if age is None else f'{age:.1f}s ago'}: it may lack rounds the "
                              "active recorded, so it does not take over (it waits for an active coordinator to follow)", flush=True)
                        f.warned = True
                elif time.monotonic() - started > wait_for_run_s:
                    raise StandbyError(f"no active coordinator of run {run_id!r} in the DHT after {wait_for_run_s:.0f}s, and no "
                                       "state to take over from: check --initial-peers and --run-id")
                stop.wait(POLL_S)
                continue
            lease_s = active.lease_s if 1.0 <= active.lease_s <= 600.0 else 2.0  # as the active announces it
            f.lease_s, f.expires_at = lease_s, active.expires_at
            try:
                done = _follow_once(f, active, lease_s, stop)
            except (grpc.RpcError, CoordinatorUnavailable, PeerExit, EnvelopeError) as exc:
                log.info("standby: the active coordinator does not answer (%s); waiting for its lease to lapse",
                         exc.details() if isinstance(exc, grpc.RpcError) else exc)
                looked = 0.0  # look at the DHT again at once
                stop.wait(STATE_POLL_S)
                continue
            if done:
                return None
        return None
    finally:
        f.close()


def _follow_once(f: Following, active: discovery.RunRecord, lease_s: float, stop: threading.Event) -> bool:
    """One step behind the active coordinator; True when the run is over."""
    stub = f.link(active.endpoint)
    info = stub.GetRunInfo(swarm_pb2.RunInfoRequest(), timeout=f.call_s(lease_s))
    trusted = trust_run(info, pinned=active.coordinator_id, pinned_by="the DHT-signed run record", endpoint=active.endpoint,
                        run_id=f.run_id)
    if not trusted.keys.matches(f.identity.peer_id):
        raise StandbyError(
            f"this coordinator's key {f.identity.peer_id} is not one of run {f.run_id!r}'s coordinators: the active "
            f"coordinator must list it (swarmloco coordinator --coordinators {f.identity.peer_id} ..., or [control] coordinators)")
    state, cfg = trusted.state, trusted.cfg
    if not f.fence.observe(state.term, state.signer, info.run_state):
        log.info("standby: %s signs term %d, superseded by term %d: not following it", state.signer[:8], state.term, f.fence.term)
        stop.wait(POLL_S)
        return False
    if state.finished:
        try:
            f.beat(stub, max(cfg.control.lease_s, lease_s), leaving=True)
        except grpc.RpcError as exc:  # it waits for us a grace at most
            log.info("standby: could not say we leave (%s)", exc.details())
        print(f"standby {f.identity.peer_id[:8]} | run {f.run_id} finished at round {state.round} "
              f"(final hash {state.param_hash[:16]}): nothing to take over", flush=True)
        return True
    lease_s = max(cfg.control.lease_s, lease_s)
    changed = f.collect(cfg)
    ready = -1  # the round of the checkpoint the active serves now (its signed state manifest says)
    if info.HasField("state_manifest"):
        ready = open_state_manifest(info.state_manifest, keys=trusted.keys, run_id=f.run_id,
                                    max_bytes=MAX_CHECKPOINT_MANIFEST_BYTES).round
    held_round = f.held.round if f.held is not None else -1
    if f.download is None and ready == state.round > held_round:
        f.download = _Download(active.endpoint, f.counter, state, retry_s=call_s(lease_s))
    if changed or time.monotonic() - f.beat_at >= HEARTBEAT_S:
        f.beat(stub, lease_s)
    # Our record's TTL is the run's lease floor, no longer: the DHT keeps, per key, the record that
    # expires last, so the active record we write when we take over (TTL >= the floor) replaces it.
    if f.held is not None and time.monotonic() - f.announced > cfg.control.lease_s / 3:
        discovery.announce_run(f.dht, f.identity, run_id=f.run_id, endpoint=f.endpoint, role="standby", term=state.term,
                               coordinators=cfg.control.coordinators, ttl_s=cfg.control.lease_s)
        f.announced = time.monotonic()
        if not f.printed:
            print(f"standby {f.identity.peer_id[:8]} | following run {f.run_id}'s active coordinator "
                  f"{active.coordinator_id[:8]} (term {state.term}) at {active.endpoint}; holding round {f.held.round}", flush=True)
            f.printed = True
    flight = f.in_flight_at(state.round)
    if f.held is not None and f.held.round >= state.round and f.closed_round < state.round and f.download is None:
        # Caught up: wait for the round in flight to close (the manifest), instead of polling.
        wait_s = f.wait_s()
        reply = stub.GetManifest(swarm_pb2.ManifestRequest(round=state.round, wait_s=wait_s), timeout=wait_s + f.call_s(lease_s))
        if reply.ready and f.follow_manifest(reply.manifest, state, trusted.keys):
            f.beat(stub, lease_s)  # at once: the active knows we could continue this round
        if reply.ready or reply.current_round > state.round:
            f.closed_round = state.round
    elif flight is not None and not flight.final and MODES[cfg.exchange.mode].coordinator.continues_in_flight:
        # Then its owners' signed results, once final: a takeover after that point gathers at once.
        wait_s = f.wait_s()
        reply = stub.GetSliceResults(swarm_pb2.SliceResultsRequest(round=state.round, wait_s=wait_s),
                                     timeout=wait_s + f.call_s(lease_s))
        if reply.ready:
            flight.results = list(reply.results)
        flight.final = reply.ready or reply.current_round > state.round or reply.finished
    elif f.download is not None:
        f.download.done.wait(POLL_S)  # collected (and acked) at once on the next step
    else:
        stop.wait(STATE_POLL_S)
    return False
