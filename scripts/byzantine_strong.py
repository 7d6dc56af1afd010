"""Byzantine benchmark, the strong attacks (issue 15): every attack x every rule at f = 2 and f = 3
of 8 peers, 2 seeds, outer Nesterov as users run it, through `swarmloco simulate`.

Attacks: the ten of the first grid (sign-flip x4 as there), min-max and min-sum (Shejwalkar &
Houmansadr 2021) with the inverse-unit-vector and the inverse-std perturbation, and agr-tailored
aimed at median (the old default) and at dnc. Rules: the seven of optim.aggregate, dnc, and the
pre-aggregation variants (nnm + centered-clip / trimmed-mean, bucketing by 2 + centered-clip
/ median: refused at f >= 2 of 8, 4 buckets < 2f + 1).

The whole grid (~580 runs) must fit about 40 CPU-minutes on a shared core, so the training setting
is shrunk (profile `strong`: d_model 32, seq 16, batch 4, H = 4, 6 rounds); the md states it.

    nice -n 15 .venv/bin/python scripts/byzantine_strong.py            # resumes from the JSON
    .venv/bin/python scripts/byzantine_strong.py --report-only         # rewrite byzantine.md only

Writes benchmarks/byzantine_strong.json (one record per run, each with a fingerprint of its run
config and attack: a run whose config changed since it was stored runs again) and rewrites
benchmarks/byzantine.md (strong_section: this grid's section from the JSON, laid into the md by
scripts/byzantine_report.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.byzantine_cases import (  # noqa: E402
    ATTACK_OPTIONS, CLASSIC_ATTACKS, CLEAN, OUT, PEERS, Case, Profile, gap, load, refusal, save, worst_case,
)
from scripts.byzantine_report import write_report  # noqa: E402
from scripts.byzantine_runs import run_all, run_case  # noqa: E402

PROFILES = {
    "strong": Profile(d_model=32, n_head=2, seq_len=16, batch_size=4, val_batches=4, inner_steps=4, warmup_steps=4,
                      rounds=6, max_corpus_bytes=1_000_000, outer="nesterov"),
    "tiny": Profile(d_model=16, n_head=2, seq_len=16, batch_size=2, val_batches=2, inner_steps=2, warmup_steps=2,
                    rounds=2, max_corpus_bytes=200_000, outer="nesterov"),
}
ATTACKS: list[tuple[str, dict[str, Any]]] = [(a, ATTACK_OPTIONS.get(a, {})) for a in CLASSIC_ATTACKS] + [
    ("min-max", {}), ("min-max", {"perturbation": "std"}), ("min-sum", {}), ("min-sum", {"perturbation": "std"}),
    ("agr-tailored", {}), ("agr-tailored", {"rule": "dnc"}),
]
RULES = ["mean", "median", "trimmed-mean", "krum", "multi-krum", "geometric-median", "centered-clip", "dnc",
         "centered-clip+nnm", "trimmed-mean+nnm", "centered-clip+bucket2", "median+bucket2"]
FS = (2, 3)
# Rules the sliced exchange (the default exchange.mode) refuses: they cannot be the default.
NOT_SLICEABLE = {r for r in RULES if refusal(r, 0, exchange="sliced")}


def label(name: str, options: dict[str, Any]) -> str:
    """The column name of an attack: its name, plus the options that differ from the grid's."""
    extra = {k: v for k, v in options.items() if ATTACK_OPTIONS.get(name, {}).get(k) != v}
    return name + ("(" + ",".join(f"{k}={v}" for k, v in sorted(extra.items())) + ")" if extra else "")


LABELS = [label(n, o) for n, o in ATTACKS]


def plan(seeds: list[int], rules: list[str]) -> list[Case]:
    cases = [Case("clean", "mean", 0, CLEAN, s) for s in seeds]  # the reference of every gap
    for f in FS:
        for rule in rules:
            for s in seeds:
                if rule != "mean":
                    cases.append(Case("strong", rule, f, CLEAN, s))
                cases += [Case("strong", rule, f, a, s, attack_options=tuple(sorted(o.items()))) for a, o in ATTACKS]
    return list({c.key: c for c in cases}.values())


def fingerprint(case: Case, profile: Profile) -> str:
    """sha256 of what the run depends on: its run config, attack and options, peers."""
    cfg = profile.config(case.seed, case.aggregator, case.f, case.codec, case.exchange).to_dict()
    what = {"config": cfg, "attack": case.attack, "options": dict(case.attack_options), "peers": PEERS,
            "code": [_source_sha(f) for f in _CODE if _CODE[f](case)]}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


# Modules whose code decides a run's numbers beyond its config: a change re-runs the runs that use them.
_ROOT = Path(__file__).resolve().parents[1]
_CODE = {
    "optim/attacks_minmax.py": lambda case: case.attack in ("min-max", "min-sum", "agr-tailored"),
    "optim/aggregate_dnc.py": lambda case: case.aggregator.startswith("dnc") or dict(case.attack_options).get("rule") == "dnc",
}


def _source_sha(relative: str) -> str:
    return hashlib.sha256((_ROOT / relative).read_bytes()).hexdigest()[:12]


def run(case: Case, profile: Profile) -> dict[str, Any]:
    return {**run_case(case, profile), "fingerprint": fingerprint(case, profile)}


# --- the report's section (byzantine.md) ------------------------------------------------------


def _pct(g: float | None) -> str:
    if g is None:
        return "-"
    return "diverged" if not math.isfinite(g) or g > 10 else f"{100 * g:+.1f}%"


def _cell(results: dict[str, dict], rule: str, f: int, attack: str) -> str:
    g, status = gap(results, rule, f, attack)
    return ("not run" if status == "missing" else status) if status != "ok" else _pct(g)


def summary(results: dict[str, dict], rule: str, f: int) -> dict[str, Any]:
    fp, st = gap(results, rule, f, CLEAN)
    w, attack, bad = worst_case(results, rule, f, LABELS)
    missing = [a for a in LABELS if gap(results, rule, f, a)[1] == "missing"]
    return {"clean": fp if st == "ok" else None, "status": st, "worst": w, "attack": attack, "bad": bad,
            "complete": st == "ok" and not bad and not missing}


def pick(results: dict[str, dict]) -> tuple[str | None, list[str]]:
    """The default: among rules the sliced exchange runs, that ran every attack at f = 2 and 3 and
    cost at most 1% with no attacker, the smallest worst case relative to its target
    (max(worst f=2 / 5%, worst f=3 / 10%))."""
    best, lines = None, []
    for rule in RULES:
        s2, s3 = summary(results, rule, 2), summary(results, rule, 3)
        if s2["status"] == "missing":
            continue
        why = []
        if rule in NOT_SLICEABLE:
            why.append("refused by the sliced exchange")
        if not (s2["complete"] and s3["complete"]):
            why.append("not every attack ran at f = 2 and 3")
        elif max(s2["clean"], s3["clean"]) > 0.01:
            why.append("costs over 1% with no attacker")
        score = None if not (s2["complete"] and s3["complete"]) else max(s2["worst"] / 0.05, s3["worst"] / 0.10)
        shown = "-" if score is None else ("diverged" if not math.isfinite(score) or score > 200 else f"{score:.2f}")
        lines.append(f"{rule}: score {shown}" + (f" ({'; '.join(why)})" if why else ""))
        if not why and (best is None or score < best[1]):
            best = (rule, score)
    return (best[0] if best else None), lines


def section(results: dict[str, dict], meta: dict[str, Any]) -> list[str]:
    """byzantine.md's section for this grid (empty when nothing ran)."""
    if not results:
        return []
    from peer.run.config import AggregationConfig

    p = meta.get("profile", {})
    ran = [r for r in results.values() if r["status"] == "ok"]
    earlier = "; earlier: " + "; ".join(meta["invocations"]) if meta.get("invocations") else ""
    md = ["## Strong attacks (issue 15): every attack x every rule at f = 2 and f = 3, outer Nesterov", "",
          f"From `benchmarks/byzantine_strong.json`, written by `{meta.get('command', 'scripts/byzantine_strong.py')}` "
          f"({meta.get('wall_min', 0):.1f} min wall for the last invocation, {meta.get('workers')} worker processes x 1 "
          f"torch thread, nice 15 on the shared 2 cores{earlier}): {len(ran)} runs, "
          f"{sum(r['status'] == 'refused' for r in results.values())} refused cells, the runs' own wall times summing "
          f"to {sum(r.get('wall_s', 0) for r in ran) / 60:.0f} min. "
          f"Training setting shrunk for a budget of about 40 CPU-minutes for the whole grid: n = {PEERS} peers, d_model {p.get('d_model')}, "
          f"{p.get('n_layer')} layer, seq {p.get('seq_len')}, batch {p.get('batch_size')}, H = {p.get('inner_steps')} "
          f"inner AdamW steps, {p.get('rounds')} rounds, outer **{p.get('outer')}** (lr 0.7, momentum 0.9, the run "
          f"default), fp16, all-to-all, seeds {meta.get('seeds')}. Gap: final val loss vs the clean `mean` run (f = 0) "
          "of the same seed, averaged over seeds. min-max / min-sum: `perturbation` unit-vector (default) or std; "
          "agr-tailored searches the scale that hurts `rule` (median by default) most.", ""]
    clean = [results.get(Case("clean", "mean", 0, CLEAN, s).key) for s in meta.get("seeds", [])]
    md += ["Clean reference final val loss per seed: "
           + ", ".join(f"{r['final_val_loss']:.4f}" for r in clean if r and r["status"] == "ok") + ".", ""]
    md += ["### Worst case per rule", "", "| rule | no attacker, f=2 | worst, f=2 | no attacker, f=3 | worst, f=3 | sliced exchange |",
           "|---|---|---|---|---|---|"]
    for rule in RULES:
        cells = []
        for f in FS:
            s = summary(results, rule, f)
            why = refusal(rule, f)
            if why:
                cells += [f"refused ({why})", ""]
                continue
            cells += [_pct(s["clean"]) if s["status"] == "ok" else s["status"].replace("missing", "not run"),
                      _pct(s["worst"]) + (f" ({s['attack']})" if s["attack"] else "") + (f"; {s['bad']} did not run" if s["bad"] else "")]
        md.append(f"| {rule} | " + " | ".join(cells) + f" | {'refused' if rule in NOT_SLICEABLE else 'runs per slice'} |")
    for f in FS:
        md += ["", f"### f = {f} of {PEERS}, every attack (gap vs clean mean)", "",
               "| rule | no attacker | " + " | ".join(LABELS) + " |", "|" + "---|" * (len(LABELS) + 2)]
        for rule in RULES:
            if refusal(rule, f) is None:
                md.append(f"| {rule} | " + " | ".join(_cell(results, rule, f, a) for a in [CLEAN, *LABELS]) + " |")
    default, lines = pick(results)
    md += ["", "### Default rule from this grid", "",
           "Rule: among rules the sliced exchange runs that ran every attack at f = 2 and 3 and cost at most 1% with no "
           "attacker, the smallest max(worst at f=2 / 5%, worst at f=3 / 10%) (<= 1 meets both targets).", ""]
    md += [f"- {line}" for line in lines] + ["", f"Pick: **{default}**."]
    configured = AggregationConfig().name
    s2, s3 = summary(results, configured, 2), summary(results, configured, 3)
    if s2["status"] == "ok" and s3["status"] == "ok":
        def verdict(ok: bool) -> str:
            return "reached" if ok else "NOT reached"

        md += ["", f"Targets for the configured default `{configured}` (peer/run/config.py):", "",
               f"- worst case at f = 2: {_pct(s2['worst'])} ({s2['attack']}); within 5% of clean: **{verdict(s2['worst'] <= 0.05)}**",
               f"- worst case at f = 3: {_pct(s3['worst'])} ({s3['attack']}); within 10% of clean: **{verdict(s3['worst'] <= 0.10)}**",
               f"- no attacker (f = 2 declared) vs `mean`: {_pct(s2['clean'])}; within 1%: **{verdict(abs(s2['clean']) <= 0.01)}**"]
    return md + [""]


def strong_section(out: Path) -> list[str]:
    """byzantine.md's lines for this grid from out/byzantine_strong.json (none when it does not exist)."""
    path = out / "byzantine_strong.json"
    if not path.exists():
        return []
    return ["", *section(load(path), json.loads(path.read_text())["meta"])]


# --- CLI -------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--workers", type=int, default=1, help="worker processes, 1 torch thread each (0: in-process)")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="strong")
    parser.add_argument("--rules", default=None, help="comma-separated rule labels (default: all)")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--limit", type=int, default=None, help="run at most this many new cases")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    from scripts.machine_info import command_line, load_average, machine_facts, machine_lines

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "byzantine_strong.json"
    profile = PROFILES[args.profile]
    seeds = [int(s) for s in args.seeds.split(",")]
    rules = RULES if args.rules is None else [r.strip() for r in args.rules.split(",")]
    if set(rules) - set(RULES):
        parser.error(f"unknown rule(s) {sorted(set(rules) - set(RULES))}; choose from {', '.join(RULES)}")
    results = load(path)
    previous = json.loads(path.read_text())["meta"] if path.exists() else {}
    meta = {**previous, "profile": asdict(profile), "seeds": seeds, "workers": args.workers}
    if not args.report_only:
        load_before, started = load_average(), time.perf_counter()
        todo = [c for c in plan(seeds, rules) if results.get(c.key, {}).get("fingerprint") != fingerprint(c, profile)]
        todo = todo[: args.limit] if args.limit is not None else todo
        if previous.get("command"):
            meta["invocations"] = [*previous.get("invocations", []), f"`{previous['command']}` ({previous.get('wall_min', 0):.1f} min)"]
        print(f"{len(todo)} runs to do ({len(results)} already in {path})", flush=True)
        run_all(todo, profile, args.workers, results, lambda: save(path, results, meta), run)
        meta.update(machine=machine_lines(machine_facts(), load_before, load_average()), command=command_line(),
                    wall_min=(time.perf_counter() - started) / 60)
        save(path, results, meta)
    if out.joinpath("byzantine.json").exists():
        main_results = load(out / "byzantine.json")
        main_meta = json.loads((out / "byzantine.json").read_text())["meta"]
        write_report(main_results, main_meta, main_meta.get("support_demo", []), out, strong_section(out))
        print(f"wrote {out / 'byzantine.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
