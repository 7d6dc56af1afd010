"""`swarmloco runs`: the runs a DHT announces, so a volunteer picks one from a list.

For each run announced under the DHT's runs key, ask its active coordinator (GetRunInfo and
Status over gRPC) for the model, codec, round and peers; a coordinator that does not answer is
listed with what its DHT record says. Join one with `swarmloco peer --initial-peers ... --run RUN_ID`.
"""

from __future__ import annotations

import argparse
import json
from datetime import timedelta
from typing import Any

import grpc


def parameter_count(model_cfg: Any, seed: int) -> int:
    """Parameters of the run's model, built on torch's meta device (no memory, no init)."""
    import torch

    from peer.learn.model import build_model

    with torch.device("meta"):
        return sum(p.numel() for p in build_model(model_cfg, seed).parameters())


def describe_model(m: Any) -> str:
    return m.preset or f"{m.arch} d{m.d_model} L{m.n_layer} H{m.n_head} T{m.seq_len}"


def ask_coordinator(endpoint: str, timeout_s: float) -> dict[str, Any]:
    """What the coordinator at `endpoint` says about its run; {'error': ...} when it does not answer."""
    from peer.run.config import RunConfig
    from protocol.channels import create_channel, wait_ready
    from protocol.wire import swarm_pb2, swarm_pb2_grpc

    channel = create_channel(endpoint)
    try:
        wait_ready(channel, endpoint, timedelta(seconds=timeout_s))
        stub = swarm_pb2_grpc.CoordinatorStub(channel)
        info = stub.GetRunInfo(swarm_pb2.RunInfoRequest(), timeout=timeout_s)
        status = json.loads(stub.Status(swarm_pb2.StatusRequest(), timeout=timeout_s).json)
    except (ConnectionError, grpc.RpcError) as exc:
        return {"error": exc.details() if isinstance(exc, grpc.RpcError) else str(exc)}
    finally:
        channel.close()
    cfg = RunConfig.from_json(info.config_json)
    return {"model": describe_model(cfg.model), "params": parameter_count(cfg.model, cfg.seed), "codec": cfg.compression.codec,
            "exchange": cfg.exchange.mode, "round": info.round, "rounds": cfg.rounds.rounds, "finished": info.finished,
            "peers": sum(1 for p in status["peers"] if p["state"] not in ("gone", "banned")), "initial_peers": list(info.initial_peers)}


def list_runs(initial_peers: list[str], *, timeout_s: float, wait_s: float) -> list[dict[str, Any]]:
    import time

    from protocol import discovery
    from protocol.identity import Identity

    dht = discovery.start_dht(Identity.generate(), initial_peers=initial_peers, client_mode=True, timeout_s=timeout_s)
    try:
        deadline = time.monotonic() + wait_s
        records = discovery.run_records(dht)
        while not records and time.monotonic() < deadline:  # a fresh DHT node may need a moment to see the records
            time.sleep(0.5)
            records = discovery.run_records(dht)
    finally:
        dht.shutdown()
    runs = []
    for run_id in sorted({r.run_id for r in records}):
        mine = [r for r in records if r.run_id == run_id]
        active = sorted((r for r in mine if r.role == "active"), key=lambda r: (-r.term, r.coordinator_id)) or mine
        lead = active[0]
        runs.append({"run_id": run_id, "coordinator_fingerprint": lead.coordinator_id, "endpoint": lead.endpoint,
                     "standby_coordinators": sum(1 for r in mine if r.role == "standby"),
                     **ask_coordinator(lead.endpoint, timeout_s)})
    return runs


def table(runs: list[dict[str, Any]]) -> str:
    if not runs:
        return "no run is announced on this DHT (is the coordinator up, and are these its --initial-peers?)"
    lines = [f"{'run id':20} {'model':26} {'params':>11} {'codec':10} {'round':>9} {'peers':>5}  coordinator (fingerprint, endpoint)"]
    for r in runs:
        if "error" in r:
            lines.append(f"{r['run_id']:20} {'?':26} {'?':>11} {'?':10} {'?':>9} {'?':>5}  {r['coordinator_fingerprint']} "
                         f"{r['endpoint']} (not answering: {r['error']})")
            continue
        state = "done" if r["finished"] else f"{r['round']}/{r['rounds']}"
        lines.append(f"{r['run_id']:20} {r['model']:26} {r['params']:>11,} {r['codec']:10} {state:>9} {r['peers']:>5}  "
                     f"{r['coordinator_fingerprint']} {r['endpoint']}" + (f" (+{r['standby_coordinators']} standby)" if r["standby_coordinators"] else ""))
    lines.append("join one: swarmloco peer --initial-peers ... --run RUN_ID")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    runs = list_runs(args.initial_peers, timeout_s=args.connect_timeout, wait_s=args.wait)
    print(json.dumps(runs, indent=2) if args.json else table(runs))
    return 0 if runs else 1

