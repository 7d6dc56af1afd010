"""The Byzantine grid with mixed speeds and a compute window (issue 23): 8 simulated peers with
speeds 1, 1, 0.5, 0.25, 1, 1, 0.5, 0.25, each training what its speed fits in the window and
weighed by its capped claimed work; the f = 2 attackers (the first two peers: both at speed 1, so
the heaviest rows are theirs) run each attack of benchmarks/byzantine.md AND sign 4x the work they
did into their headers.

    .venv/bin/python scripts/byzantine_mixed.py                  # the grid (resumes from the JSON)
    .venv/bin/python scripts/byzantine_mixed.py --report-only    # redo the md from the JSON

Each run is `swarmloco simulate` (the real RoundMath and work_math, as scripts/byzantine_runs.py runs
the first grid) with the Byzantine profile of scripts/byzantine_cases.py (d_model 64, 1 layer, 6
rounds, fedavg outer, fp16), exchange sliced (a window's weights need it: krum, multi-krum and
geometric-median are refused there), window = the profile's H simulated seconds (a speed-1 peer
takes H steps, speed 0.25 H/4). A gap is the final val loss against the clean mixed run (mean,
f = 0, nobody attacking, honest claims) of the same seed, averaged over seeds. Writes
benchmarks/byzantine_mixed.json and .md (the md a pure function of the JSON).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for extra in (str(ROOT), str(ROOT / "scripts")):
    if extra not in sys.path:
        sys.path.insert(0, extra)

from peer.cli.simulate import SimulationOptions, run_simulation  # noqa: E402
from peer.run.config import RunConfig  # noqa: E402
from peer.run.work_math import PER_WORK_RULES  # noqa: E402
from scripts.byzantine_cases import ATTACK_OPTIONS, CLASSIC_ATTACKS, CLEAN, HONEST_ONLY, PROFILES, Case, Profile, gap, load, save  # noqa: E402
from scripts.byzantine_runs import run_all  # noqa: E402
from machine_info import command_line, load_average, machine_facts, machine_lines, write_keeping_notes  # noqa: E402

SPEEDS = (1.0, 1.0, 0.5, 0.25, 1.0, 1.0, 0.5, 0.25)
# --attackers-on slow: the same speeds, the two speed-0.25 peers first (the attackers): a 4x claim then
# passes every cap (2 steps claimed as 8, the fast peers' work), the harder case for the caps.
SLOW_FIRST = (0.25, 0.25, 1.0, 1.0, 0.5, 1.0, 1.0, 0.5)
PLACEMENTS = {"fast": SPEEDS, "slow": SLOW_FIRST}
CLAIM = 4.0  # the attackers' claimed work over their real work
RULES = ("median", "trimmed-mean", "centered-clip")  # the weighted rules the sliced exchange runs (mean: the control)
F = 2
EXCHANGE = "sliced"
OUT = ROOT / "benchmarks" / "byzantine_mixed.json"


def window_config(profile: Profile, case: Case) -> RunConfig:
    data = profile.config(case.seed, case.aggregator, case.f, case.codec, case.exchange).to_dict()
    data["rounds"].update({"window_s": float(profile.inner_steps), "min_steps": 1, "max_steps": 4 * profile.inner_steps})
    return RunConfig.from_dict(data)


def run_mixed(case: Case, profile: Profile, all_speeds: tuple[float, ...] = SPEEDS) -> dict[str, Any]:
    """One cell: simulate with the mixed speeds, the window, and (attack cells) the 4x claim."""
    speeds = all_speeds[case.f:] if case.attack == HONEST_ONLY else all_speeds  # honest-only: the attackers' peers gone
    record: dict[str, Any] = {"key": case.key, **dataclasses.asdict(case), "attack_options": dict(case.attack_options),
                              "peer_speeds": list(speeds)}
    attacked = case.attack not in (CLEAN, HONEST_ONLY)
    opts = SimulationOptions(
        peers=len(speeds), rounds=profile.rounds, byzantine=case.f if attacked else 0,
        attack=case.attack if attacked else None, attack_options=dict(case.attack_options), seed=case.seed, threads=1,
        config=window_config(profile, case), peer_speeds=speeds, claim_work=CLAIM if attacked else 1.0,
    )
    record["claim_work"] = opts.claim_work
    started = time.perf_counter()
    try:
        result = run_simulation(opts)
    except (ValueError, RuntimeError) as exc:
        return {**record, "status": "error", "error": str(exc), "wall_s": time.perf_counter() - started}
    work = result["work"]
    return {**record, "status": "ok", "final_val_loss": result["final_val_loss"],
            "initial_val_loss": result["initial_val_loss"], "val_loss_per_round": result["val_loss_per_round"],
            "excluded": sum(len(e) for e in result["excluded_per_round"]), "wall_s": result["wall_s"],
            "final_params_sha256": result["final_params_sha256"], "token_share": work["token_share"],
            "counted_share": work["counted_share"], "steps_per_round": work["rounds"][0]["steps"]}


def plan(seeds: list[int], rules: list[str]) -> list[Case]:
    cases = [Case("clean", "mean", 0, CLEAN, s, exchange=EXCHANGE) for s in seeds]
    for s in seeds:
        cases.append(Case("control", "mean", F, "sign-flip", s, attack_options=tuple(ATTACK_OPTIONS["sign-flip"].items()),
                          exchange=EXCHANGE))
        cases.append(Case("mixed", "mean", F, HONEST_ONLY, s, exchange=EXCHANGE))
        for rule in rules:
            cases.append(Case("mixed", rule, F, CLEAN, s, exchange=EXCHANGE))
            cases.append(Case("mixed", rule, F, HONEST_ONLY, s, exchange=EXCHANGE))
            cases += [Case("mixed", rule, F, a, s, attack_options=tuple(sorted(ATTACK_OPTIONS.get(a, {}).items())),
                           exchange=EXCHANGE) for a in CLASSIC_ATTACKS]
    return cases


def _cell(results: dict[str, dict], rule: str, attack: str) -> tuple[str, float | None]:
    g, status = gap(results, rule, F, attack, exchange=EXCHANGE)
    if g is None:
        return status, None
    return f"{g * 100:+.1f}%", g


def render(doc: dict[str, Any]) -> str:
    results = {r["key"]: r for r in doc["runs"]}
    meta = doc["meta"]
    speeds = tuple(meta.get("peer_speeds", SPEEDS))
    lines = ["# Byzantine grid with mixed speeds and a 4x work claim (issue 23)", "",
             f"Generated by `scripts/byzantine_mixed.py` from `benchmarks/{meta.get('json_name', 'byzantine_mixed.json')}`; regenerate with "
             f"`--report-only{' --attackers-on slow' if meta.get('attackers_on') == 'slow' else ''}`.", "",
             *machine_lines(meta.get("machine"), meta.get("load_before"), meta.get("load_after")),
             f"- command: `{meta.get('command')}`", "",
             f"Every run: `swarmloco simulate`, {len(speeds)} peers with speeds {', '.join(f'{s:g}' for s in speeds)}, a compute window "
             f"of {meta.get('window_s')} simulated s (a speed-1 peer takes that many steps), updates weighed by their capped claimed "
             f"work (optim/work_weights.py){_per_work(meta)}, exchange {EXCHANGE}, codec fp16, outer fedavg, {meta.get('rounds')} rounds, seeds "
             f"{meta.get('seeds')}. Attackers: the first f = {F} peers ({_placement(speeds)}), omniscient, each running "
             f"the column's attack and claiming {CLAIM:g}x the work it did. A cell is the final val loss's gap to the clean mixed run "
             "(mean, f = 0, honest claims) of the same seed, averaged over seeds. The honest-only column: no attacker and only the "
             f"{len(speeds) - F} honest peers (speeds {', '.join(f'{s:g}' for s in speeds[F:])}), f = {F} still declared: what the "
             "attackers' missing work alone costs.", ""]
    refs = [results.get(Case("clean", "mean", 0, CLEAN, s, exchange=EXCHANGE).key) for s in meta.get("seeds", [])]
    lines.append("Clean mixed reference per seed: " + ", ".join(f"{r['final_val_loss']:.4f}" for r in refs if r and r["status"] == "ok"))
    lines += ["", "| rule | no attacker (f=2 declared) | honest only | " + " | ".join(CLASSIC_ATTACKS) + " | worst case |",
              "|---|---|---|" + "---|" * len(CLASSIC_ATTACKS) + "---|"]
    worst_by_rule: dict[str, tuple[float, str]] = {}
    for rule in meta.get("rules", RULES):
        cells = [_cell(results, rule, a) for a in (CLEAN, *CLASSIC_ATTACKS)]
        done = [(g, a) for (_, g), a in zip(cells, (CLEAN, *CLASSIC_ATTACKS)) if g is not None]
        worst = max(done) if done else None
        if worst:
            worst_by_rule[rule] = worst
        alone = _cell(results, rule, HONEST_ONLY)[0]
        lines.append(f"| {rule} | {cells[0][0]} | {alone} | " + " | ".join(text for text, _ in cells[1:])
                     + f" | {'-' if worst is None else f'{worst[0] * 100:+.1f}% ({worst[1]})'} |")
    control, _ = _cell(results, "mean", "sign-flip")
    lines += ["", f"Negative control: `mean` with f = 2 sign-flip (x4) attackers claiming {CLAIM:g}x: {control}. "
              f"`mean` over the honest peers alone (f = 2 declared): {_cell(results, 'mean', HONEST_ONLY)[0]}.", "", "## Target", ""]
    for rule, (g, attack) in worst_by_rule.items():
        verdict = "reached" if g <= 0.05 else "NOT reached"
        alone = _cell(results, rule, HONEST_ONLY)[1]
        beside = "" if alone is None else f"; {(1 + g) / (1 + alone) * 100 - 100:+.1f}% vs its own honest-only run"
        lines.append(f"- {rule}: worst case {g * 100:+.1f}% ({attack}) vs the clean mixed run, within 5%: **{verdict}**{beside}")
    shares = [r["counted_share"][:F] for r in results.values()
              if r["status"] == "ok" and r["attack"] not in (CLEAN, HONEST_ONLY) and r["aggregator"] != "mean"]
    if shares:
        top = max(sum(s) for s in shares)
        lines.append(f"- the attackers' counted share (2 of 8 peers claiming {CLAIM:g}x; their real share of the tokens "
                     f"{sum(speeds[:F]) / sum(speeds):.1%}): at most {top:.1%} in any run (2x the median claim, then the f heaviest "
                     "rows' share cut to optim.work_weights.WorkCaps.max_heavy_share)")
    return "\n".join(lines) + "\n"


def _placement(speeds: tuple[float, ...]) -> str:
    attackers = ", ".join(f"{s:g}" for s in speeds[:F])
    if all(s == max(speeds) for s in speeds[:F]):
        return f"speeds {attackers}: the heaviest rows"
    return f"speeds {attackers}: the slowest peers, whose 4x claim passes the 2x-median cap"


def _per_work(meta: dict[str, Any]) -> str:
    rules = meta.get("per_work_rules")
    if not rules:
        return " (the rules on the raw rows)"
    return f"; {', '.join(rules)} see each row per unit of its claimed work (peer/run/work_math.PER_WORK_RULES), the mean the raw rows"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attackers-on", default="fast", choices=sorted(PLACEMENTS),
                        help="fast: the attackers are two speed-1 peers (the heaviest rows); slow: the two speed-0.25 peers "
                             "(default JSON benchmarks/byzantine_mixed_slow.json)")
    parser.add_argument("--json", default=None, help="default: benchmarks/byzantine_mixed.json (slow: _slow.json)")
    parser.add_argument("--md", default=None, help="default: the JSON's path with .md")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--rules", default=",".join(RULES))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--profile", default="bench", choices=sorted(PROFILES))
    args = parser.parse_args(argv)
    path = Path(args.json) if args.json else OUT.with_name(OUT.stem + ("_slow" if args.attackers_on == "slow" else "") + ".json")
    speeds = PLACEMENTS[args.attackers_on]
    md = Path(args.md) if args.md else path.with_suffix(".md")
    profile = PROFILES[args.profile]
    seeds, rules = [int(s) for s in args.seeds.split(",")], args.rules.split(",")
    if not args.report_only:
        results = load(path)
        meta = {"machine": machine_facts(), "load_before": load_average(), "command": command_line(), "seeds": seeds,
                "rules": rules, "window_s": float(profile.inner_steps), "rounds": profile.rounds, "claim_work": CLAIM,
                "peer_speeds": list(speeds), "attackers_on": args.attackers_on, "profile": dataclasses.asdict(profile), "per_work_rules": list(PER_WORK_RULES),
                "json_name": OUT.stem + ("_slow" if args.attackers_on == "slow" else "") + ".json"}
        todo = [c for c in plan(seeds, rules) if c.key not in results]
        print(f"{len(todo)} runs to do", flush=True)
        run_all(todo, profile, args.workers, results, lambda: save(path, results, meta),
                runner=functools.partial(run_mixed, all_speeds=speeds))
        meta["load_after"] = load_average()
        save(path, results, meta)
    write_keeping_notes(md, render(json.loads(path.read_text())))
    print(f"wrote {md}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
