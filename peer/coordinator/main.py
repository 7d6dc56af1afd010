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
from peer.coordinator.state import Coordinator
from peer.coordinator.server import build_coordinator_server
from peer.run import faults
from peer.run.progress import coordinator_line, format_bytes
from protocol import discovery
from protocol.accounting import ByteCounter
from protocol.identity import Identity

log = logging.getLogger("swarmloco.coordinator")


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
    linger_s: float = 3.0  # keep serving after the last round so peers see `finished`
    operations: OperationsOptions | None = None  # metrics, dashboard, run log (peer/coordinator/operations.py)


def run_coordinator(options: CoordinatorOptions, stop: threading.Event | None = None) -> dict:
    faults.check_environment()  # a bad SWARMLOCO_FAIL_AT fails here, before anything starts
    stop = stop or threading.Event()
    cfg = options.config
    identity = Identity.load_or_create(options.identity_path) if options.identity_path else Identity.generate()
    dht = None
    if options.use_dht:
        # The DHT first: hivemind forks its worker, and gRPC is not fork-safe.
        dht = discovery.start_dht(identity, host_maddrs=options.host_maddrs, announce_maddrs=options.announce_maddrs)
    counter = ByteCounter(identity.peer_id)
    server = operations = None
    try:
        coordinator = Coordinator(cfg, identity, checkpoint_path=options.checkpoint_path, counter=counter)
        server = build_coordinator_server(
            coordinator, host=options.host, port=options.port, announce_host=options.announce_host
        ).server
        server.start()
        if dht is not None:
            coordinator.initial_peers = discovery.visible_maddrs(dht)
            discovery.announce_run(dht, identity, run_id=cfg.run_id, endpoint=coordinator.endpoint)
        print(f"coordinator {identity.peer_id[:8]} | run {cfg.run_id} | {coordinator.numel:,} params | codec {cfg.compression.codec} | "
              f"outer {cfg.outer.name} | aggregator {cfg.aggregation.name} | round {coordinator.round}/{cfg.rounds.rounds} | "
              f"initial val loss {coordinator.initial_val_loss:.4f}", flush=True)
        print(f"coordinator gRPC: {coordinator.endpoint}   (peers: swarmloco peer --coordinator {coordinator.endpoint})", flush=True)
        for maddr in coordinator.initial_peers:
            print(f"  --initial-peers {maddr}", flush=True)
        operations = start_operations(coordinator, options.operations)

        last_announce = time.monotonic()
        finished_at = None
        while not stop.is_set():
            result = coordinator.tick()
            if result is not None:
                print(coordinator_line(result, cfg.rounds.rounds, counter.total()), flush=True)
            if dht is not None and time.monotonic() - last_announce > discovery.RECORD_TTL_S / 3:
                discovery.announce_run(dht, identity, run_id=cfg.run_id, endpoint=coordinator.endpoint)
                last_announce = time.monotonic()
            if coordinator.finished:
                finished_at = finished_at or time.monotonic()
                if time.monotonic() - finished_at > options.linger_s:
                    break
            stop.wait(0.1)
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
            dht.shutdown()
