"""Running a coordinator process: DHT node, gRPC server, round clock, DHT announcements."""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from peer.run.config import RunConfig
from peer.coordinator.operations import OperationsOptions, start_operations
from peer.coordinator import standby
from peer.coordinator.continuation import TAKEOVER_GRACE_S, continue_round
from peer.coordinator.lease import Demoted, Halted, Lease, dht_rpc_wait_s
from peer.coordinator.state import Coordinator, with_coordinator_key
from peer.coordinator.server import build_coordinator_server
from peer.run import faults
from peer.run.progress import coordinator_line, format_bytes
from peer.run.timeouts import JoinTimeouts
from protocol import discovery, ports
from protocol.backoff import retry
from protocol.accounting import ByteCounter
from protocol.identity import Identity
from protocol.lifetime import timed_step
from protocol.run_state import TermFence

log = logging.getLogger("swarmloco.coordinator")
JOIN_LOOKUP_S = 15.0  # a coordinator joining an existing DHT looks this long for the run's live active record


@dataclass(kw_only=True, slots=True)
class CoordinatorOptions:
    config: RunConfig
    host: str = "0.0.0.0"
    port: int = 31338
    announce_host: str = "127.0.0.1"
    host_maddrs: list[str] = field(default_factory=lambda: ["/ip4/0.0.0.0/tcp/31337"])
    announce_maddrs: list[str] = field(default_factory=list)
    identity_path: str | None = None
    checkpoint_path: str | None = None
    summary_json: str | None = None
    use_dht: bool = True
    initial_peers: list[str] = field(default_factory=list)  # DHT multiaddrs of the run (a standby's way in)
    standby: bool = False  # follow the active coordinator; take over when its lease lapses
    coordinator_key: str | None = None  # a standby's pin on the active coordinator's key
    linger_s: float = 1.0  # after every peer holds the final state: serve a little longer (status callers)
    operations: OperationsOptions | None = None  # metrics, dashboard, run log (peer/coordinator/operations.py)


def _run_is_held(dht, cfg: RunConfig, options: CoordinatorOptions, stop: threading.Event) -> bool:
    """A coordinator that joins an existing DHT (it came back after a takeover) follows when the run
    has a live active coordinator: records take a moment to arrive after the DHT bootstraps."""
    lookup_s = max(3 * cfg.control.lease_s, JOIN_LOOKUP_S) if options.initial_peers else 0.0
    if lookup_s:  # said, so that the wait is not silence: it is what keeps two actives from forking the run
        print(f"coordinator | looking in the DHT for a live active coordinator of run {cfg.run_id} (up to {lookup_s:.0f} s): "
              f"if one answers this one follows it as a standby, else it starts the run", flush=True)
    deadline = time.monotonic() + lookup_s
    while True:
        active, _, finished = standby.live_active(dht, cfg.run_id, options.coordinator_key)
        if active is not None or finished is not None:  # a finished run is not started again either
            return True
        if time.monotonic() >= deadline or stop.wait(0.5):
            return False


def _follow(options: CoordinatorOptions, identity: Identity, dht, stop: threading.Event, fence: TermFence) -> standby.Takeover | None:
    # Default: beside the identity file (the coordinator's own state folder), else the working folder.
    folder = Path(options.identity_path).parent if options.identity_path else Path(".")
    path = Path(options.checkpoint_path or folder / f"standby-{identity.peer_id[:16]}.ckpt")
    options.checkpoint_path = str(path)
    endpoint = f"{options.announce_host}:{options.port}" if options.port else ""  # where it will answer once it takes over
    print(f"coordinator {identity.peer_id[:8]} | standby for run {options.config.run_id}: following the active coordinator; "
          f"fingerprint {identity.peer_id}", flush=True)
    for maddr in discovery.visible_maddrs(dht):
        print(f"  --initial-peers {maddr}", flush=True)
    return standby.follow(dht=dht, identity=identity, run_id=options.config.run_id, checkpoint_path=path, endpoint=endpoint,
                          pinned=options.coordinator_key, stop=stop, fence=fence)


@dataclass(slots=True)
class Led:
    """How a spell as the active coordinator ended: its summary, and the rival it stepped down for."""

    summary: dict
    demoted: Demoted | None = None


def _lease(cfg: RunConfig, dht, identity: Identity, term: int, endpoint: str) -> Lease:
    """The active's lease (peer/coordinator/lease.py), its coordinator bound later (`_bind`)."""
    cfg = with_coordinator_key(cfg, identity.peer_id)
    return Lease(dht, identity, run_id=cfg.run_id, term=term, endpoint=endpoint, coordinators=tuple(cfg.control.coordinators),
                 floor_s=cfg.control.lease_s)


def _bind(lease: Lease, coordinator: Coordinator) -> Lease:
    """Every read of the run's records refreshes the standby endpoints peers fail over to (the DHT's
    standby records and the standbys heard from); a renewal after a lapse revives the followers."""
    c = coordinator

    def on_records(records: list[discovery.RunRecord]) -> None:
        endpoints = {r.endpoint for r in records if r.role == "standby" and r.endpoint} | set(c.followers.endpoints())
        with c.lock:
            c.standby_endpoints = sorted(endpoints)

    lease.on_records, lease.on_lapse = on_records, c.followers.revive
    return lease


def _early_renewal(options: CoordinatorOptions, dht, identity: Identity, cfg: RunConfig, term: int) -> tuple[Lease, threading.Thread] | None:
    """A takeover onto a known port: the new active's first renewal is sent while its coordinator is
    built from the checkpoint (the 20-round chaos run measured 0.36 s for the build, then 0.14 s for
    the renewal, one after the other). Nothing is signed before it is confirmed (Lease.start waits)."""
    if dht is None or not term or not options.port:
        return None
    lease = _lease(cfg, dht, identity, term, f"{options.announce_host}:{options.port}")
    first = threading.Thread(target=lease.renew, name="swarmloco-lease-first", daemon=True)
    first.start()
    return lease, first


def _start_dht(options: CoordinatorOptions, identity: Identity):
    """The coordinator's DHT node, started first (hivemind forks its worker; gRPC is not fork-safe).
    A standby, or a coordinator that comes back, joins through --initial-peers: that bootstrap is
    retried with jittered backoff for a join's default window (peer/run/timeouts.JoinTimeouts), as a
    peer's is, since a loaded swarm's DHT nodes may answer its first pings late. A new run's first
    coordinator asks nobody."""
    def start(timeout_s: float = 15.0):
        return discovery.start_dht(identity, initial_peers=options.initial_peers, host_maddrs=options.host_maddrs,
                                   announce_maddrs=options.announce_maddrs, timeout_s=timeout_s,
                                   rpc_wait_s=dht_rpc_wait_s(options.config.control.lease_s))

    if not options.initial_peers:
        return start()
    limits = JoinTimeouts()
    return retry("an initial DHT peer to answer", lambda left: start(max(1.0, min(limits.attempt.total_seconds(), left))),
                 backoff=limits.backoff(), retryable=(discovery.BootstrapUnanswered,),
                 say=lambda line: print(f"coordinator {identity.peer_id[:8]} | {line}", flush=True))


def run_coordinator(options: CoordinatorOptions, stop: threading.Event | None = None) -> dict:
    faults.check_environment()  # a bad SWARMLOCO_FAIL_AT fails here, before anything starts
    stop = stop or threading.Event()
    cfg = options.config
    identity = Identity.load_or_create(options.identity_path) if options.identity_path else Identity.generate()
    ports.check_grpc_port(options.host, options.port)  # before the DHT starts (a standby binds it only to take over)
    dht = None
    if options.use_dht:
        dht = _start_dht(options, identity)
    counter = ByteCounter(identity.peer_id)
    fence = TermFence()  # the highest term seen: a demoted coordinator follows no lower one
    summary: dict = {"role": "standby", "took_over": False}
    try:
        if stop.is_set():  # stopped while the DHT started
            return {"role": "standby" if options.standby else "active", "stopped": True}
        following = dht is not None and (options.standby or _run_is_held(dht, cfg, options, stop))
        term, lapsed_lease_s, in_flight = 0, 0.0, None
        while True:
            if following:
                takeover = _follow(options, identity, dht, stop, fence)
                if takeover is None:
                    break
                cfg, term, lapsed_lease_s, in_flight = takeover.cfg, takeover.term, takeover.lapsed_lease_s, takeover.in_flight
            led = _lead(options, identity, dht, cfg, term, counter, stop, lapsed_lease_s=lapsed_lease_s, in_flight=in_flight)
            summary = led.summary
            if led.demoted is None:
                break
            # A rival holds the run: step down and follow it (a takeover later takes a higher term still).
            rival = led.demoted.rival
            fence.observe(rival.term, rival.coordinator_id)
            print(f"coordinator {identity.peer_id[:8]} | {led.demoted}: stepping down at round {summary['round']}; "
                  f"following it as a standby", flush=True)
            summary = {**summary, "role": "standby", "demoted": {"round": summary["round"], "term": summary["coordinator"]["term"],
                                                                 "rival": rival.coordinator_id, "rival_term": rival.term}}
            following = True
        if options.summary_json and "history" in summary:
            Path(options.summary_json).write_text(json.dumps(summary, indent=2))
        return summary
    finally:
        if dht is not None:
            with timed_step(log, "DHT process and p2pd"):
                discovery.stop_dht(dht)


def _lead(options: CoordinatorOptions, identity: Identity, dht, cfg: RunConfig, term: int, counter: ByteCounter,
          stop: threading.Event, *, lapsed_lease_s: float = 0.0, in_flight: standby.InFlight | None = None) -> Led:
    """Run the rounds as the active coordinator until the run ends, the process stops, or a rival
    holds the run (then the summary says so and the caller follows it). `lapsed_lease_s`: after a
    takeover, the lease the previous active announced (its takeover line says it: a failover costs
    at least that); `in_flight`: the round in flight as the standby followed it (continued, not
    reopened, when it can be: peer/coordinator/continuation.py)."""
    server = operations = lease = None
    demoted: Demoted | None = None
    early = _early_renewal(options, dht, identity, cfg, term)
    coordinator = Coordinator(cfg, identity, checkpoint_path=options.checkpoint_path, counter=counter, term=term,
                              restore_grace_s=TAKEOVER_GRACE_S if term else None)
    coordinator.halted = stop.is_set
    try:
        server = build_coordinator_server(
            coordinator, host=options.host, port=options.port, announce_host=options.announce_host
        ).server
        options.port = int(coordinator.endpoint.rsplit(":", 1)[1])  # kept: after a demotion, the standby answers here
        if dht is not None:
            coordinator.initial_peers = discovery.visible_maddrs(dht)
            first = None
            if early is not None and (early[0].endpoint, early[0].term) == (coordinator.endpoint, coordinator.term):
                lease, first = early
            else:
                lease = _lease(cfg, dht, identity, coordinator.term, coordinator.endpoint)
            lease = coordinator.lease = _bind(lease, coordinator)
            lease.start(first)  # one renewal confirmed (or not) before anything is signed under our name
        coordinator.sign_state()  # again, now that it names our endpoint
        # Before serving: a peer that moves to us finds the round in flight's manifest here at once.
        not_continued = continue_round(coordinator, in_flight.manifest, in_flight.results, final=in_flight.final) \
            if in_flight is not None else ""
        server.start()
        if term:
            print(f"coordinator {identity.peer_id[:8]} | took over run {cfg.run_id} with term {term} at round {coordinator.round} "
                  f"(param hash {coordinator.param_hash[:16]}; the lapsed lease was {lapsed_lease_s:.1f}s)", flush=True)
            if in_flight is None:
                print(f"coordinator {identity.peer_id[:8]} | round {coordinator.round} reopened: no manifest of it was followed", flush=True)
            elif not_continued:
                print(f"coordinator {identity.peer_id[:8]} | round {coordinator.round} reopened: the followed manifest cannot be "
                      f"continued ({not_continued})", flush=True)
            else:
                print(f"coordinator {identity.peer_id[:8]} | round {coordinator.round} continued: the manifest the previous active "
                      f"signed ({in_flight.updates} updates, {len(in_flight.results)} owners' results followed"
                      f"{', final' if in_flight.final and in_flight.results else ''}) signed again in term {term}", flush=True)
        print(f"coordinator {identity.peer_id[:8]} | run {cfg.run_id} | {coordinator.numel:,} params | codec {cfg.compression.codec} | "
              f"outer {cfg.outer.name} | aggregator {cfg.aggregation.name} | round {coordinator.round}/{cfg.rounds.rounds} | "
              f"initial val loss {coordinator.initial_val_loss:.4f}", flush=True)
        print(f"coordinator gRPC: {coordinator.endpoint}   (peers: swarmloco peer --coordinator {coordinator.endpoint} "
              f"--coordinator-key {identity.peer_id})", flush=True)
        print(f"coordinator fingerprint: {identity.peer_id}", flush=True)
        for maddr in coordinator.initial_peers:
            print(f"  --initial-peers {maddr}", flush=True)
        operations = start_operations(coordinator, options.operations)

        finished_at = None
        while not stop.is_set():
            try:
                result = coordinator.tick()
                if lease is not None:
                    lease.holds()  # raises Demoted once a rival holds the run, whether or not a round was due
            except Demoted as exc:
                demoted = exc
                break
            except Halted:
                break
            if result is not None:
                print(coordinator_line(result, cfg.rounds.rounds, counter.total()), flush=True)
            if coordinator.finished:
                # The last state is served until every peer holds it (or the grace period ends):
                # a slow peer's last fetch must not find the coordinator gone.
                finished_at = finished_at or time.monotonic()
                waited = time.monotonic() - finished_at
                if (coordinator.final_state_delivered() and waited > options.linger_s) or waited > cfg.control.end_grace_s:
                    break
            coordinator.wait_for_change(0.1)
        if lease is not None and coordinator.finished and demoted is None:
            lease.close_run(coordinator.endpoint)  # standbys stop following; newcomers learn the run is over
        summary = coordinator.status()
        if coordinator.finished:
            print(f"coordinator | run finished: val loss {summary['initial_val_loss']:.4f} -> "
                  f"{summary['history'][-1]['val_loss'] if summary['history'] else float('nan'):.4f} | "
                  f"coordinator traffic {format_bytes(counter.total().sent + counter.total().received)}", flush=True)
        return Led(summary=summary, demoted=demoted)
    finally:
        if lease is not None:
            with timed_step(log, "lease thread"):
                lease.stop()
        if operations is not None:
            with timed_step(log, "operations (metrics, dashboard, run log)"):
                operations.close()
        if server is not None:
            with timed_step(log, "gRPC server"):
                server.stop(grace=1.0).wait(3.0)
        coordinator.exchange.close()  # a demoted one lives on as a standby: its mode's threads go now
        coordinator.fetchers.shutdown(wait=False, cancel_futures=True)
        coordinator.channels.close()
