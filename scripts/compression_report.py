"""The compression benchmark's report: benchmarks/compression.md and compression.png from the runs
that scripts/bench_compression.py stored in compression.json.

Every column that says how a row ran (codec, outer optimizer, aggregator, H x rounds, seeds) is read
from the runs' stored configs, not from the row's definition, so a run kept from an older default
shows what it really ran with.
"""

from __future__ import annotations

import platform
import statistics
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench_compression import Row


def total_steps(run: dict[str, Any]) -> int:
    """Inner steps per peer of a stored run."""
    return run["rounds"] * run["inner_steps"]


def machine() -> str:
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        fields = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
        cpu = f"{fields.get('Model name', '?').strip()}, {fields.get('CPU(s)', '?').strip()} CPU(s)"
    except (OSError, subprocess.CalledProcessError):
        cpu = platform.processor() or "unknown CPU"
    import torch

    return f"{cpu}; Python {platform.python_version()}; torch {torch.__version__}"


def summarize(rows: list[Row], runs: list[dict[str, Any]], steps: int) -> list[dict[str, Any]]:
    """One dict per row that has runs of `steps` inner steps per peer: mean final loss over seeds,
    spread, bytes, curves."""
    out = []
    for row in rows:
        mine = [r for r in runs if r["label"] == row.label and total_steps(r) == steps]
        if not mine:
            continue
        finals = [r["final_val_loss"] for r in mine]
        curves = [r["val_loss_per_round"] for r in mine]
        out.append({
            "row": row,
            "seeds": sorted(r["seed"] for r in mine),
            "final": statistics.fmean(finals),
            "spread": (max(finals) - min(finals)) / 2,
            "per_peer_round": mine[0]["bytes_per_peer_per_round"],
            "upload": mine[0]["upload_bytes_per_peer_per_round"],
            "total": mine[0]["total_bytes"],
            "ddp_bytes": mine[0]["ddp_equivalent_bytes"],
            "curve": [statistics.fmean(values) for values in zip(*curves)],
            "cumulative": mine[0]["cumulative_bytes_per_round"],
            "initial": statistics.fmean(r["initial_val_loss"] for r in mine),
            "wall_s": statistics.fmean(r["wall_s"] for r in mine),
            "h": mine[0]["inner_steps"],
            "by_seed": {r["seed"]: r["final_val_loss"] for r in mine},
            # How the runs really ran, read from their stored configs (not from the row's label):
            "codecs": sorted({ran_codec(r) for r in mine}),
            "outers": sorted({ran_outer(r) for r in mine}),
            "aggregators": {r["seed"]: ran_aggregator(r) for r in mine},
        })
    return out


def ran_codec(run: dict[str, Any]) -> str:
    return "-" if run["baseline"] == "ddp" else run["config"]["compression"]["codec"]


def ran_outer(run: dict[str, Any]) -> str:
    """The outer optimizer and its step settings, as the stored run config had them."""
    if run["baseline"] == "ddp":
        return "-"
    o = run["config"]["outer"]
    if o["name"] == "demo":
        return f"demo (lr {o['demo_lr']:g}, top-{o['demo_topk']} of {o['demo_chunk']}, decay {o['demo_decay']:g})"
    if o["name"] == "nesterov":
        return f"nesterov (lr {o['lr']:g}, momentum {o['momentum']:g})"
    return f"{o['name']} (lr {o['lr']:g})"


def ran_aggregator(run: dict[str, Any]) -> str:
    """The aggregator a stored run used; DDP averages dense gradients (a mean) every step."""
    return "mean" if run["baseline"] == "ddp" else run["config"]["aggregation"]["name"]


def _aggregator_cell(s: dict[str, Any]) -> str:
    """The aggregator column; a run that used another aggregator than the row states is named, bold."""
    stated, used = s["row"].aggregator, s["aggregators"]
    others = {seed: name for seed, name in sorted(used.items()) if name != stated}
    if not others:
        return stated
    return stated + "".join(f" **but seed {seed}: {name}**" for seed, name in others.items())


def _off_aggregator_note(summary: list[dict[str, Any]]) -> list[str]:
    off = off_aggregator_runs(summary)
    if not off:
        return []
    return [
        f"**Not yet re-run with the aggregator their row states** ({len(off)} run(s); their losses and the "
        f"gaps computed from them are partly the aggregator's): {'; '.join(off)}. "
        "`--resume` with the row re-runs them.",
        "",
    ]


def off_aggregator_runs(summary: list[dict[str, Any]]) -> list[str]:
    """'label seed k: name' for each run whose aggregator differs from its row's stated one."""
    return [
        f"{s['row'].label} seed {seed}: {name}"
        for s in summary
        for seed, name in sorted(s["aggregators"].items())
        if name != s["row"].aggregator
    ]


def paired_gap(s: dict[str, Any], ref: dict[str, Any]) -> float:
    """Relative loss gap of summary `s` to `ref` in percent, on the seeds both have (same init and
    data order: seed-to-seed spread is larger than most codec effects); all seeds if none shared."""
    shared = sorted(set(s["by_seed"]) & set(ref["by_seed"]))
    if not shared:
        return 100 * (s["final"] / ref["final"] - 1)
    mine = statistics.fmean(s["by_seed"][k] for k in shared)
    return 100 * (mine / statistics.fmean(ref["by_seed"][k] for k in shared) - 1)


def reference_at_steps(runs: list[dict[str, Any]], label: str, steps: int) -> dict[str, Any] | None:
    """`label`'s val loss after `steps` inner steps, read off longer runs' curves, as a summary-like
    {"final": mean over seeds, "by_seed": {seed: loss}} for paired_gap; None without such runs."""
    by_seed = {
        r["seed"]: r["val_loss_per_round"][steps // r["inner_steps"] - 1]
        for r in runs
        if r["label"] == label and steps % r["inner_steps"] == 0 and total_steps(r) >= steps
    }
    return {"final": statistics.fmean(by_seed.values()), "by_seed": by_seed} if by_seed else None


def _human(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError


def _table(summary: list[dict[str, Any]], fp32: dict[str, Any] | None, fp32_upload: float | None) -> list[str]:
    """Markdown rows; the gap is paired by seed with `fp32` (a summary dict, or {"final": x, "by_seed": {}})."""
    lines = [
        "| row | codec | outer | aggregator | H x rounds | seeds | final val loss | bytes/peer/round | upload/peer/round "
        "| total bytes | fewer bytes than DDP | fewer bytes than fp32 | gap vs DiLoCo fp32 | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        row = s["row"]
        vs_ddp = f"{s['ddp_bytes'] / s['total']:.0f}x" if s["total"] else "-"
        vs_fp32 = f"{fp32_upload / s['upload']:.1f}x" if fp32_upload and row.baseline == "diloco" else "-"
        gap = f"{paired_gap(s, fp32):+.1f}%" if fp32 else "-"
        outer = "; ".join(s["outers"])
        lines.append(
            f"| {row.label} | {', '.join(f'`{c}`' for c in s['codecs'])} | {outer} | {_aggregator_cell(s)} | "
            f"{s['h']} x {len(s['curve'])} | {', '.join(map(str, s['seeds']))} | "
            f"{s['final']:.4f} ± {s['spread']:.4f} | {_human(s['per_peer_round'])} | {_human(s['upload'])} | "
            f"{_human(s['total'])} | {vs_ddp} | {vs_fp32} | {gap} | {row.note} |"
        )
    return lines


def _seed_spread(s: dict[str, Any]) -> str:
    """How far apart a row's seeds ended: (max - min) / min of the final losses, in percent."""
    finals = list(s["by_seed"].values())
    return f"{100 * (max(finals) / min(finals) - 1):.1f}%"


def _shared_settings(runs: list[dict[str, Any]]) -> str:
    """Inner lr, batch and error feedback as the runs' stored configs have them (each value listed
    once; more than one value means the runs differ)."""

    def values(get) -> str:
        return "/".join(sorted({str(get(r["config"])) for r in runs}))

    return (f"inner lr {values(lambda c: c['inner']['lr'])}, batch {values(lambda c: c['data']['batch_size'])}x"
            f"{values(lambda c: c['model']['seq_len'])} per peer, error feedback "
            f"{values(lambda c: 'on' if c['compression']['error_feedback'] else 'off')} for the lossy codecs")


def _per_seed(ref: dict[str, Any]) -> str:
    return ", ".join(f"{loss:.4f} (seed {seed})" for seed, loss in sorted(ref["by_seed"].items()))


def write_report(rows: list[Row], runs: list[dict[str, Any]], meta: dict[str, Any], notes: str = "") -> str:
    """The markdown of compression.md: the full-length table of `rows`, targets, screening tables, notes."""
    steps = meta["rounds"] * meta["inner_steps"]
    summary = summarize(rows, runs, steps)
    by_label = {s["row"].label: s for s in summary}
    ddp, fp32 = by_label.get("DDP"), by_label.get("DiLoCo fp32")
    loads = [r["loadavg_1m"] for r in runs if "loadavg_1m" in r]
    lines = [
        "# Compression vs quality (simulated swarm)",
        "",
        f"Machine: {meta['machine']}. Date: {meta['date']}."
        + (f" Load average (1 min) when runs finished: {min(loads):.1f}-{max(loads):.1f} on the 2 cores "
           "(other benchmarks shared the machine; wall times are not comparable, losses and bytes are exact)."
           if loads else ""),
        f"Command: `{meta['command']}`",
        "",
        f"Every row: the default model ({meta['numel']:,} parameters, byte-level GPT), the default corpus "
        f"(Python stdlib sources), {meta['peers']} peers on distinct shards, {steps} inner AdamW steps per peer "
        f"({meta['rounds']} rounds x H={meta['inner_steps']} unless the row says otherwise; {_shared_settings(runs)}); "
        "codec, outer optimizer, aggregator, H x rounds and "
        "the seeds in each row's columns are read from its runs' stored configs (every row passes "
        "`--aggregator mean` explicitly: this table measures compression, not robustness). "
        "DDP: the same peers and per-peer batch, gradients averaged every step, one AdamW step; its bytes are "
        "what a ring all-reduce of dense fp32 gradients moves (2 x 2(n-1)/n x 4 bytes x d per peer per step). "
        "DiLoCo rows: bytes are measured payload lengths; per peer per round = its upload + the n-1 payloads it "
        "downloads. 'fewer bytes than fp32' compares upload payloads (fp32: 4 B/param + 4 B header). "
        "Final val loss: mean over seeds (± half the range) on the fixed validation batches. Gaps are paired: "
        "computed on the seeds both rows have" + (f" (DiLoCo fp32's seeds differ by {_seed_spread(fp32)}, more than most codecs)."
                                                    if fp32 and len(fp32["by_seed"]) > 1 else "."),
        "",
        *_table(summary, fp32, fp32 and fp32["upload"]),
        "",
        *_off_aggregator_note(summary),
        "## Targets",
        "",
    ]
    if ddp and fp32:
        for s in summary:
            if s["row"].baseline != "diloco":
                continue
            gap = paired_gap(s, ddp)
            ratio = s["ddp_bytes"] / s["total"]
            ok = gap <= 3 and ratio >= 20
            lines.append(
                f"- {s['row'].label}: gap vs DDP {gap:+.1f}%, {ratio:.0f}x fewer bytes than DDP"
                + (" -> **meets 'within 3% of DDP with >= 20x fewer bytes'**" if ok else "") + "."
            )
        hits = [
            s for s in summary
            if s["row"].baseline == "diloco" and s["ddp_bytes"] / s["total"] >= 20 and paired_gap(s, ddp) <= 3
        ]
        lines.append(
            "- DiLoCo within 3% of DDP at equal inner steps sending >= 20x fewer bytes: "
            + (f"**reached by {', '.join(s['row'].label for s in hits)}**." if hits else "**not reached**.")
        )
    if fp32:
        hits = [
            s for s in summary
            if s["row"].baseline == "diloco" and fp32["upload"] / s["upload"] >= 100 and paired_gap(s, fp32) <= 2
        ]
        names = ", ".join(f"{s['row'].label} ({fp32['upload'] / s['upload']:.0f}x, {paired_gap(s, fp32):+.1f}%)" for s in hits)
        lines.append(
            f"- >= 100x fewer bytes than fp32 pseudo-gradients within 2% of DiLoCo fp32: "
            f"**{'reached by ' + names if hits else 'not reached'}**."
        )
    lines += ["", "![val loss vs cumulative bytes](compression.png)", ""]
    screening = sorted({total_steps(r) for r in runs} - {steps})
    for short in screening:
        ref_fp32, ref_ddp = reference_at_steps(runs, "DiLoCo fp32", short), reference_at_steps(runs, "DDP", short)
        lines += [
            f"## Screening at {short} inner steps per peer (1 seed)",
            "",
            f"Short runs to pick what gets a full run. References read off the full runs' curves at {short} steps: "
            + (f"DiLoCo fp32 {_per_seed(ref_fp32)}" if ref_fp32 else "DiLoCo fp32 -")
            + (f", DDP {_per_seed(ref_ddp)}." if ref_ddp else ", DDP -."),
            "The gap column is against that DiLoCo fp32 value on the same seed.",
            "",
            *_table(summarize(rows, runs, short), ref_fp32, fp32 and fp32["upload"]),
            "",
            *_off_aggregator_note(summarize(rows, runs, short)),
        ]
    if notes:
        lines += [notes.rstrip(), ""]
    return "\n".join(lines)


def write_plot(summary: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    colors = plt.cm.tab20.colors  # (20, 3): more rows than the default 10-colour cycle
    for i, s in enumerate(summary):
        ddp = s["row"].baseline == "ddp"
        # Cumulative bytes moved by all peers after each round; the curve starts at the first round.
        ax.plot(
            s["cumulative"], s["curve"], "--" if ddp else ("-" if i % 2 else "-."), color="k" if ddp else colors[i % 20],
            marker=".", markersize=3, label=f"{s['row'].label} ({s['final']:.3f})",
        )
    ax.set_xscale("log")
    ax.set_xlabel("cumulative bytes moved, all peers (log)")
    ax.set_ylabel("validation loss (nats/byte)")
    ax.set_title("validation loss vs bytes on the wire (4 simulated peers)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
