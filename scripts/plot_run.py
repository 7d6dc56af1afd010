"""Plot a coordinator's run log (`swarmloco coordinator --run-log run.jsonl`) as PNGs.

    .venv/bin/python scripts/plot_run.py run.jsonl --out plots/

Writes loss_vs_round.png, loss_vs_bytes.png (swarm-wide bytes sent: every peer's own count of its
round plus the coordinator's), peer_bytes.png (bytes each peer sent per round) and
utilization.png (each peer's share of wall time in inner steps, as its heartbeat reported it
after each round). Prints what it wrote.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any


def read_events(path: Path) -> list[dict[str, Any]]:
    events = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            events.append(json.loads(line))
        except ValueError:
            print(f"plot_run: {path}:{number} is not JSON (a line cut short by a crash?); skipped", file=sys.stderr)
    return events


def run_series(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Per round: validation loss and cumulative swarm bytes; per peer: bytes sent and utilization by round."""
    rounds = {e["round"]: e for e in events if e["event"] == "round"}  # a re-logged round (takeover): the last wins
    peer_sent: dict[str, dict[int, int]] = defaultdict(dict)
    peer_util: dict[str, dict[int, float]] = defaultdict(dict)
    for e in events:
        if e["event"] == "peer_round":
            peer_sent[e["peer_id"]][e["round"]] = e["bytes_sent"]
            if e.get("utilization") is not None:
                peer_util[e["peer_id"]][e["round"]] = e["utilization"]
    order = sorted(rounds)
    cumulative, total = [], 0
    for r in order:
        total += rounds[r]["coordinator_bytes_sent"] + sum(sent.get(r, 0) for sent in peer_sent.values())
        cumulative.append(total)
    start = next((e for e in events if e["event"] in ("start", "takeover")), {})
    return {"rounds": order, "val_loss": [rounds[r]["val_loss"] for r in order], "bytes": cumulative,
            "initial_val_loss": start.get("initial_val_loss"), "peer_sent": dict(peer_sent), "peer_util": dict(peer_util),
            "run_id": start.get("run_id", "?")}


def plot(series: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written = []

    def save(fig, name: str) -> None:
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        written.append(out / name)

    xs = [r + 1 for r in series["rounds"]]
    for name, x, label in (("loss_vs_round.png", xs, "round"), ("loss_vs_bytes.png", [b / 1e6 for b in series["bytes"]], "MB sent, swarm-wide")):
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(x, series["val_loss"], marker="o", ms=3)
        ax.set_xlabel(label)
        ax.set_ylabel("validation loss")
        ax.set_title(f"run {series['run_id']}")
        ax.grid(alpha=0.3)
        save(fig, name)
    for name, data, ylabel, scale in (("peer_bytes.png", series["peer_sent"], "MB sent in the round", 1e-6),
                                      ("utilization.png", series["peer_util"], "utilization (share of wall time)", 1.0)):
        fig, ax = plt.subplots(figsize=(6, 4))
        for peer, by_round in sorted(data.items()):
            rounds = sorted(by_round)
            ax.plot([r + 1 for r in rounds], [by_round[r] * scale for r in rounds], marker=".", label=peer[:8])
        ax.set_xlabel("round")
        ax.set_ylabel(ylabel)
        if data:
            ax.legend(fontsize=7, ncol=2)
        ax.grid(alpha=0.3)
        save(fig, name)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", type=Path, help="the run log (JSON lines)")
    parser.add_argument("--out", type=Path, default=Path("."), help="folder for the PNGs")
    args = parser.parse_args(argv)
    if not args.log.exists():
        print(f"plot_run: {args.log} does not exist; start the coordinator with --run-log {args.log}", file=sys.stderr)
        return 1
    series = run_series(read_events(args.log))
    if not series["rounds"]:
        print(f"plot_run: {args.log} has no closed round yet; nothing to plot", file=sys.stderr)
        return 1
    for path in plot(series, args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
