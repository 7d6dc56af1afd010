"""Which coordinator a peer believes: pinned keys, the signed run config, and the active one after a failover.

Order of trust at start-up (docs/threat-model.md):
  1. the key the peer pins: `--coordinator-key`, else the DHT-signed run record it found the run by,
     else nothing (trust on first use, said loudly with the fingerprint to pin next time);
  2. the run state that endpoint serves must be signed by that key, and the run config it serves
     must be the one that signed state names (config hash);
  3. from then on the run's own list of coordinator keys (`[control] coordinators`, inside that
     config) is all the peer accepts manifests, states and checkpoints from;
  4. and among those keys, only the one that holds the run by the one rule (highest term, then
     lowest key): whatever a superseded coordinator signs (a lower term than any this peer has
     seen in a reply, a manifest, a probe) is refused, and the peer moves to the run's active
     coordinator (RunAuthority.fence, protocol.run_state.TermFence).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Iterable, TypeVar

import grpc

from peer.node.coordinator_client import CoordinatorClient
from peer.node.errors import PeerExit
from peer.run.timeouts import JoinTimeouts, PeerTimeouts
from peer.run.config import ConfigError, RunConfig
from protocol import discovery
from protocol.accounting import ByteCounter
from protocol.backoff import retry
from protocol.channels import EndpointUnreachable, create_channel
from protocol.envelope import EnvelopeError
from protocol.run_state import CoordinatorKeys, ImpersonationError, RunState, TermFence, newer, open_run_state
from protocol.wire import swarm_pb2, swarm_pb2_grpc

log = logging.getLogger("swarmloco.peer")
PROBE_DEADLINE = timedelta(seconds=3)
DHT_LOCATE_EVERY_S = 0.5  # while a peer looks for a successor: the DHT's run records are read this often at most
MAX_PROBES = 8  # candidate coordinators probed at once
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class TrustedRun:
    cfg: RunConfig
    keys: CoordinatorKeys  # the run's coordinator keys: all a peer accepts signatures from
    state: RunState  # the signed state the peer started from


def trust_run(info: swarm_pb2.RunInfo, *, pinned: str | None, pinned_by: str, endpoint: str, run_id: str | None) -> TrustedRun:
    """Check what a coordinator endpoint serves against the pinned key; PeerExit says what is wrong."""
    if not info.HasField("run_state"):
        raise PeerExit(f"the coordinator at {endpoint} serves no signed run state (an older swarmloco?): upgrade it, or check the address")
    try:
        state = open_run_state(info.run_state, keys=CoordinatorKeys.of([pinned]) if pinned else None, run_id=run_id)
    except ImpersonationError as exc:
        raise PeerExit(
            f"the coordinator at {endpoint} is not the run's coordinator: {exc}. The key was pinned from {pinned_by}; "
            "check the address (DNS, proxy, a stale --coordinator) or the fingerprint") from None
    except EnvelopeError as exc:
        raise PeerExit(f"the coordinator at {endpoint} serves a run state that does not verify: {exc}") from None
    if pinned is None:
        print(f"WARNING: trusting coordinator key {state.signer} on first use (no --coordinator-key, no DHT record). "
              f"Pin it next time: --coordinator-key {state.signer}", flush=True)
    try:
        cfg = RunConfig.from_json(info.config_json)
    except (ConfigError, ValueError) as exc:
        raise PeerExit(f"the coordinator at {endpoint} serves a run config this peer cannot use: {exc}") from None
    if cfg.config_hash() != state.config_hash:
        raise PeerExit(f"the coordinator at {endpoint} serves a run config that its signed state does not cover: refusing it")
    keys = CoordinatorKeys.of(cfg.control.coordinators)
    if not keys.matches(state.signer):
        raise PeerExit(f"the coordinator at {endpoint} signs with key {state.signer[:16]}…, which its own run config does not list")
    return TrustedRun(cfg=cfg, keys=keys, state=state)


def probe(endpoint: str, keys: CoordinatorKeys, run_id: str, counter: ByteCounter) -> RunState | None:
    """The signed state a candidate coordinator serves, if it answers and is one of the run's keys."""
    channel = create_channel(endpoint, counter)
    try:
        info = swarm_pb2_grpc.CoordinatorStub(channel).GetRunInfo(swarm_pb2.RunInfoRequest(), timeout=PROBE_DEADLINE.total_seconds())
        return open_run_state(info.run_state, keys=keys, run_id=run_id) if info.HasField("run_state") else None
    except (grpc.RpcError, EnvelopeError) as exc:
        log.debug("coordinator candidate %s: %s", endpoint, exc)
        return None
    finally:
        channel.close()


def find_active(candidates: Iterable[str], keys: CoordinatorKeys, run_id: str, counter: ByteCounter) -> tuple[str, RunState] | None:
    """Among candidate endpoints, the active coordinator by the one rule every peer follows
    (protocol.run_state.newer: highest term, then lowest key)."""
    endpoints = list(dict.fromkeys(candidates))
    if len(endpoints) > 1:  # at once: a dead candidate (no answer for PROBE_DEADLINE) must not hold up the others
        with ThreadPoolExecutor(max_workers=min(MAX_PROBES, len(endpoints)), thread_name_prefix="swarmloco-probe") as pool:
            states = list(pool.map(lambda endpoint: probe(endpoint, keys, run_id, counter), endpoints))
    else:
        states = [probe(endpoint, keys, run_id, counter) for endpoint in endpoints]
    best: tuple[str, RunState] | None = None
    for endpoint, state in zip(endpoints, states):
        if state is not None and state.role == "active" and (best is None or newer(state, best[1])):
            best = (endpoint, state)
    return best


@dataclass(slots=True)
class RunAuthority:
    """The run's coordinators as this peer believes them: the keys it accepts, where they may
    answer (failover), and their signed word on the run state."""

    keys: CoordinatorKeys
    run_id: str
    client: Any  # CoordinatorClient: its locate() is this object's locate
    counter: ByteCounter
    endpoints: list[str]  # the run's other coordinators (standbys), as the run last named them
    dht: Any = None
    fence: TermFence = field(default_factory=TermFence)  # the highest term seen: nothing signed in a lower one is believed
    dht_endpoints: list[str] = field(default_factory=list)  # the run's coordinators in the DHT, as last read
    dht_read_at: float = float("-inf")
    finished_by: discovery.RunRecord | None = None  # a "finished" record of one of the run's keys, as last read

    def locate(self) -> str | None:
        """The run's active coordinator now (after a failover: the standby that took over), among
        the run's records in the DHT (read at most every DHT_LOCATE_EVERY_S; the last read's in
        between) and the coordinator endpoints the run last named; never one that a higher term
        than it signs has superseded."""
        if self.dht is not None and time.monotonic() - self.dht_read_at >= DHT_LOCATE_EVERY_S:
            self.dht_read_at = time.monotonic()
            try:
                records = discovery.run_records(self.dht, self.run_id)
                self.dht_endpoints = [r.endpoint for r in records]
                self.finished_by = next((r for r in records if r.role == "finished" and self.keys.matches(r.coordinator_id)), None)
            except Exception as exc:  # a DHT hiccup: the known endpoints still count
                log.info("DHT lookup of the run's coordinators failed: %s", exc)
        candidates = [*self.dht_endpoints, *self.endpoints]
        found = find_active([c for c in candidates if c], self.keys, self.run_id, self.counter)
        if found is None or not self.fence.observe(found[1].term, found[1].signer):
            return None
        return found[0]

    def run_over(self) -> str:
        """Why the run is over, when a coordinator of the run wrote its "finished" record in the DHT
        (as a join finds it: discovery.find_run) and none answers as active; else "". Asked by the
        client while its coordinator is unreachable, after `locate` read the DHT."""
        r = self.finished_by
        if r is None:
            return ""
        return (f"run {self.run_id} has finished (its coordinator {r.coordinator_id[:16]} said so in the DHT) while this "
                "peer could not reach it: nothing is left to train; `swarmloco runs` lists the runs you can join")

    def relocate(self) -> bool:
        """The coordinator we talk to was superseded: move to the run's active one (True: moved)."""
        relocate = getattr(self.client, "relocate", None)
        return bool(relocate()) if relocate is not None else False

    def state(self, round_: int | None = None, *, carried: swarm_pb2.Signed | None = None) -> RunState | None:
        """The coordinator's signed state (at the start of round_, or now), checked against the
        run's keys and the term fence; None when it no longer keeps that round's, or when it was
        superseded and no successor answers yet. `carried`: the signed state of round_ as another
        reply brought it (the sliced exchange's applied long-poll): believed on the same checks,
        and asked for only when it is absent or does not hold."""
        if carried is not None and carried.body:
            try:
                state = self._open_state(carried)
            except EnvelopeError as exc:
                log.info("the run state carried by a reply does not open (%s): asking for it", exc)
            else:
                if state.round == round_ and self.fence.observe(state.term, state.signer, carried):
                    return state
        for attempt in range(2):
            info = self.client.run_info(round_, state_only=True)
            if info.coordinator_endpoints:
                self.endpoints = list(info.coordinator_endpoints)
            if not info.HasField("run_state"):
                return None
            state = self._open_state(info.run_state)
            if self.fence.observe(state.term, state.signer, info.run_state):
                return state
            log.warning("the coordinator at %s signs term %d, superseded by term %d (%s): refusing its state",
                        self.client.endpoint, state.term, self.fence.term, self.fence.signer[:8])
            if attempt == 0 and not self.relocate():
                break
        return None

    def _open_state(self, signed: swarm_pb2.Signed) -> RunState:
        """A signed run state opened against the run's keys; one signed by another key ends the peer."""
        try:
            return open_run_state(signed, keys=self.keys, run_id=self.run_id)
        except ImpersonationError as exc:
            raise PeerExit(f"the coordinator at {self.client.endpoint} is not one of the run's: {exc}") from None

    def signed_hash(self, round_: int) -> str | None:
        """The hash of θ_round a run key signed (what a downloaded state must match), if still kept."""
        state = self.state(round_)
        return state.param_hash if state is not None and state.round == round_ else None


def find_coordinator(dht, *, coordinator: str | None, pinned: str | None, run_id: str | None,
                     steps: JoinSteps) -> tuple[str, str | None, str]:
    """(endpoint, pinned fingerprint, where the pin came from): --coordinator-key first, else the
    key that signed the run's DHT record (when the peer found the run in the DHT). The record is
    looked up again (backoff) while none is active: the coordinator may not be up yet, or its
    record lapsed for a moment between two renewals on an overloaded machine."""
    pinned_by = "--coordinator-key"
    if dht is not None:
        run = steps.retry("the run's coordinator record in the DHT",
                          lambda left: discovery.find_run(dht, run_id, timeout_s=0.0, pinned=pinned), (discovery.RunNotFound,),
                          advice="is the coordinator running, and do --initial-peers name a node of its swarm (the coordinator "
                                 "or any peer that joined it)? `swarmloco runs --initial-peers ...` lists the runs a DHT holds; "
                                 "--connect-timeout waits longer")
        coordinator = coordinator or run.endpoint
        if pinned is None:
            pinned, pinned_by = run.coordinator_id, "the DHT-signed run record"
        log.info("found run %s: coordinator %s at %s", run.run_id, run.coordinator_id[:8], run.endpoint)
    assert coordinator is not None  # PeerOptions requires --coordinator or --initial-peers
    return coordinator, pinned, pinned_by


@dataclass(slots=True)
class JoinedRun:
    """A run found and trusted: the coordinator client, the config and keys it is believed under."""

    dht: Any  # hivemind.DHT, or None when --coordinator was dialled directly
    client: CoordinatorClient
    trusted: TrustedRun
    authority: RunAuthority
    timeouts: PeerTimeouts

    @property
    def cfg(self) -> RunConfig:
        return self.trusted.cfg


@dataclass(frozen=True, slots=True)
class JoinSteps:
    """The steps of a join share one window (JoinTimeouts, from --connect-timeout): each is retried
    with jittered backoff until it succeeds or the window is spent (protocol/backoff.py)."""

    limits: JoinTimeouts
    deadline: float  # time.monotonic() at which the window ends
    say: Callable[[str], None]

    @classmethod
    def start(cls, limits: JoinTimeouts, short: str) -> "JoinSteps":
        return cls(limits, time.monotonic() + limits.window.total_seconds(), lambda line: print(f"peer {short} | {line}", flush=True))

    def attempt_s(self, left: float) -> float:
        """One attempt's bound: JoinTimeouts.attempt, within what is left (at least a second)."""
        return max(1.0, min(self.limits.attempt.total_seconds(), left))

    def retry(self, what: str, attempt: Callable[[float], T], retryable: tuple[type[BaseException], ...], *, advice: str = "") -> T:
        return retry(what, attempt, backoff=self.limits.backoff(), retryable=retryable, advice=advice, deadline=self.deadline,
                     say=self.say)


def _connect(endpoint: str, counter: ByteCounter, steps: JoinSteps, locate: Callable[[], str | None] = lambda: None) -> CoordinatorClient:
    """A client whose channel is up: a fresh channel per attempt (gRPC's own reconnect backoff
    grows to minutes, while a coordinator that is starting is up within seconds). Before each
    attempt after the first, `locate` may name where the run's active coordinator is now (the DHT's
    record: the one we found may have died, and a standby taken over, while we started)."""
    tries = 0

    def attempt(left: float) -> CoordinatorClient:
        nonlocal endpoint, tries
        tries += 1
        if tries > 1 and (found := locate()) and found != endpoint:
            log.warning("the run's active coordinator is now %s (was %s): connecting there", found, endpoint)
            endpoint = found
        client = CoordinatorClient(endpoint, counter, retry_for=timedelta(seconds=max(1.0, left)))
        try:
            client.wait_ready(timedelta(seconds=steps.attempt_s(left)))
        except BaseException:
            client.close()
            raise
        return client

    return steps.retry(f"the run's coordinator ({endpoint} first) to accept a connection", attempt, (EndpointUnreachable,),
                       advice="is the coordinator running, and is its port open to this machine?")


def active_record(dht, run_id: str | None, pinned: str | None) -> discovery.RunRecord | None:
    """The run's live active coordinator record in the DHT now, or None (none live, a DHT hiccup)."""
    try:
        return discovery.find_run(dht, run_id, timeout_s=0.0, pinned=pinned)
    except Exception as exc:  # no live record for a moment: keep the endpoint we have
        log.info("DHT lookup of the run's active coordinator failed: %s", exc)
        return None


def join_run(options: Any, identity: Any, counter: ByteCounter) -> JoinedRun:
    """Start the DHT (first: it forks a child, and gRPC is not fork-safe), find the run's
    coordinator, and trust what it serves only as far as the pinned key allows (PeerOptions).
    Every step is retried with backoff within --connect-timeout (JoinSteps)."""
    o = options
    steps = JoinSteps.start(JoinTimeouts.of(o.connect_timeout_s), identity.peer_id[:8])
    dht = None
    if o.initial_peers:
        dht = steps.retry("an initial DHT peer to answer",
                          lambda left: discovery.start_dht(identity, initial_peers=o.initial_peers, host_maddrs=o.host_maddrs,
                                                           announce_maddrs=o.announce_maddrs, client_mode=o.client_mode,
                                                           timeout_s=steps.attempt_s(left)),
                          (discovery.BootstrapUnanswered,))
    client = None
    try:
        endpoint, pinned, pinned_by = find_coordinator(dht, coordinator=o.coordinator, pinned=o.coordinator_key,
                                                       run_id=o.run_id, steps=steps)
        # Dialled directly (--coordinator): that address only. Found in the DHT: wherever the run's
        # active record is now (a standby may have taken over while we started); a key pinned from
        # the DHT's record is then the one a fresh join would pin now, a --coordinator-key stays.
        from_dht = dht is not None and not o.coordinator
        dht_pin = pinned_by != "--coordinator-key"
        found: dict[str, discovery.RunRecord] = {}

        def locate() -> str | None:
            record = active_record(dht, o.run_id, None if dht_pin else pinned) if from_dht else None
            if record is not None:
                found[record.endpoint] = record
            return record.endpoint if record is not None else None

        client = _connect(endpoint, counter, steps, locate)
        if client.endpoint != endpoint and dht_pin and client.endpoint in found:
            pinned = found[client.endpoint].coordinator_id
        info = client.run_info()
        trusted = trust_run(info, pinned=pinned, pinned_by=pinned_by, endpoint=client.endpoint, run_id=o.run_id)
    except BaseException:
        # Nothing is left running on the way out: the DHT's child process would keep this one alive.
        if client is not None:
            client.close()
        if dht is not None:
            dht.shutdown()
        raise
    timeouts = PeerTimeouts.of(trusted.cfg)  # reaching the run itself took --connect-timeout (before its config was known)
    client.retry_for = timeouts.coordinator_retry
    authority = RunAuthority(keys=trusted.keys, run_id=trusted.cfg.run_id, client=client, counter=counter,
                             endpoints=list(info.coordinator_endpoints), dht=dht)
    authority.fence.observe(trusted.state.term, trusted.state.signer, info.run_state)
    client.locate = authority.locate  # failover: the run's active coordinator, wherever it is now
    client.run_over = authority.run_over  # and no retry for a run that finished meanwhile
    return JoinedRun(dht=dht, client=client, trusted=trusted, authority=authority, timeouts=timeouts)
