"""The lines people watch: one dense line every few inner steps and one per round."""

from __future__ import annotations

from typing import Any

from protocol.accounting import Traffic


def format_bytes(n: float, digits: int = 2) -> str:
    """Decimal units (1 KB = 1000 B), `digits` after the point above bytes."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.{digits}f} {unit}"
        n /= 1000
    return f"{n:.{digits}f} GB"


def step_line(peer: str, round_: int, rounds: int, step: int, steps: int, loss: float, tokens_per_s: float, traffic: Traffic,
              mfu: float | None = None) -> str:
    """`mfu`: model FLOPs utilization, where the device's peak is known (CUDA; peer/learn/throughput.py)."""
    return (
        f"peer {peer} | round {round_ + 1}/{rounds} step {step}/{steps} | loss {loss:.3f} | "
        f"{tokens_per_s / 1000:.1f}k tok/s" + ("" if mfu is None else f" MFU {100 * mfu:.1f}%")
        + f" | sent {format_bytes(traffic.sent)} recv {format_bytes(traffic.received)}"
    )


def round_line(peer: str, round_: int, rounds: int, record: dict[str, Any], utilization: float) -> str:
    excluded = f" excluded {len(record['excluded'])}" if record["excluded"] else ""
    return (
        f"peer {peer} | round {round_ + 1}/{rounds} done | peers {record['updates']}{excluded} | "
        f"train loss {record['train_loss']:.3f} | sent {format_bytes(record['bytes_sent'])} "
        f"recv {format_bytes(record['bytes_received'])} | compute {record['compute_s']:.1f}s "
        f"wait {record['wait_s']:.1f}s fetch {record['fetch_s']:.2f}s | util {100 * utilization:.0f}%"
        + ("" if record["in_sync"] else " | RESYNC")
    )


def coordinator_line(result: Any, rounds: int, traffic: Traffic) -> str:
    excluded = f" excluded {result.excluded}" if result.excluded else ""
    return (
        f"coordinator | round {result.round + 1}/{rounds} closed | updates {result.updates}{excluded} | "
        f"val loss {result.val_loss:.4f} | {result.seconds:.1f}s ({result.close_reason}) | "
        f"hash {result.param_hash[:12]} | coordinator traffic sent {format_bytes(traffic.sent)} recv {format_bytes(traffic.received)}"
    )
