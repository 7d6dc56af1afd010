"""`swarmloco preflight`: will this machine's link and CPU/GPU hold up in this run? Measured, then advised.

Measures against the run's coordinator: RTT, download and upload throughput (bounded bulk
transfers), whether the coordinator can dial back the port this machine would announce, and
this machine's inner-step time for the run's model; then recommends --client-mode or not, and
the H and codec that keep communication under 5% of compute, with the arithmetic
(peer/run/preflight_plan.py). In a compute-window run (rounds.window_s > 0), also the steps this
machine would take in the window and the share of the round's counted work they would be among
the live peers' last work (peer/run/window_share.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import timedelta
from typing import Any

STEP_BUDGET_S = 3.0


def inner_step_seconds(cfg: Any, device: str, budget_s: float = STEP_BUDGET_S) -> dict[str, float]:
    """Median seconds per inner step of the run's model on this machine (random tokens; 2 warm-up steps)."""
    import statistics

    import torch

    from peer.learn.model import build_model
    from peer.learn.training import InnerTrainer

    class RandomTokens:
        def next_batch(self):
            x = torch.randint(0, 256, (cfg.data.batch_size, cfg.model.seq_len + 1), device=device)
            return x[:, :-1], x[:, 1:]

        def state_dict(self):
            return {}

    model = build_model(cfg.model, cfg.seed).to(device)
    trainer = InnerTrainer(model, cfg.inner, RandomTokens())
    trainer.run(2)
    samples: list[float] = []
    started = time.perf_counter()
    while len(samples) < 3 or (time.perf_counter() - started < budget_s and len(samples) < 50):
        t0 = time.perf_counter()
        trainer.run(1)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        samples.append(time.perf_counter() - t0)
    return {"step_s": statistics.median(samples), "steps_timed": len(samples),
            "numel": sum(p.numel() for p in model.parameters())}


def resolve_endpoint(args: argparse.Namespace) -> tuple[str, Any]:
    """(coordinator endpoint, the DHT to shut down or None)."""
    if args.coordinator:
        return args.coordinator, None
    from protocol import discovery
    from protocol.identity import Identity

    dht = discovery.start_dht(Identity.generate(), initial_peers=args.initial_peers, client_mode=True, timeout_s=args.connect_timeout)
    return discovery.find_run(dht, args.run_id, timeout_s=args.connect_timeout).endpoint, dht


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from optim import codecs
    from peer.run.config import RunConfig
    from peer.run.preflight_plan import CANDIDATES, Link, Swarm, recommend
    from peer.run import preflight_probe as probe
    from protocol.channels import create_channel, wait_ready
    from protocol.wire import swarm_pb2, swarm_pb2_grpc

    endpoint, dht = resolve_endpoint(args)
    channel = create_channel(endpoint)
    try:
        wait_ready(channel, endpoint, timedelta(seconds=args.connect_timeout))
        coordinator = swarm_pb2_grpc.CoordinatorStub(channel)
        info = coordinator.GetRunInfo(swarm_pb2.RunInfoRequest(), timeout=10)
        status = json.loads(coordinator.Status(swarm_pb2.StatusRequest(), timeout=10).json)
        stub = swarm_pb2_grpc.PreflightStub(channel)
        rtt = probe.measure_rtt(stub)
        download = probe.measure_throughput(stub, "download", args.seconds)
        upload = probe.measure_throughput(stub, "upload", args.seconds)
        dial = None if args.skip_dial_back else probe.check_dial_back(stub, args.host, args.port)
    finally:
        channel.close()
        if dht is not None:
            dht.shutdown()
    cfg = RunConfig.from_json(info.config_json)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    step = inner_step_seconds(cfg, args.device)
    numel = step["numel"]
    payloads = {c: codecs.build(c).max_encoded_size(numel) for c in dict.fromkeys([cfg.compression.codec, *CANDIDATES])}
    live = sum(1 for p in status["peers"] if p["state"] not in ("gone", "banned"))
    link = Link(rtt_s=rtt, upload_bytes_per_s=upload["bytes_per_s"], download_bytes_per_s=download["bytes_per_s"],
                dial_back=None if dial is None else dial["reachable"], dial_address=dial["address"] if dial else "",
                dial_error=dial["error"] if dial else "")
    swarm = Swarm(codec=cfg.compression.codec, inner_steps=cfg.inner.steps, peers=live + 1, sliced=cfg.exchange.mode == "sliced",
                  replicas=cfg.exchange.replicas, num_slices=cfg.exchange.slices, spot_checks=cfg.exchange.spot_checks,
                  coverage=cfg.exchange.spot_check_coverage, payload_bytes=payloads, numel=numel)
    return {"coordinator": endpoint, "run_id": info.run_id, "round": info.round, "numel": numel, "peers_live": live,
            "rtt_s": rtt, "download": download, "upload": upload, "dial_back": dial, "device": args.device, **step,
            "recommendation": recommend(link, swarm, step["step_s"]), "window": window_hint(cfg, status, step["step_s"])}


def window_hint(cfg: Any, status: dict[str, Any], step_s: float) -> dict[str, Any] | None:
    """In a compute-window run: this machine's steps in the window and its share of the round (None: no window)."""
    from dataclasses import asdict

    from peer.run.window_share import describe, window_share

    r = cfg.rounds
    if not r.window_s:
        return None
    others = [int((p.get("work") or {}).get("tokens") or 0) for p in status["peers"] if p["state"] not in ("gone", "banned")]
    share = window_share(window_s=r.window_s, step_s=step_s, min_steps=r.min_steps, max_steps=r.max_steps,
                         tokens_per_step=cfg.data.batch_size * cfg.model.seq_len, others_tokens=others,
                         num_byzantine=cfg.aggregation.num_byzantine)
    return {**asdict(share), "lines": describe(share, r.window_s, r.min_steps)}


def mbit(bytes_per_s: float) -> float:
    return 8 * bytes_per_s / 1e6


def report(r: dict[str, Any]) -> str:
    rec = r["recommendation"]
    dial = r["dial_back"]
    lines = [
        f"preflight against {r['coordinator']} (run {r['run_id']}, round {r['round']}, {r['numel']:,} params, {r['peers_live']} live peers)",
        f"  RTT           {1000 * r['rtt_s']:.1f} ms (median of 9 pings)",
        f"  download      {mbit(r['download']['bytes_per_s']):.1f} Mbit/s ({r['download']['bytes'] / 1e6:.1f} MB in {r['download']['seconds']:.2f} s)",
        f"  upload        {mbit(r['upload']['bytes_per_s']):.1f} Mbit/s ({r['upload']['bytes'] / 1e6:.1f} MB in {r['upload']['seconds']:.2f} s)",
        "  dial-back     " + ("not checked" if dial is None else f"{'reachable' if dial['reachable'] else 'NOT reachable'} at {dial['address']}"
                             + (f" ({dial['error']})" if dial["error"] else "")),
        f"  inner step    {1000 * r['step_s']:.1f} ms on {r['device']} (median of {r['steps_timed']})",
        "",
        "arithmetic:",
        *(f"  {line}" for line in rec["arithmetic"]),
        "",
        "recommendation:",
        f"  {'--client-mode' if rec['client_mode']['recommended'] else 'no --client-mode'}: {rec['client_mode']['why']}",
        f"  codec {rec['choice']['codec']}, H = {rec['choice']['inner_steps']}: {rec['choice']['why']}",
    ]
    if r.get("window"):
        lines += ["", "compute window:", *(f"  {line}" for line in r["window"]["lines"])]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    if not args.coordinator and not args.initial_peers:
        print("swarmloco preflight: give --coordinator HOST:PORT or --initial-peers MULTIADDR", file=sys.stderr)
        return 2
    result = measure(args)
    print(report(result), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0
