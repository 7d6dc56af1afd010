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
import shlex
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from peer.run.config import RunConfig  # noqa: E402
from peer.cli.simulate import SimulationOptions, run_simulation  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compression_report import _human, machine, summarize, total_steps, write_plot, write_report  # noqa: E402

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
    (args.out / "compression.md").write_text(write_report(ROWS, runs, meta, meta.get("notes", "")))
    write_plot(summarize(ROWS, runs, meta["rounds"] * meta["inner_steps"]), args.out / "compression.png")
    print(f"wrote {args.out / 'compression.md'}, compression.png, compression.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
