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
from peer.coordinator.state import Coordinator
from peer.coordinator.server import build_coordinator_server
from peer.run import faults
from peer.run.progress import coordinator_line, format_bytes
from protocol import discovery, ports
from protocol.accounting import ByteCounter
from protocol.identity import Identity

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


class Lease:
    """The active coordinator's DHT run record, renewed every third of control.lease_s; also reads
    the run's other records: standbys' endpoints (for peers' failover) and a successor."""

    def __init__(self, dht, identity: Identity, coordinator: Coordinator) -> None:
        self.dht, self.identity, self.coordinator = dht, identity, coordinator
        self.lease_s = coordinator.cfg.control.lease_s
        self.renewed = 0.0

    def due(self) -> bool:
        return time.monotonic() - self.renewed > self.lease_s / 3

    def close_run(self) -> None:
        c = self.coordinator
        discovery.announce_run(self.dht, self.identity, run_id=c.cfg.run_id, endpoint=c.endpoint, role="finished", term=c.term,
                               coordinators=c.cfg.control.coordinators, ttl_s=discovery.RECORD_TTL_S)

    def renew(self) -> discovery.RunRecord | None:
        """Renew; return the record of a coordinator that took the run over from us, if any."""
        c = self.coordinator
        self.renewed = time.monotonic()
        discovery.announce_run(self.dht, self.identity, run_id=c.cfg.run_id, endpoint=c.endpoint, role="active", term=c.term,
                               coordinators=c.cfg.control.coordinators, ttl_s=self.lease_s)
        try:
            records = discovery.vouched(discovery.run_records(self.dht, c.cfg.run_id))
        except Exception as exc:  # a DHT hiccup: renew again next time
            log.info("reading the run's records failed: %s", exc)
            return None
        with c.lock:
            c.standby_endpoints = sorted(r.endpoint for r in records if r.role == "standby" and r.endpoint)
        # The one rule (protocol.run_state.newer): a higher term, or the same term and a lower key.
        rivals = [r for r in records if r.role == "active" and r.coordinator_id != self.identity.peer_id
                  and (r.term > c.term or (r.term == c.term and r.coordinator_id < self.identity.peer_id))]
        return max(rivals, key=lambda r: r.term) if rivals else None


def _run_is_held(dht, cfg: RunConfig, options: CoordinatorOptions, stop: threading.Event) -> bool:
    """A coordinator that joins an existing DHT (it came back after a takeover) follows when the run
    has a live active coordinator: records take a moment to arrive after the DHT bootstraps."""
    deadline = time.monotonic() + (max(3 * cfg.control.lease_s, JOIN_LOOKUP_S) if options.initial_peers else 0.0)
    while True:
        active, _, finished = standby.live_active(dht, cfg.run_id, options.coordinator_key)
        if active is not None or finished is not None:  # a finished run is not started again either
            return True
        if time.monotonic() >= deadline or stop.wait(0.5):
            return False


def _follow(options: CoordinatorOptions, identity: Identity, dht, stop: threading.Event) -> standby.Takeover | None:
    # Default: beside the identity file (the coordinator's own state folder), else the working folder.
    folder = Path(options.identity_path).parent if options.identity_path else Path(".")
    path = Path(options.checkpoint_path or folder / f"standby-{identity.peer_id[:16]}.ckpt")
    options.checkpoint_path = str(path)
    endpoint = f"{options.announce_host}:{options.port}"
    print(f"coordinator {identity.peer_id[:8]} | standby for run {options.config.run_id}: following the active coordinator; "
          f"fingerprint {identity.peer_id}", flush=True)
    for maddr in discovery.visible_maddrs(dht):
        print(f"  --initial-peers {maddr}", flush=True)
    return standby.follow(dht=dht, identity=identity, run_id=options.config.run_id, checkpoint_path=path, endpoint=endpoint,
                          pinned=options.coordinator_key, stop=stop)


def run_coordinator(options: CoordinatorOptions, stop: threading.Event | None = None) -> dict:
    faults.check_environment()  # a bad SWARMLOCO_FAIL_AT fails here, before anything starts
    stop = stop or threading.Event()
    cfg = options.config
    identity = Identity.load_or_create(options.identity_path) if options.identity_path else Identity.generate()
    ports.check_grpc_port(options.host, options.port)  # before the DHT starts (a standby binds it only to take over)
    dht = None
    if options.use_dht:
        # The DHT first: hivemind forks its worker, and gRPC is not fork-safe.
        dht = discovery.start_dht(identity, initial_peers=options.initial_peers, host_maddrs=options.host_maddrs,
                                  announce_maddrs=options.announce_maddrs)
    counter = ByteCounter(identity.peer_id)
    server = operations = None
    term = 0
    try:
        if stop.is_set():  # stopped while the DHT started
            return {"role": "standby" if options.standby else "active", "stopped": True}
        if dht is not None and (options.standby or _run_is_held(dht, cfg, options, stop)):
            takeover = _follow(options, identity, dht, stop)
            if takeover is None:
                return {"role": "standby", "took_over": False}
            cfg, term = takeover.cfg, takeover.term
        coordinator = Coordinator(cfg, identity, checkpoint_path=options.checkpoint_path, counter=counter, term=term)
        server = build_coordinator_server(
            coordinator, host=options.host, port=options.port, announce_host=options.announce_host
        ).server
        server.start()
        coordinator.sign_state()  # again, now that it names our endpoint
        lease = Lease(dht, identity, coordinator) if dht is not None else None
        if lease is not None:
            coordinator.initial_peers = discovery.visible_maddrs(dht)
            lease.renew()
        if term:
            print(f"coordinator {identity.peer_id[:8]} | took over run {cfg.run_id} with term {term} at round {coordinator.round} "
                  f"(param hash {coordinator.param_hash[:16]})", flush=True)
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
            result = coordinator.tick()
            if result is not None:
                print(coordinator_line(result, cfg.rounds.rounds, counter.total()), flush=True)
            if lease is not None and lease.due():
                successor = lease.renew()
                if successor is not None:
                    print(f"coordinator {identity.peer_id[:8]} | coordinator {successor.coordinator_id[:8]} holds run {cfg.run_id} "
                          f"with term {successor.term} (ours: {coordinator.term}): stepping down", flush=True)
                    break
            if coordinator.finished:
                # The last state is served until every peer holds it (or the grace period ends):
                # a slow peer's last fetch must not find the coordinator gone.
                finished_at = finished_at or time.monotonic()
                waited = time.monotonic() - finished_at
                if (coordinator.final_state_delivered() and waited > options.linger_s) or waited > cfg.control.end_grace_s:
                    break
            stop.wait(0.1)
        if lease is not None and coordinator.finished:
            lease.close_run()  # standbys stop following; newcomers learn the run is over
        summary = coordinator.status()
        if options.summary_json:
            Path(options.summary_json).write_text(json.dumps(summary, indent=2))
        if coordinator.finished:
            print(f"coordinator | run finished: val loss {summary['initial_val_loss']:.4f} -> "
                  f"{summary['history'][-1]['val_loss'] if summary['history'] else float('nan'):.4f} | "
                  f"coordinator traffic {format_bytes(counter.total().sent + counter.total().received)}", flush=True)
        return summary
    finally:
        if operations is not None:
            operations.close()
        if server is not None:
            server.stop(grace=1.0).wait(3.0)
        if dht is not None:
            discovery.stop_dht(dht)
