"""What a `swarmloco simulate` run measured: the per-round curve both baselines fill, its dense
per-round log line, and the JSON-ready result (losses, bytes per peer per round, the DDP bytes it is
compared with, the run config)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from peer.cli.simulate_ddp import ring_allreduce_bytes
from peer.cli.simulate_options import SimulationOptions
from peer.run.config import RunConfig
from peer.run.progress import format_bytes


@dataclass
class Curve:
    """What both baselines measure, one entry per round (all byte counts are per round)."""

    numel: int
    initial_val_loss: float
    val_loss: list[float] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)  # mean inner loss over peers and steps
    upload_bytes: list[list[int]] = field(default_factory=list)  # [round][peer]
    download_bytes: list[list[int]] = field(default_factory=list)  # [round][peer]
    excluded: list[dict[str, str]] = field(default_factory=list)  # [round] {peer index: reason}
    final_params_sha256: str | None = None  # θ after the last round (diloco): bit-identity checks
    lies: dict[str, Any] | None = None  # lying-owner: lies told / caught (simulate_slices.LieCount)
    work: dict[str, Any] | None = None  # diloco: speeds, steps, simulated time and weights (simulate_speeds.SpeedModel)


def log_round(opts: SimulationOptions, cfg: RunConfig, curve: Curve, r: int, seconds: float, lies: dict | None = None) -> None:
    if opts.log is None:
        return
    up, down = curve.upload_bytes[-1], curve.download_bytes[-1]
    moved = (sum(up) + sum(down)) / len(up)
    excluded = curve.excluded[-1]
    opts.log(
        f"round {r + 1:>3}/{cfg.rounds.rounds} | val {curve.val_loss[-1]:.4f} | train {curve.train_loss[-1]:.4f} | "
        f"up {human_bytes(sum(up) / len(up))}/peer | up+down {human_bytes(moved)}/peer | "
        f"excluded {len(excluded)}{' ' + str(sorted(excluded.items())) if excluded else ''} | "
        + (f"lies told {lies['told']} caught {lies['caught']} (liar-only slices {lies['slices_with_only_liars']}) | " if lies else "")
        + f"{seconds:.1f}s"
    )


def human_bytes(n: float) -> str:
    return format_bytes(n, digits=1)


def simulation_result(opts: SimulationOptions, cfg: RunConfig, curve: Curve, wall_s: float) -> dict[str, Any]:
    n, rounds, steps = opts.peers, cfg.rounds.rounds, cfg.inner.steps
    per_round_total = [sum(u) + sum(d) for u, d in zip(curve.upload_bytes, curve.download_bytes)]
    total = sum(per_round_total)
    uploads = sum(sum(u) for u in curve.upload_bytes)
    ddp_bytes = ring_allreduce_bytes(curve.numel, n) * steps * rounds * n
    cumulative, running = [], 0
    for b in per_round_total:
        running += b
        cumulative.append(running)
    return {
        "baseline": opts.baseline,
        "peers": n,
        "overlap_arrival": opts.overlap_arrival if cfg.rounds.overlap_communication else None,
        "rounds": rounds,
        "inner_steps": steps,
        "numel": curve.numel,
        "seed": cfg.seed,
        "codec": cfg.compression.codec if opts.baseline == "diloco" else "fp32-allreduce",
        "outer": cfg.outer.name if opts.baseline == "diloco" else None,
        "aggregator": cfg.aggregation.name if opts.baseline == "diloco" else None,
        "attack": opts.attack,
        "attack_options": dict(opts.attack_options),
        "byzantine": opts.byzantine,
        "initial_val_loss": curve.initial_val_loss,
        "final_val_loss": curve.val_loss[-1],
        "val_loss_per_round": curve.val_loss,
        "train_loss_per_round": curve.train_loss,
        "bytes_per_peer_per_round": total / (n * rounds),
        "upload_bytes_per_peer_per_round": uploads / (n * rounds),
        "bytes_per_round": per_round_total,  # all peers, up + down
        "cumulative_bytes_per_round": cumulative,
        "total_bytes": total,
        "ddp_equivalent_bytes": ddp_bytes,
        "ratio_vs_ddp": ddp_bytes / total if total else None,
        "excluded_per_round": curve.excluded,
        "final_params_sha256": curve.final_params_sha256,
        "lying_owner": curve.lies,
        "work": curve.work,
        "bytes_note": (
            "measured len(payload): each peer uploads its own once and downloads the n-1 others"
            if opts.baseline == "diloco"
            else "ring all-reduce of dense fp32 gradients every step: 2*2(n-1)/n*4*numel per peer per step"
        ),
        "wall_s": wall_s,
        "config": cfg.to_dict(),
    }
