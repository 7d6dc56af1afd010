"""Bytes per peer per round of the public-swarm recipe beside fp32 DiLoCo, on real swarms (issue 21).

    .venv/bin/python scripts/bench_compressed.py --peers 4 8 12 --write-md
    .venv/bin/python scripts/bench_compressed.py --report-only --write-md   # the md again, from the JSON

One invocation runs every configuration at every n side by side, each a real local swarm on
loopback (a coordinator and n peer processes: scripts/measure_scale.py's run_swarm), and reads
every peer's per-round transport ledger both ways (measure_scale.ledger_rows): what a peer
exchanges with the coordinator's endpoint is control (headers, manifest, signed results list,
result submissions, heartbeats), the rest is data (payloads and slices to owners, aggregated
slices, what the coordinator fetches to gather θ_{r+1} and spot-check). Configurations, all in
the same exchange (sliced unless --mode says otherwise) and the same H and rounds:

  fp32 DiLoCo                    codec fp32, median, outer Nesterov: the reference of the ratios;
  public-swarm recipe            whatever `--recipe sparseloco` resolves to when the run starts
                                 (peer.run.recipes.recipe_overrides applied onto the run config as
                                 the CLI does; its H replaced by --inner-steps, as --inner-steps
                                 after --recipe would);
  sparseloco, dense aggregate    the recipe with exchange.result_codec = "": what the compressed
                                 aggregate buys (left out when the recipe's aggregate is dense).

Each JSON row stores the resolved config (and its hash), the codec, aggregator, f, result format,
outer, P (payload), A (aggregated result, summed over slices), the per-(peer, round) figures and
every ledger row. The md is a pure function of that JSON (write_markdown imports no torch and
reads nothing of the machine it runs on).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for extra in (str(ROOT), str(ROOT / "scripts")):
    if extra not in sys.path:
        sys.path.insert(0, extra)

from machine_info import machine_lines, write_keeping_notes  # noqa: E402
from stop_signals import unwind_on_stop_signals  # noqa: E402

REFERENCE = "fp32 DiLoCo"
RECIPE = "public-swarm recipe"
DENSE = "sparseloco, dense aggregate"
RATIO_TARGET = 100.0  # the recipe moves >= 100x fewer bytes per peer per round than fp32 DiLoCo
GROWTH_TARGET = 1.6  # the recipe at 12 peers moves <= 1.6x what it moves at 4
# (name in the JSON, what the ledger row holds): control is traffic with the coordinator's endpoint
FIGURES = ("sent", "received", "total", "control_sent", "control_received", "control_total",
           "data_sent", "data_received", "data_total")


def setup_overrides(recipe: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{config label: RunConfig overrides}, the recipe's as `recipe_overrides` returned them."""
    return {
        REFERENCE: {"compression.codec": "fp32", "aggregation.name": "median", "outer.name": "nesterov"},
        RECIPE: dict(recipe),
        DENSE: {**recipe, "exchange.result_codec": ""},
    }


def config_hash(config: dict) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:10]


def peer_round_figures(row: dict) -> dict[str, int]:
    """One (peer, round) of measure_scale.ledger_rows: bytes each way, split control / data."""
    control_sent, control_received = row["control_sent"], row["control_received"]
    return {"sent": row["sent"], "received": row["received"], "total": row["sent"] + row["received"],
            "control_sent": control_sent, "control_received": control_received,
            "control_total": control_sent + control_received,
            "data_sent": row["sent"] - control_sent, "data_received": row["received"] - control_received,
            "data_total": row["sent"] + row["received"] - control_sent - control_received}


def spread(values: list[float]) -> dict[str, float]:
    if not values:
        return {"mean": math.nan, "median": math.nan, "min": math.nan, "max": math.nan}
    return {"mean": statistics.fmean(values), "median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize_setup(label: str, config: dict, sizes: dict, run: dict, skip_rounds: int) -> dict:
    """One JSON row: how it ran (from the resolved config), P and A, and every figure over the
    (peer, round)s from round `skip_rounds` on (the first rounds hold joins and warm-up)."""
    from measure_scale import expected

    x, n = config["exchange"], config["rounds"]["expected_peers"]
    rows = [r for r in run["rows"] if r["round"] >= skip_rounds]
    kept = [peer_round_figures(r) for r in rows]
    figures = {name: spread([f[name] for f in kept]) for name in FIGURES}
    spot = x["spot_checks"] if x["mode"] == "sliced" else 0
    # P and A as the rounds made them (Rice-coded offsets vary in length): the mean payload a peer
    # sent and the mean aggregate it gathered; the codec's bounds where a run recorded none.
    payload = statistics.fmean([r["payload"] for r in rows]) if rows else sizes["payload"]
    gathered = [r["result_bytes"] for r in rows if r.get("result_bytes")]
    result = statistics.fmean(gathered) if gathered else sizes["result"]
    exp = expected(x["mode"], n, payload, result, x["replicas"], sizes["slices"], spot)
    return {
        "label": label, "peers": n, "codec": config["compression"]["codec"], "aggregator": config["aggregation"]["name"],
        "num_byzantine": config["aggregation"]["num_byzantine"], "result_format": sizes["result_format"],
        "result_codec": x.get("result_codec", ""), "outer": config["outer"]["name"], "outer_lr": config["outer"]["lr"],
        "error_feedback": config["compression"]["error_feedback"], "mode": x["mode"], "slices": sizes["slices"],
        "replicas": x["replicas"], "spot_checks": spot, "inner_steps": config["inner"]["steps"],
        "rounds": config["rounds"]["rounds"], "skip_rounds": skip_rounds, "config_hash": config_hash(config),
        "numel": sizes["numel"], "payload_bytes": payload, "result_bytes": result,
        "payload_bound": sizes["payload"], "result_bound": sizes["result"], "sizes_measured": bool(rows and gathered),
        "samples": len(kept), "figures": figures,
        "expected_data_received": exp["received"], "expected_data_sent": exp["sent"],
        "data_received_vs_expected": figures["data_received"]["mean"] / exp["received"],
        "wall_s": run["wall_s"], "problems": run["problems"], "ok": not run["problems"], "config": config,
        "rows": run["rows"],
    }


def measure(args) -> tuple[list[dict], list[str], dict]:
    from machine_info import load_average
    from measure_scale import exchange_sizes, run_config, run_swarm
    from peer.cli.run_flags import resolve_run_config
    from peer.run.recipes import recipe_overrides

    base = Path(args.workdir or tempfile.mkdtemp(prefix="swarmloco-compressed-"))
    recipe = recipe_overrides(args.recipe)
    runs, skipped = [], []
    for label, overrides in setup_overrides(recipe).items():
        if label not in args.configs:
            continue
        for n in args.peers:
            start = run_config(peers=n, rounds=args.rounds, inner_steps=args.inner_steps, codec="fp32", mode=args.mode,
                               slices=args.slices, replicas=args.replicas, spot_checks=args.spot_checks)
            model = {"model.preset": args.preset} if args.preset else {}
            cfg = resolve_run_config(start, {**overrides, "inner.steps": args.inner_steps, **model})
            config = cfg.to_dict()
            if twin := next((r["label"] for r in runs if r["peers"] == n and r["config"] == config), None):
                skipped.append(f"{label} at n = {n}: the same run config as {twin!r} (config {config_hash(config)})")
                print(f"{label} n={n}: skipped, the same config as {twin}", flush=True)
                continue
            sizes = exchange_sizes(cfg)
            print(f"{label} n={n}: {cfg.compression.codec}, {cfg.aggregation.name} f={cfg.aggregation.num_byzantine}, "
                  f"result {sizes['result_format']}, outer {cfg.outer.name}; P {sizes['payload']:,} B, A {sizes['result']:,} B; "
                  f"running ({args.rounds} rounds x H = {args.inner_steps})", flush=True)
            load_before = load_average()
            run = run_swarm(cfg, peers=n, workdir=base / f"{label.replace(' ', '_').replace(',', '')}-{n}")
            row = summarize_setup(label, config, sizes, run, args.skip_rounds)
            row["load_before"], row["load_after"] = load_before, load_average()
            runs.append(row)
            f = row["figures"]
            print(f"  {run['wall_s']:.0f} s; total {f['total']['mean']:,.0f} B/peer/round (control {f['control_total']['mean']:,.0f}, "
                  f"data {f['data_total']['mean']:,.0f}); load {row['load_after']}", flush=True)
            for problem in row["problems"]:
                print(f"  PROBLEM: {problem}", flush=True)
    return runs, skipped, {"name": args.recipe, "overrides": recipe}


# --- report: a pure function of the JSON ------------------------------------------------------


def kilobytes(x: float) -> str:
    return f"{x / 1e3:,.1f}"


def cell(s: dict) -> str:
    """mean (median; min–max) in KB."""
    return f"{kilobytes(s['mean'])} ({kilobytes(s['median'])}; {kilobytes(s['min'])}–{kilobytes(s['max'])})"


def ratios(runs: list[dict], figure: str = "total") -> dict[tuple[str, int], float]:
    """(label, n) -> fp32 DiLoCo's mean `figure` at that n over this row's, both from the same invocation."""
    reference = {r["peers"]: r for r in runs if r["label"] == REFERENCE and r["ok"]}
    return {(r["label"], r["peers"]): reference[r["peers"]]["figures"][figure]["mean"] / r["figures"][figure]["mean"]
            for r in runs if r["ok"] and r["peers"] in reference}


def growth(runs: list[dict]) -> list[dict]:
    """Per config: its smallest and largest swarm's figures, the larger over the smaller."""
    out = []
    for label in dict.fromkeys(r["label"] for r in runs):
        group = sorted((r for r in runs if r["label"] == label and r["ok"]), key=lambda r: r["peers"])
        if len(group) < 2:
            continue
        lo, hi = group[0], group[-1]
        ratio = {name: hi["figures"][name]["mean"] / lo["figures"][name]["mean"] for name in ("total", "control_total", "data_total")}
        out.append({"label": label, "small": lo["peers"], "large": hi["peers"], "lo": lo, "hi": hi, **ratio,
                    "total_median": hi["figures"]["total"]["median"] / lo["figures"]["total"]["median"]})
    return out


def how_it_ran(r: dict) -> str:
    """The deciding fields of a row, as table cells: codec, aggregator (f), result format, outer, exchange, H."""
    f = f" (f = {r['num_byzantine']})" if r["num_byzantine"] else ""
    lr = f" lr {r['outer_lr']:g}" if r["outer_lr"] is not None else ""
    return (f"{r['codec']} | {r['aggregator']}{f} | {r['result_format']} | {r['outer']}{lr} | {r['mode']} "
            f"(S {r['slices']}, r {r['replicas']}, k {r['spot_checks']}) | {r['inner_steps']} | `{r['config_hash']}`")


def target_lines(runs: list[dict]) -> list[str]:
    lines = ["## Targets (issue 21), from the rows above", ""]
    recipe = sorted((r for r in runs if r["label"] == RECIPE), key=lambda r: r["peers"])
    total, data = ratios(runs), ratios(runs, "data_total")
    measured = [r for r in recipe if (RECIPE, r["peers"]) in total]
    if measured:
        worst = min(total[(RECIPE, r["peers"])] for r in measured)
        missing = [r["peers"] for r in recipe if r not in measured]
        verdict = "reached" if worst >= RATIO_TARGET and not missing else "NOT reached"
        per_n = "; ".join(f"{r['peers']} peers: {total[(RECIPE, r['peers'])]:,.1f}x (data only {data[(RECIPE, r['peers'])]:,.1f}x)"
                          for r in measured)
        lines.append(f"- **{RECIPE} ≥ {RATIO_TARGET:.0f}x fewer bytes per peer per round than {REFERENCE} in the same exchange: "
                     f"{verdict}**, at worst {worst:,.1f}x — {per_n} (sent + received, mean over peers and rounds)"
                     + (f"; no ratio at n = {', '.join(map(str, missing))} (a run failed)" if missing else "") + ".")
    else:
        lines.append(f"- **{RECIPE} ≥ {RATIO_TARGET:.0f}x fewer bytes than {REFERENCE}: NOT reached** — no pair of successful runs at one n.")
    g = next((g for g in growth(runs) if g["label"] == RECIPE), None)
    if g is None:
        lines.append(f"- **{RECIPE} at 12 peers ≤ {GROWTH_TARGET}x what it moves at 4: NOT reached** — fewer than two successful sizes.")
    else:
        sizes = "" if (g["small"], g["large"]) == (4, 12) else f" (this run measured {g['small']} and {g['large']} peers, not 4 and 12)"
        verdict = "reached" if g["total"] <= GROWTH_TARGET and (g["small"], g["large"]) == (4, 12) else "NOT reached"
        lines.append(f"- **{RECIPE} at {g['large']} peers ≤ {GROWTH_TARGET}x what it moves at {g['small']}: {verdict}**, "
                     f"{g['total']:.2f}x ({kilobytes(g['lo']['figures']['total']['mean'])} -> "
                     f"{kilobytes(g['hi']['figures']['total']['mean'])} KB; medians {g['total_median']:.2f}x; control "
                     f"{g['control_total']:.2f}x, data {g['data_total']:.2f}x){sizes}.")
    return lines + [""]


INTRO = """\
# Compressed exchange: bytes per peer per round, public-swarm recipe vs fp32 DiLoCo (measured)

Written by `scripts/bench_compressed.py` (method in its docstring) from `benchmarks/compressed_exchange.json`,
all rows in one invocation, side by side. Real local swarms on loopback (a coordinator and n peer processes),
default demo model; bytes are each peer's transport ledger (serialized protobuf sizes of every RPC, by
counterpart and round), both directions. control = a peer's traffic with the coordinator's endpoint (headers,
manifest, signed results, heartbeats); data = the rest (payloads to slice owners, aggregated slices, what the
coordinator fetches to gather θ_{r+1} and spot-check). Figures are per (peer, round) after the first rounds
(joins, warm-up): mean (median; min–max), in KB (10^3 bytes). P = payload, A = aggregated result (all
slices), both the mean of what the rounds measured (a peer's encoded update; the aggregate it gathered). "fp32 / this" is fp32 DiLoCo's mean at the same n over this row's, from the same invocation.
"""


def _ratio_cell(table: dict[tuple[str, int], float], r: dict) -> str:
    key = (r["label"], r["peers"])
    return f"{table[key]:,.1f}x" if key in table else "-"


def table(columns: list[tuple[str, str, Any]], runs: list[dict]) -> list[str]:
    """A markdown table: one row per run, columns (title, alignment '---' or '---:', run -> cell)."""
    lines = ["| " + " | ".join(c[0] for c in columns) + " |", "|" + "|".join(c[1] for c in columns) + "|"]
    return lines + ["| " + " | ".join(str(c[2](r)) for c in columns) + " |" for r in runs]


def bytes_columns(runs: list[dict]) -> list[tuple[str, str, Any]]:
    total = ratios(runs)
    figure = lambda name: lambda r: cell(r["figures"][name])  # noqa: E731
    return [("config", "---", lambda r: r["label"]), ("n", "---:", lambda r: r["peers"]),
            ("codec | aggregator | result format | outer | exchange | H | config hash", "---|---|---|---|---|---:|---", how_it_ran),
            ("P (KB)", "---:", lambda r: kilobytes(r["payload_bytes"])), ("A (KB)", "---:", lambda r: kilobytes(r["result_bytes"])),
            ("sent KB", "---", figure("sent")), ("received KB", "---", figure("received")), ("total KB", "---", figure("total")),
            ("fp32 / this (total)", "---:", lambda r: _ratio_cell(total, r)),
            ("all in sync", "---", lambda r: "yes" if r["ok"] else "NO: " + "; ".join(r["problems"])),
            ("load (1/5/15 min) before → after", "---", lambda r: f"{r.get('load_before', '-')} → {r.get('load_after', '-')}")]


def split_columns(runs: list[dict]) -> list[tuple[str, str, Any]]:
    data = ratios(runs, "data_total")
    figure = lambda name: (name.replace("_", " ") + " KB", "---", lambda r: cell(r["figures"][name]))  # noqa: E731
    return [("config", "---", lambda r: r["label"]), ("n", "---:", lambda r: r["peers"]),
            ("result format", "---", lambda r: r["result_format"]), ("config hash", "---", lambda r: f"`{r['config_hash']}`"),
            *(figure(name) for name in FIGURES[3:]),
            ("data / expected (received)", "---:", lambda r: f"{r['data_received_vs_expected']:.3f}"),
            ("fp32 / this (data)", "---:", lambda r: _ratio_cell(data, r))]


def growth_lines(runs: list[dict]) -> list[str]:
    groups = growth(runs)
    if not groups:
        return ["No config ran at two sizes successfully.", ""]
    return table([("config", "---", lambda g: g["label"]), ("codec", "---", lambda g: g["hi"]["codec"]),
                  ("result format", "---", lambda g: g["hi"]["result_format"]),
                  ("n", "---", lambda g: f"{g['small']} -> {g['large']}"),
                  ("total KB, small -> large", "---",
                   lambda g: f"{kilobytes(g['lo']['figures']['total']['mean'])} -> {kilobytes(g['hi']['figures']['total']['mean'])}"),
                  ("total, mean", "---:", lambda g: f"{g['total']:.2f}x"), ("total, median", "---:", lambda g: f"{g['total_median']:.2f}x"),
                  ("control", "---:", lambda g: f"{g['control_total']:.2f}x"), ("data", "---:", lambda g: f"{g['data_total']:.2f}x")],
                 groups) + [""]


def method_means(run: dict) -> dict[str, tuple[float, float]]:
    """{rpc: (sent, received)} mean bytes per (peer, round) over the row's kept rounds, from the
    ledger's per-RPC split ("served:X": what the peer answered to others' calls of X)."""
    kept = [r for r in run["rows"] if r["round"] >= run["skip_rounds"] and "by_method" in r]
    totals: dict[str, list[float]] = {}
    for row in kept:
        for method, (sent, received) in row["by_method"].items():
            t = totals.setdefault(method, [0.0, 0.0])
            t[0] += sent
            t[1] += received
    return {m: (t[0] / len(kept), t[1] / len(kept)) for m, t in totals.items()} if kept else {}


def method_lines(runs: list[dict]) -> list[str]:
    """Bytes per peer per round by RPC (the public-swarm rows): where a round's bytes go."""
    rows = [(r, method_means(r)) for r in runs if r["label"] == RECIPE]
    rows = [(r, m) for r, m in rows if m]
    if not rows:
        return []
    methods = sorted({m for _, means in rows for m in means}, key=lambda m: -max(sum(means.get(m, (0, 0))) for _, means in rows))
    lines = ["## Where the public-swarm recipe's bytes go, by RPC", "",
             "Mean KB per peer per round, sent / received, from every peer's ledger split by the RPC that moved the bytes; "
             "`served:X` is what the peer answered to others' X calls (payload slices to owners, aggregated slices, the "
             "coordinator's gather); the rest are its own calls (to the coordinator: control; FetchPayload: data).", "",
             "| RPC | " + " | ".join(f"n = {r['peers']}" for r, _ in rows) + " |", "|---|" + "---:|" * len(rows)]
    for method in methods:
        cells = [f"{means[method][0] / 1e3:,.1f} / {means[method][1] / 1e3:,.1f}" if method in means else "-" for _, means in rows]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines + [""]


def write_markdown(path: Path, data: dict) -> None:
    runs, inv, recipe = data["runs"], data["invocation"], data["recipe"]
    resolved = ", ".join(f"`{k}` = `{v!r}`" for k, v in recipe["overrides"].items())
    lines = [INTRO, f"- `--recipe {recipe['name']}` resolved at run time to: {resolved} (its `inner.steps` replaced by the H "
             "below for every row)", *machine_lines(inv.get("machine"), inv.get("load_before"), inv.get("load_after")),
             f"- command: `{inv['command']}`; {inv['wall_s'] / 60:.1f} min", *(f"- skipped: {s}" for s in data.get("skipped", [])), ""]
    if runs:
        first = runs[0]
        lines += [f"Every row: H = {first['inner_steps']} inner steps, {first['rounds']} rounds, the first {first['skip_rounds']} "
                  f"left out: each row's figures are over {first['rounds'] - first['skip_rounds']} round(s) x its n peers.", ""]
    lines += ["## Bytes per peer per round", "", *table(bytes_columns(runs), runs), "",
              "## Control vs data", "", *table(split_columns(runs), runs), "",
              "data / expected: the mean data received over docs/sliced-exchange.md's formula with the spot checks",
              "(scripts/measure_scale.py's `expected`, with this row's P, A, S, r and k).", "",
              *method_lines(runs),
              "## Growth from the smallest to the largest swarm", "", *growth_lines(runs), *target_lines(runs)]
    write_keeping_notes(path, "\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    from measure_scale import add_swarm_arguments

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", type=int, nargs="+", default=[4, 8, 12])
    parser.add_argument("--configs", nargs="+", default=[REFERENCE, RECIPE, DENSE], choices=[REFERENCE, RECIPE, DENSE])
    parser.add_argument("--recipe", default="sparseloco", help="the recipe of the public-swarm rows")
    parser.add_argument("--mode", default="sliced", choices=["sliced", "all-to-all"], help="the exchange of every row")
    parser.add_argument("--preset", default="", help="model.preset of every row (e.g. llama-20m; default: the demo model)")
    add_swarm_arguments(parser)  # --rounds, --inner-steps (H of every row, the recipe's own replaced), --slices, ...
    parser.add_argument("--json", default=str(ROOT / "benchmarks/compressed_exchange.json"))
    parser.add_argument("--write-md", nargs="?", const=str(ROOT / "benchmarks/compressed_exchange.md"), metavar="PATH")
    parser.add_argument("--report-only", action="store_true", help="rewrite --write-md from --json without running anything")
    args = parser.parse_args(argv)
    if args.report_only:
        if not Path(args.json).exists():
            parser.error(f"--report-only: {args.json} does not exist; run the measurement first")
        write_markdown(Path(args.write_md or ROOT / "benchmarks/compressed_exchange.md"), json.loads(Path(args.json).read_text()))
        return 0
    from machine_info import command_line, load_average, machine_facts

    unwind_on_stop_signals()  # through Swarm's cleanup: no orphaned swarm
    started, load_before = time.monotonic(), load_average()
    runs, skipped, recipe = measure(args)
    invocation = {"command": command_line(), "load_before": load_before, "load_after": load_average(),
                  "machine": machine_facts(), "wall_s": time.monotonic() - started}
    data = {"runs": runs, "skipped": skipped, "recipe": recipe, "invocation": invocation}
    Path(args.json).write_text(json.dumps(data, indent=1))
    print(f"wrote {args.json}")
    if args.write_md:
        write_markdown(Path(args.write_md), data)
        print(f"wrote {args.write_md}")
    return 0 if runs and all(r["ok"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
