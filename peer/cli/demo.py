"""`swarmloco demo`: a coordinator and N peers as separate processes on loopback, then a summary.

Everything is real: the hivemind DHT for discovery, gRPC between processes, Ed25519-signed
updates, the coordinator's signed manifests. Bytes are the transport's own counts.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from peer.cli import interrupts
from peer.cli.run_flags import load_run_config
from peer.cli.launcher import Swarm
from peer.run.progress import format_bytes


def ddp_bytes_per_peer_per_step(numel: int, peers: int) -> float:
    """Ring all-reduce of a dense fp32 gradient: each peer sends and receives 2(n-1)/n of it."""
    return 2 * 2 * (peers - 1) / peers * 4 * numel


def main(args: argparse.Namespace) -> int:
    # Ctrl+C (or SIGTERM) unwinds through `with Swarm`, which stops every child's process group.
    # Installed explicitly: a shell may start us with SIGINT ignored.
    interrupts.install()
    if args.peers < 1:
        raise ValueError("--peers must be at least 1")
    args.expected_peers = args.peers
    cfg = load_run_config(args)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="swarmloco-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "run.json").write_text(cfg.to_json())
    print(f"swarmloco demo | {args.peers} peers + coordinator on loopback | {cfg.rounds.rounds} rounds x {cfg.inner.steps} inner steps | "
          f"codec {cfg.compression.codec} | outer {cfg.outer.name} | logs in {workdir}", flush=True)
    started = time.monotonic()
    # Forked from one process that imported torch and hivemind (peer/cli/prewarmed.py): each peer
    # skips ~5.5 CPU-seconds of imports and shares those modules' memory (a running peer ~104 MB of
    # its own instead of ~230), which is what lets 48 peers fit where 48 fresh Pythons do not
    # (benchmarks/scale.md, the storm rows).
    with Swarm(workdir, echo=True, tls=getattr(args, "tls", False), prewarmed=not getattr(args, "exec_processes", False)) as swarm:
        coordinator = swarm.start_coordinator(["--config", str(workdir / "run.json"), "--checkpoint", str(workdir / "run.ckpt")])
        peers = [swarm.start_peer(f"peer{i}", ["--shard", f"{i}/{args.peers}", "--log-every", "25"]) for i in range(args.peers)]
        timeout = 600 + 60 * cfg.rounds.rounds
        try:
            coordinator_code = swarm.wait(coordinator, timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"the demo did not finish within {timeout}s; see the logs in {workdir}") from None
        for peer in peers:
            try:
                swarm.wait(peer, 30)
            except subprocess.TimeoutExpired:  # named below with the peers that failed
                pass
        failed = swarm.failures(peers)  # before the swarm stops what still runs: that is a failure too
        joined = sum(peer.joined for peer in peers)
    wall = time.monotonic() - started
    if coordinator_code != 0 or not (workdir / "coordinator.json").exists():
        print(f"swarmloco demo: the coordinator exited with {coordinator_code} and no summary; its log: {coordinator.log_path}",
              file=sys.stderr, flush=True)
        return 1
    summary = json.loads((workdir / "coordinator.json").read_text())
    peer_summaries = [json.loads(p.read_text()) for p in sorted(workdir.glob("peer*.json"))]
    code = report(cfg, summary, peer_summaries, wall, args, joined=JoinCount(started=len(peers), joined=joined, failed=failed))
    from peer.cli.sample import print_run_sample

    print_run_sample(workdir / "run.ckpt", None)  # the checkpoint carries its run config
    if failed:  # loudly, last, so it is what the terminal ends with
        print(f"swarmloco demo: {len(failed)} of {len(peers)} peers failed (the run went on without them):\n  " + "\n  ".join(failed),
              file=sys.stderr, flush=True)
        return 1
    return code


@dataclass(frozen=True, slots=True)
class JoinCount:
    started: int
    joined: int
    failed: list[str]  # one line per peer that never joined or exited with an error (Swarm.failures)


def report(cfg, summary: dict, peers: list[dict], wall: float, args: argparse.Namespace, joined: JoinCount | None = None) -> int:
    history = summary["history"]
    if not history:
        print("the run closed no round; see the logs")
        return 1
    from peer.learn.model import build_model, num_params

    numel = num_params(build_model(cfg.model, cfg.seed))
    n = max(1, len(peers))
    rounds = len(history)
    peer_bytes = [(p["bytes_sent"] + p["bytes_received"]) / max(1, p["rounds"]) for p in peers]
    per_peer_round = sum(peer_bytes) / len(peer_bytes) if peer_bytes else 0.0
    payload_sizes = [h["payload_bytes"] for p in peers for h in p["history"]]
    total = sum(p["bytes_sent"] + p["bytes_received"] for p in peers)
    ddp_round = ddp_bytes_per_peer_per_step(numel, n) * cfg.inner.steps
    fp32_payload = 4 * numel
    codec_ratio = fp32_payload / (sum(payload_sizes) / len(payload_sizes)) if payload_sizes else float("nan")
    rows = [
        ("initial validation loss", f"{summary['initial_val_loss']:.4f}"),
        ("final validation loss", f"{history[-1]['val_loss']:.4f}"),
        ("rounds x inner steps", f"{rounds} x {cfg.inner.steps}"),
        ("peers", str(n) if joined is None else f"{n} finished; {joined.joined} of {joined.started} joined"),
        ("wall time", f"{wall:.0f} s"),
        ("codec", f"{cfg.compression.codec} (payload {fp32_payload / codec_ratio:,.0f} B vs fp32 {fp32_payload:,} B: {codec_ratio:.1f}x smaller)"),
        ("bytes per peer per round (measured)", format_bytes(per_peer_round)),
        ("DDP all-reduce per peer per round", format_bytes(ddp_round)),
        ("DDP / swarmloco", f"{ddp_round / per_peer_round:.1f}x" if per_peer_round else "n/a"),
        ("all peers in sync", str(all(h.get("in_sync", True) for p in peers for h in p["history"]))),
    ]
    width = max(len(k) for k, _ in rows)
    print("\n" + "=" * (width + 40))
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    print("=" * (width + 40))
    if args.json:
        result = {
            "initial_val_loss": summary["initial_val_loss"],
            "final_val_loss": history[-1]["val_loss"],
            "val_loss_per_round": [h["val_loss"] for h in history],
            "rounds": rounds,
            "peers": n,
            **({} if joined is None else {"peers_started": joined.started, "peers_joined": joined.joined,
                                          "failed_peers": joined.failed}),
            "wall_s": wall,
            "bytes_per_peer_per_round": per_peer_round,
            "total_bytes": total,
            "ddp_equivalent_bytes": ddp_round * rounds * n,
            "codec_ratio_vs_fp32": codec_ratio,
            "num_params": numel,
            "config": cfg.to_dict(),
            "peer_summaries": [{k: v for k, v in p.items() if k != "traffic"} for p in peers],
        }
        Path(args.json).write_text(json.dumps(result, indent=2))
        print(f"wrote {args.json}")
    return 0
