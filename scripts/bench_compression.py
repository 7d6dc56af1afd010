"""Compression vs quality: every codec / outer optimizer on the same simulated swarm.

Same model, corpus, peers, inner steps and rounds for every row (swarmloco simulate underneath,
so the bytes are real payload lengths). Writes benchmarks/compression.json (raw results, one per
row and seed), benchmarks/compression.md (table, machine, exact command) and
benchmarks/compression.png (validation loss vs cumulative bytes, log x).

    .venv/bin/python scripts/bench_compression.py                 # the full table (~25 min on 2 cores)
    .venv/bin/python scripts/bench_compression.py --rounds 2 --inner-steps 2 --rows "DDP,DiLoCo fp32"  # smoke
    .venv/bin/python scripts/bench_compression.py --report-only   # redo md/png from the JSON

Runs go to a pool of --workers processes with one torch thread each (on a small CPU two
single-threaded runs beat one two-threaded run). --resume keeps a stored (row, seed, total steps)
run only if its stored run config equals the config the row would run with now; a run whose config
differs (say, a default aggregator changed since) is dropped and run again. A config field added to
RunConfig after a run was stored is listed, not a reason to re-run (new fields come with defaults
that keep the old behaviour; a changed value of an existing field is always re-run).

Screening: `--rounds 12 --resume --rows ...` adds shorter runs to the same JSON; the report puts
them in a separate table, each compared with the full-length DDP and DiLoCo fp32 runs at the same
number of inner steps (the inner lr is constant after its warm-up, so the first 12 rounds of a
24-round run ARE a 12-round run). A row may use its own H (`inner_steps`); it then runs
total_steps / H rounds, so every row trains the same number of inner steps per peer.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from peer.run.config import RunConfig  # noqa: E402
from peer.cli.simulate import SimulationOptions, run_simulation  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "benchmarks"


@dataclass(frozen=True)
class Row:
    label: str
    codec: str = "fp32"
    outer: str = "nesterov"
    outer_options: dict[str, Any] = field(default_factory=dict)  # OuterConfig overrides
    baseline: str = "diloco"
    # Stated per row and passed explicitly: this table measures compression, not robustness, so it
    # must not follow the run default (median since the Byzantine bench). DDP averages gradients.
    aggregator: str = "mean"
    inner_steps: int | None = None  # H; None: the bench's --inner-steps. Rounds = total steps / H.
    seeds: int = 2  # runs with seeds 0..seeds-1; mean and spread reported; 0: only when named in --rows
    note: str = ""


ROWS: list[Row] = [
    Row("DDP", baseline="ddp", codec="-", outer="-", seeds=1, note="fp32 gradient all-reduce every inner step"),
    Row("DiLoCo fp32", codec="fp32", note="reference for the loss gap"),
    Row("fp16", codec="fp16", seeds=1),
    Row("int8", codec="int8", seeds=1),
    Row("int4", codec="int4", seeds=1),
    Row("topk 1% + int8", codec="topk:0.01+int8", note="error feedback"),
    Row("topk 1% + int4", codec="topk:0.01+int4", seeds=1, note="error feedback"),
    Row("DeMo (paper lr)", codec="dct-topk:64:4", outer="demo", seeds=1, note="DeMo defaults: decay 0.999, sign step 1e-3"),
    Row(
        "DeMo lr 5e-3 + int8", codec="dct-topk:64:4+int8", outer="demo", outer_options={"demo_lr": 5e-3}, seeds=1,
        note="sign step scaled for H=25 inner steps",
    ),
    # Not in the default table (time); run with --rows "LABEL" --resume to add them.
    Row("int2", codec="int2", seeds=0),
    Row("chunk-topk 64:1 + int8", codec="chunk-topk:64:1+int8", seeds=0, note="error feedback, 1-byte offsets"),
    Row("randk 5% + fp16", codec="randk:0.05+fp16", seeds=0, note="error feedback, shared index set, no index bytes"),
    # Closing the DiLoCo-vs-DDP gap: outer lr/momentum, and a smaller H paid for by a cheaper codec.
    Row("fp16 outer 1.0/0.9", codec="fp16", outer_options={"lr": 1.0}, seeds=0),
    Row("fp16 outer 0.5/0.9", codec="fp16", outer_options={"lr": 0.5}, seeds=0),
    Row("fp16 outer 0.7/0.8", codec="fp16", outer_options={"momentum": 0.8}, seeds=0),
    Row("fp16 outer 0.7/0.7", codec="fp16", outer_options={"momentum": 0.7}, seeds=0),
    Row("int8 H=12", codec="int8", inner_steps=12, seeds=0, note="twice the rounds, same inner steps"),
    Row("int4 H=12", codec="int4", inner_steps=12, seeds=0, note="twice the rounds, same inner steps"),
    Row("int4 H=10", codec="int4", inner_steps=10, seeds=0, note="2.5x the rounds, same inner steps"),
    Row("int4 H=5", codec="int4", inner_steps=5, seeds=0, note="5x the rounds, same inner steps"),
    # >= 100x fewer bytes than fp32: error feedback as the momentum (SparseLoCo): outer SGD, no momentum.
    Row("topk 1% + int8 SGD lr1", codec="topk:0.01+int8", outer_options={"momentum": 0.0, "lr": 1.0}, seeds=0,
        note="error feedback, outer SGD lr 1 momentum 0"),
    Row("topk 1% + sign SGD lr1", codec="topk:0.01+sign", outer_options={"momentum": 0.0, "lr": 1.0}, seeds=0,
        note="error feedback, outer SGD lr 1 momentum 0"),
    Row("chunk-topk 32:1 + sign SGD lr1", codec="chunk-topk:32:1+sign", outer_options={"momentum": 0.0, "lr": 1.0},
        seeds=0, note="error feedback, 1-byte offsets, outer SGD lr 1"),
    Row("randk 20% + sign", codec="randk:0.2+sign", seeds=0, note="error feedback, shared index set"),
    Row("randk 20% + sign SGD lr1", codec="randk:0.2+sign", outer_options={"momentum": 0.0, "lr": 1.0}, seeds=0,
        note="error feedback, shared index set, outer SGD lr 1"),
    Row("chunk-topk 32:1 + sign", codec="chunk-topk:32:1+sign", seeds=0, note="error feedback, 1-byte offsets"),
    Row("chunk-topk 32:1 + sign SGD lr2", codec="chunk-topk:32:1+sign", outer_options={"momentum": 0.0, "lr": 2.0},
        seeds=0, note="error feedback, 1-byte offsets, outer SGD lr 2"),
    Row("chunk-topk 32:1 + sign SGD lr4", codec="chunk-topk:32:1+sign", outer_options={"momentum": 0.0, "lr": 4.0},
        seeds=0, note="error feedback, 1-byte offsets, outer SGD lr 4"),
    Row("chunk-topk 32:1 + sign SGD lr8", codec="chunk-topk:32:1+sign", outer_options={"momentum": 0.0, "lr": 8.0},
        seeds=0, note="error feedback, 1-byte offsets, outer SGD lr 8"),
    Row("randk 20% + sign SGD lr4", codec="randk:0.2+sign", outer_options={"momentum": 0.0, "lr": 4.0}, seeds=0,
        note="error feedback, shared index set, outer SGD lr 4"),
    Row("topk 1% + sign SGD lr4", codec="topk:0.01+sign", outer_options={"momentum": 0.0, "lr": 4.0}, seeds=0,
        note="error feedback, outer SGD lr 4"),
    Row("fp16 SGD lr1", codec="fp16", outer_options={"momentum": 0.0, "lr": 1.0}, seeds=0,
        note="dense reference for the SGD-lr-1 rows (= FedAvg)"),
    Row("DeMo dct 64:1 lr 5e-3 + int8", codec="dct-topk:64:1+int8", outer="demo",
        outer_options={"demo_lr": 5e-3, "demo_topk": 1}, seeds=0, note="1 DCT coefficient per chunk of 64"),
]


def row_schedule(row: Row, total_steps: int, default_h: int) -> tuple[int, int]:
    """(rounds, H) for `row` so that it trains total_steps inner steps per peer."""
    h = row.inner_steps or default_h
    if total_steps % h:
        raise ValueError(f"row {row.label!r}: H={h} does not divide {total_steps} inner steps; change --rounds")
    return total_steps // h, h


def total_steps(run: dict[str, Any]) -> int:
    return run["rounds"] * run["inner_steps"]


def row_options(row: Row, seed: int, peers: int, rounds: int, inner_steps: int) -> SimulationOptions:
    """What `row` runs: every setting explicit, so a changed run default cannot change a row."""
    cfg = RunConfig()
    cfg = dataclasses.replace(
        cfg,
        outer=dataclasses.replace(cfg.outer, **row.outer_options),
        # simulate computes the all-to-all exchange (every peer aggregates every update): say so,
        # rather than store whatever the node's default exchange mode is at the time.
        exchange=dataclasses.replace(cfg.exchange, mode="all-to-all"),
    )
    return SimulationOptions(
        peers=peers, rounds=rounds, inner_steps=inner_steps, seed=seed, threads=1, config=cfg,
        baseline=row.baseline,  # type: ignore[arg-type]
        codec=None if row.baseline == "ddp" else row.codec,
        outer=None if row.baseline == "ddp" else row.outer,
        aggregator=row.aggregator,
    )


def run_one(row: Row, seed: int, peers: int, rounds: int, inner_steps: int) -> dict[str, Any]:
    result = run_simulation(row_options(row, seed, peers, rounds, inner_steps))
    result["label"] = row.label
    return result


def config_changes(stored: dict[str, Any], now: dict[str, Any], prefix: str = "") -> tuple[list[str], list[str]]:
    """(changed, added): dotted keys whose value differs between a stored run config and the one the
    row would run now, and keys that exist only now (fields added to RunConfig since the run)."""
    changed, added = [], []
    for key in sorted(set(stored) | set(now)):
        path = prefix + key
        if key not in now:
            changed.append(f"{path} (no longer a config field)")
        elif key not in stored:
            added.append(path)
        elif isinstance(stored[key], dict) and isinstance(now[key], dict):
            more_changed, more_added = config_changes(stored[key], now[key], path + ".")
            changed += more_changed
            added += more_added
        elif stored[key] != now[key]:
            changed.append(f"{path}: {stored[key]!r} -> {now[key]!r}")
    return changed, added


def _compared(config: dict[str, Any]) -> dict[str, Any]:
    """The config as compared on --resume. DeMo steps by demo_lr in every stored shape: before
    955ccf1 it ignored outer.lr (which then held Nesterov's 0.7), since then outer.lr defaults to
    demo_lr; the DeMo rows set only demo_lr, so outer.lr says nothing about a DeMo run."""
    if config["outer"]["name"] != "demo":
        return config
    return {**config, "outer": {k: v for k, v in config["outer"].items() if k != "lr"}}


def stale_runs(
    runs: list[dict[str, Any]], rows: list[Row], peers: int, default_h: int, steps: int
) -> dict[int, list[str]]:
    """{index in runs: what changed} for the stored runs of `rows` at `steps` inner steps per peer
    whose config differs from what the row runs now; runs of other rows or lengths are left alone
    (this invocation would not run them again)."""
    by_label = {row.label: row for row in rows}
    stale = {}
    for i, run in enumerate(runs):
        row = by_label.get(run["label"])
        if row is None or total_steps(run) != steps:
            continue
        rounds, h = row_schedule(row, steps, default_h)
        now = row_options(row, run["seed"], peers, rounds, h).run_config().to_dict()
        changed, _ = config_changes(_compared(run["config"]), _compared(now))
        if changed or run["baseline"] != row.baseline or run["peers"] != peers:
            stale[i] = changed or [f"baseline/peers {run['baseline']}/{run['peers']} -> {row.baseline}/{peers}"]
    return stale


# --- report ----------------------------------------------------------------------------------


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


def write_report(runs: list[dict[str, Any]], meta: dict[str, Any], notes: str = "") -> str:
    steps = meta["rounds"] * meta["inner_steps"]
    summary = summarize(ROWS, runs, steps)
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
            *_table(summarize(ROWS, runs, short), ref_fp32, fp32 and fp32["upload"]),
            "",
            *_off_aggregator_note(summarize(ROWS, runs, short)),
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


# --- main ------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=24)
    parser.add_argument("--inner-steps", type=int, default=25)
    parser.add_argument("--seeds", type=int, default=None, help="override every row's number of seeds")
    parser.add_argument("--rows", default=None, help="comma-separated row labels to run (default: all)")
    parser.add_argument("--workers", type=int, default=2, help="parallel single-threaded runs")
    parser.add_argument("--resume", action="store_true", help="keep runs already in the JSON, run the rest")
    parser.add_argument("--report-only", action="store_true", help="rewrite md/png from the JSON, run nothing")
    parser.add_argument("--out", type=Path, default=OUT, help="output folder (default: benchmarks/)")
    parser.add_argument("--notes", type=Path, default=None, help="markdown file of findings kept in the JSON and appended to the md")
    args = parser.parse_args()

    rows = ROWS
    if args.rows:
        wanted = [label.strip() for label in args.rows.split(",")]
        unknown = [w for w in wanted if w not in {r.label for r in ROWS}]
        if unknown:
            parser.error(f"unknown row(s) {unknown}; rows: {', '.join(r.label for r in ROWS)}")
        rows = [next(r for r in ROWS if r.label == w) for w in wanted]  # in the order given: priorities
    else:
        rows = [r for r in ROWS if r.seeds > 0]
    args.out.mkdir(parents=True, exist_ok=True)
    json_path = args.out / "compression.json"
    previous = json.loads(json_path.read_text()) if json_path.exists() and (args.resume or args.report_only) else None
    command = shlex.join(["python", "scripts/bench_compression.py", *sys.argv[1:]])
    if previous:  # the main table keeps the first invocation's setup; results come from several: name them all
        meta = previous["meta"]
        if not args.report_only:
            meta["command"] = f"{meta['command']}` then `{command}"
    else:
        meta = {
            "command": command, "machine": machine(), "date": time.strftime("%Y-%m-%d"),
            "peers": args.peers, "rounds": args.rounds, "inner_steps": args.inner_steps,
        }
    if args.notes:
        meta["notes"] = args.notes.read_text()
    runs: list[dict[str, Any]] = previous["runs"] if previous else []
    steps = args.rounds * args.inner_steps

    if not args.report_only:
        stale = stale_runs(runs, rows, args.peers, args.inner_steps, steps)
        for i, changed in stale.items():
            print(f"re-running {runs[i]['label']} seed {runs[i]['seed']}: config changed: {'; '.join(changed)}", flush=True)
        # A stale run stays in the JSON until its re-run lands: a cut-short bench keeps the old
        # result, and the table shows the aggregator it really ran with.
        done = {(r["label"], r["seed"], total_steps(r)) for i, r in enumerate(runs) if i not in stale}
        seeds = {row.label: args.seeds or row.seeds or 1 for row in rows}
        jobs = [  # every row's first seed before any second seed: a cut-short bench still covers every row
            (row, seed)
            for seed in range(max(seeds.values(), default=0))
            for row in rows
            if seed < seeds[row.label] and (row.label, seed, steps) not in done
        ]
        schedules = {row.label: row_schedule(row, steps, args.inner_steps) for row in rows}  # refuse bad H early
        print(f"{len(jobs)} runs of {steps} inner steps on {args.workers} workers", flush=True)
        context = multiprocessing.get_context("spawn")  # no torch thread pools inherited through fork
        with ProcessPoolExecutor(args.workers, mp_context=context) as pool:
            futures = {
                pool.submit(run_one, row, seed, args.peers, *schedules[row.label]): (row, seed) for row, seed in jobs
            }
            for future in as_completed(futures):
                result = future.result()
                result["loadavg_1m"] = os.getloadavg()[0]  # the machine is shared: say how busy it was
                key = (result["label"], result["seed"], total_steps(result))
                runs = [r for r in runs if (r["label"], r["seed"], total_steps(r)) != key] + [result]
                print(
                    f"{result['label']:<34} seed {result['seed']} | {result['rounds']}x{result['inner_steps']} | "
                    f"final val {result['final_val_loss']:.4f} | "
                    f"{_human(result['bytes_per_peer_per_round'])}/peer/round | {result['wall_s']:.0f}s",
                    flush=True,
                )
                meta["numel"] = result["numel"]
                json_path.write_text(json.dumps({"meta": meta, "runs": runs}, indent=1) + "\n")

    meta.setdefault("numel", runs[0]["numel"] if runs else 0)
    json_path.write_text(json.dumps({"meta": meta, "runs": runs}, indent=1) + "\n")
    (args.out / "compression.md").write_text(write_report(runs, meta, meta.get("notes", "")))
    write_plot(summarize(ROWS, runs, meta["rounds"] * meta["inner_steps"]), args.out / "compression.png")
    print(f"wrote {args.out / 'compression.md'}, compression.png, compression.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
