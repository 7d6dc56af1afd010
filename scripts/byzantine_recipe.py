"""Byzantine grid with the public-swarm recipe (issue 21): every attack of optim.attacks at f = 2 and
f = 3 of 8 peers against `--recipe sparseloco` as shipped, in the default sliced exchange.

The recipe is resolved at run time from peer.run.recipes.recipe_overrides(RECIPE), applied as the
CLI applies it (peer/cli/run_flags.py resolve_run_config) over the Byzantine bench's model and data
profile (scripts/byzantine_cases.py PROFILES): codec, error feedback, rule and its options, the
declared f, the all-gather's result format, outer step, H. Only `aggregation.num_byzantine` is
changed, to the f of the cell; the f attackers are the first f virtual peers (the bench's
convention, scripts/byzantine_runs.py), with the bench's attack options (sign-flip x4; the
compression-aware attacks with the recipe codec's chunk and top-K).

The gap of a cell is its final validation loss relative to THE RECIPE'S CLEAN RUN (no attacker, the
recipe's own declared f) of the same seed, averaged over seeds (scripts/byzantine_cases.py gap with
that reference). The clean runs with f = 0, 2, 3 declared give the false-positive cost of declaring f.

    nice -n 15 .venv/bin/python scripts/byzantine_recipe.py            # resumes from the JSON
    .venv/bin/python scripts/byzantine_recipe.py --report-only         # rewrite the md from the JSON

Writes benchmarks/byzantine_recipe.json (one record per run, each with the resolved recipe and a
fingerprint of its run config, attack and the rule's code: a run whose fingerprint changed runs
again) and benchmarks/byzantine_recipe.md (only from the JSON).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from optim import attacks  # noqa: E402
from peer.run.config import RunConfig  # noqa: E402
from peer.run.recipes import recipe_overrides  # noqa: E402
from scripts.byzantine_cases import (  # noqa: E402
    ATTACK_OPTIONS, CLEAN, DENSE, HONEST_ONLY, OUT, PEERS, PROFILES as BENCH_PROFILES, Case, Profile, attack_label, gap, load, loss_of, save,
    worst_case,
)
from scripts.byzantine_runs import run_all, run_case  # noqa: E402
from scripts.byzantine_strong import _pct, fingerprint as run_fingerprint  # noqa: E402

RECIPE = "sparseloco"
PHASE = "recipe"
SLICED = "sliced"  # the run config's default exchange.mode
FS = (2, 3)
TARGETS = {2: 0.05, 3: 0.10}  # worst case within 5% (f = 2) and 10% (f = 3) of the recipe's clean run
STEM = "byzantine_recipe"
_ROOT = Path(__file__).resolve().parents[1]
# Code that decides a run's numbers beyond its config: the rule, and the attacks made for it.
_CODE = {"optim/sparse_robust.py": lambda case: case.aggregator.startswith("sparse-trimmed-mean"),
         "optim/sparse_screen.py": lambda case: case.aggregator.startswith("sparse-trimmed-mean"),
         "optim/shared_support.py": lambda case: case.aggregator in ("trimmed-mean", "median"),
         "peer/cli/simulate_shared.py": lambda case: case.aggregator in ("trimmed-mean", "median"),
         "optim/attacks_sparse.py": lambda case: case.attack in ("index-poison", "slow-accumulate", "vote-tailored")}


@dataclass(frozen=True)
class RecipeProfile(Profile):
    """The bench profile's model, data and rounds with a recipe applied over them as the CLI does:
    the recipe decides codec, rule, result format, outer step and H; a cell decides only f."""

    recipe: str = RECIPE
    variant: str = ""  # a prototype's overrides on top of the recipe (peer/cli/simulate_shared.py VARIANTS)
    extra: tuple[tuple[str, str], ...] = ()  # --set PATH=JSON overrides on top of recipe and variant (screening)

    def config(self, seed: int, aggregator: str, f: int | None, codec: str, exchange: str = SLICED) -> RunConfig:
        from peer.cli.run_flags import resolve_run_config

        base = super().config(seed, "mean", 0, DENSE, exchange)
        from peer.cli.simulate_shared import variant_overrides

        overrides = {**recipe_overrides(self.recipe), **variant_overrides(self.variant), **extra_overrides(self.extra),
                     "rounds.rounds": self.rounds}
        if f is not None:  # None: the recipe's own declared f
            overrides["aggregation.num_byzantine"] = f
        cfg = resolve_run_config(base, overrides)
        if aggregator and (cfg.aggregation.name, cfg.compression.codec) != (aggregator, codec):
            raise ValueError(f"case names {aggregator} / {codec}, the recipe resolves to "
                             f"{cfg.aggregation.name} / {cfg.compression.codec}: plan again from the recipe")
        return cfg


PROFILES = {name: RecipeProfile(**asdict(p)) for name, p in BENCH_PROFILES.items()}


def extra_overrides(extra: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    """--set's (PATH, JSON text) pairs -> RunConfig overrides."""
    return {path: json.loads(text) for path, text in extra}


def parse_set(item: str) -> tuple[str, str]:
    """'aggregation.options={"gate": "soft"}' -> (path, canonical JSON text); ValueError saying what to write."""
    path, sep, text = item.partition("=")
    try:
        if not sep or not path.strip():
            raise ValueError("no '='")
        return path.strip(), json.dumps(json.loads(text), sort_keys=True)
    except ValueError as exc:
        raise ValueError(f"--set {item!r}: write PATH=JSON, e.g. aggregation.num_byzantine=2 or "
                         f"'aggregation.options={{\"min_votes\": 1}}' ({exc})") from None


def resolved(profile: RecipeProfile) -> dict[str, Any]:
    """What the recipe resolves to (stored in the JSON's meta and in every record)."""
    from optim import slicing
    from peer.cli.simulate_shared import variant_overrides

    cfg = profile.config(0, "", None, "", SLICED).to_dict()
    c, a, x = cfg["compression"], cfg["aggregation"], cfg["exchange"]
    return {
        "recipe": profile.recipe, "overrides": recipe_overrides(profile.recipe),
        "codec": c["codec"], "error_feedback": c["error_feedback"], "error_feedback_decay": c["error_feedback_decay"],
        "rule": a["name"], "options": a["options"], "declared_f": a["num_byzantine"],
        "result_codec": x["result_codec"], "result_format": x["result_codec"] or slicing.result_format(c["codec"]),
        "exchange": x["mode"], "slices": x["slices"], "replicas": x["replicas"], "spot_checks": x["spot_checks"],
        "outer": cfg["outer"], "H": cfg["inner"]["steps"], "rounds": cfg["rounds"]["rounds"],
        # only when set, so the shipped recipe's records stay matched
        **({"variant": profile.variant, "variant_overrides": variant_overrides(profile.variant)} if profile.variant else {}),
        **({"support": x["support"]} if x.get("support") else {}),
        **({"set": extra_overrides(profile.extra)} if profile.extra else {}),
    }


def attack_options(name: str, codec: str) -> tuple[tuple[str, Any], ...]:
    """The bench's options for `name`; the compression-aware attacks aim at the recipe codec's
    chunk and top-K (stated only where they differ from the attack's defaults)."""
    options = dict(ATTACK_OPTIONS.get(name, {}))
    defaults = attacks.build(name).options
    kind, *numbers = codec.split("+")[0].split(":")
    if "chunk" in defaults and kind == "chunk-topk" and len(numbers) == 2:
        for key, value in zip(("chunk", "topk"), map(int, numbers)):
            if defaults[key] != value:
                options[key] = value
    return tuple(sorted(options.items()))


def plan(settings: dict[str, Any], seeds: list[int], names: list[str], fs: tuple[int, ...] = FS,
         false_positives: bool = True) -> list[Case]:
    rule, codec, declared = settings["rule"], settings["codec"], settings["declared_f"]
    cases = [Case(PHASE, rule, declared, CLEAN, s, codec, exchange=SLICED) for s in seeds]  # every gap's reference
    for s in seeds:
        if false_positives:
            cases += [Case(PHASE, rule, f, CLEAN, s, codec, exchange=SLICED) for f in (0, *fs)]
        cases += [Case(PHASE, rule, f, HONEST_ONLY, s, codec, exchange=SLICED) for f in fs]  # the missing work's floor
        cases += [Case(PHASE, rule, f, a, s, codec, attack_options(a, codec), SLICED) for f in fs for a in names]
    return list({c.key: c for c in cases}.values())


# Hashed when this module is imported, beside the modules themselves (a worker imports both when it
# starts): a file edited while a grid runs does not relabel runs made with the code imported before.
_CODE_SHA = {p: hashlib.sha256((_ROOT / p).read_bytes()).hexdigest()[:12] for p in _CODE}


def fingerprint(case: Case, profile: RecipeProfile) -> str:
    code = [_CODE_SHA[p] for p, uses in _CODE.items() if uses(case)]
    return hashlib.sha256(json.dumps([run_fingerprint(case, profile), code]).encode()).hexdigest()[:16]


def code_state() -> dict[str, Any]:
    """The commit the runs ran on and the library files that differed from it (sha256 of each)."""
    import subprocess

    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=_ROOT, capture_output=True, text=True).stdout

    changed = sorted(line[3:] for line in git("status", "--porcelain", "--", "optim", "peer", "protocol").splitlines())
    return {"head": git("rev-parse", "--short=12", "HEAD").strip(),
            "trees": {d: git("rev-parse", "--short=12", f"HEAD:{d}").strip() for d in ("optim", "peer", "protocol")},
            "uncommitted": {f: hashlib.sha256((_ROOT / f).read_bytes()).hexdigest()[:12] if (_ROOT / f).is_file() else "?"
                            for f in changed}}


def _library(code: dict[str, Any]) -> tuple:
    """What of a code state decides the runs: the library's trees and uncommitted files, not the commit."""
    return code.get("trees"), code["uncommitted"]


def case_of(record: dict[str, Any]) -> Case:
    return Case(record["phase"], record["aggregator"], record["f"], record["attack"], record["seed"], record["codec"],
                tuple(sorted(record["attack_options"].items())), record["exchange"])


def merge_runs(results: dict[str, dict], runs: list[dict[str, Any]], profile: RecipeProfile) -> int:
    """Add the `runs` whose fingerprint is this code's and config's; returns how many."""
    current = [r for r in runs if r.get("fingerprint") == fingerprint(case_of(r), profile)]
    results.update({r["key"]: r for r in current})
    return len(current)


def run(case: Case, profile: RecipeProfile) -> dict[str, Any]:
    return {**run_case(case, profile), "recipe": resolved(profile), "fingerprint": fingerprint(case, profile)}


# --- the report (a pure function of the JSON) --------------------------------------------------


def _reference(settings: dict[str, Any], f: int | None = None):
    """The key of a gap's reference run per seed: the recipe's clean run (f None), or the n - f honest
    peers alone with f declared (HONEST_ONLY)."""
    def key(seed: int) -> str:
        if f is not None:
            return Case(PHASE, settings["rule"], f, HONEST_ONLY, seed, settings["codec"], exchange=SLICED).key
        return Case(PHASE, settings["rule"], settings["declared_f"], CLEAN, seed, settings["codec"], exchange=SLICED).key
    return key


def _cell(runs: dict[str, dict], s: dict[str, Any], f: int, attack: str) -> str:
    g, status = gap(runs, s["rule"], f, attack, s["codec"], SLICED, _reference(s))
    if status != "ok":
        errors = sorted({r.get("error", "") for r in runs.values() if r["f"] == f and r["attack"] == attack.split("(")[0]
                         and r["status"] != "ok"})
        return "not run" if status == "missing" else f"{status}: {'; '.join(errors)[:160]}"
    loss = loss_of(runs, s["rule"], f, attack, s["codec"], SLICED)
    excluded = [r["excluded"] for r in runs.values() if r["f"] == f and r["attack"] == attack.split("(")[0]
                and r["status"] == "ok"]
    return f"{_pct(g)} ({loss:.3f}" + (f"; {sum(excluded) / len(excluded):g} excluded/run" if any(excluded) else "") + ")"


def _seeds_of(runs: dict[str, dict], f: int, attack: str) -> str:
    return ",".join(str(s) for s in sorted({r["seed"] for r in runs.values() if r["f"] == f and r["attack"] == attack}))


def summary(runs: dict[str, dict], s: dict[str, Any], names: list[str], f: int, honest_only: bool = False) -> dict[str, Any]:
    """The worst case at f vs the recipe's clean run (honest_only: vs the n - f honest peers alone)."""
    names = [attack_label({"attack": a, "attack_options": dict(attack_options(a, s["codec"]))}) for a in names]
    w, attack, bad = worst_case(runs, s["rule"], f, names, s["codec"], SLICED, _reference(s, f if honest_only else None))
    missing = [a for a in names if gap(runs, s["rule"], f, a, s["codec"], SLICED, _reference(s))[1] == "missing"]
    reached = w is not None and w <= TARGETS[f] and not bad and not missing
    return {"worst": w, "attack": attack, "bad": bad, "missing": missing, "reached": reached}


def report(results: dict[str, dict], meta: dict[str, Any]) -> str:
    s, seeds, names = meta["recipe"], meta["seeds"], meta["attacks"]
    runs = {k: r for k, r in results.items() if r.get("recipe") == s}  # only runs of the recipe as resolved last
    ok = [r for r in runs.values() if r["status"] == "ok"]
    walls = [r["wall_s"] for r in ok]
    p = meta["profile"]
    config_sha = hashlib.sha256(json.dumps(s, sort_keys=True).encode()).hexdigest()[:12]
    earlier = "; earlier: " + "; ".join(meta["invocations"]) if meta.get("invocations") else ""
    options = ", ".join(f"{k}={v}" for k, v in s["options"].items()) or "defaults"
    outer = ", ".join(f"{k} {v}" for k, v in s["outer"].items() if k in ("name", "lr", "momentum") and v is not None)
    variant = f" `--variant {s['variant']}` (a prototype's overrides: {s['variant_overrides']})" if s.get("variant") else ""
    md = [f"# Byzantine grid with the public-swarm recipe (`--recipe {s['recipe']}`){variant}", "",
          f"From `benchmarks/{meta.get('stem', STEM)}.json`, written by `{meta.get('command', 'scripts/byzantine_recipe.py')}` "
          f"({meta.get('wall_min', 0):.1f} min wall for the last invocation, {meta.get('workers')} worker processes x 1 "
          f"torch thread on the shared cores{earlier}): {len(ok)} runs, "
          f"{sum(r['status'] != 'ok' for r in runs.values())} that did not finish; one run's own wall time median "
          f"{statistics.median(walls) if walls else 0:.0f} s, max {max(walls, default=0):.0f} s.", "",
          f"**How every row ran** (config `{config_sha}`: sha256 of the resolved recipe, stored in every record): "
          f"the recipe resolved at run time from `peer.run.recipes.recipe_overrides({s['recipe']!r})` over the Byzantine "
          f"bench's profile: codec `{s['codec']}`, error feedback {s['error_feedback']} (decay {s['error_feedback_decay']}); "
          f"rule `{s['rule']}` ({options}), the recipe declares f = {s['declared_f']}, each cell declares its own f; "
          + (f"support `{s['support']}` (every peer sends its values on one agreed support: optim/shared_support.py); "
             if s.get("support") else "")
          + f"result format `{s['result_format']}`; exchange **{s['exchange']}** (S = {s['slices']}, r = {s['replicas']}, "
          f"{s['spot_checks']} spot check); outer {outer}; H = {s['H']}; {s['rounds']} rounds; seeds {seeds}. "
          f"n = {PEERS} peers, d_model {p['d_model']}, {p['n_layer']} layer, seq {p['seq_len']}, batch {p['batch_size']}, "
          f"{p['val_batches']} val batches. Attackers: the first f virtual peers, omniscient; sign-flip x4 (the bench's "
          "options), the compression-aware attacks aimed at the recipe codec's chunk and top-K.", "",
          f"Gap: final val loss vs the recipe's clean run (no attacker, f = {s['declared_f']} declared) of the same seed, "
          "averaged over seeds; a cell also gives the mean final val loss and, where any, the updates excluded per run.", ""]
    clean = [runs.get(_reference(s)(seed)) for seed in seeds]
    md += ["Recipe's clean run, final val loss per seed: "
           + ", ".join(f"{r['final_val_loss']:.4f} (seed {r['seed']})" for r in clean if r and r["status"] == "ok") + ".", ""]
    md += ["## No attacker: the cost of declaring f", "", "| declared f | rule | gap vs the recipe's clean run | seeds | config |",
           "|---|---|---|---|---|"]
    for f in sorted({0, s["declared_f"], *FS}):
        shipped = " (the recipe as shipped)" if f == s["declared_f"] else ""
        md.append(f"| {f}{shipped} | {s['rule']} | {_cell(runs, s, f, CLEAN)} | {_seeds_of(runs, f, CLEAN)} | {config_sha} |")
    md += ["", f"## Every attack, f attackers of {PEERS} with f declared (gap vs the recipe's clean run)", "",
           "| attack | options | " + " | ".join(f"f = {f} ({s['rule']}, {f} attackers)" for f in FS) + " | seeds | config |",
           "|---|---|" + "---|" * len(FS) + "---|---|"]
    for a in names:
        opts = ", ".join(f"{k}={v}" for k, v in attack_options(a, s["codec"])) or "defaults"
        label = attack_label({"attack": a, "attack_options": dict(attack_options(a, s["codec"]))})
        md.append(f"| {a} | {opts} | " + " | ".join(_cell(runs, s, f, label) for f in FS)
                  + f" | {_seeds_of(runs, FS[0], a)} | {config_sha} |")
    md += ["", "## Worst case per f and the targets", ""]
    for f in FS:
        w = summary(runs, s, names, f)
        why = "".join([f"; did not finish: {w['bad']}" if w["bad"] else "",
                       f"; not run: {', '.join(w['missing'])}" if w["missing"] else ""])
        worst = f"{_pct(w['worst'])} ({w['attack']})" if w["worst"] is not None else "-"
        md.append(f"- f = {f}: worst case {worst}{why}; within {100 * TARGETS[f]:.0f}% of the recipe's clean run: "
                  f"**{'reached' if w['reached'] else 'NOT reached'}**")
    fp = {f: gap(runs, s["rule"], f, CLEAN, s["codec"], SLICED, _reference(s))[0] for f in (0, *FS)}
    md.append("- no attacker, false-positive cost of declaring f: "
              + ", ".join(f"f = {f}: {_pct(g)}" for f, g in fp.items() if f != s["declared_f"]) + " (vs the recipe's f = "
              f"{s['declared_f']})")
    for f in FS:  # the second reference: what the n - f honest peers reach without the attackers' peers at all
        alone = gap(runs, s["rule"], f, HONEST_ONLY, s["codec"], SLICED, _reference(s))[0]
        w = summary(runs, s, names, f, honest_only=True)
        if alone is not None and w["worst"] is not None:
            md.append(f"- the {PEERS - f} honest peers alone (f = {f} declared, lowered to what {PEERS - f} rows allow as the swarm lowers it; no attacker's peer at all) end "
                      f"{_pct(alone)} vs the recipe's clean run ({loss_of(runs, s['rule'], f, HONEST_ONLY, s['codec'], SLICED):.3f});"
                      f" against that run of the same seed the worst attack at f = {f} is {_pct(w['worst'])} ({w['attack']}): "
                      "what the rule loses beyond the attackers' missing work (the issue's target stays vs the recipe's clean run)")
    floor = {f: gap(runs, s["rule"], f, "free-rider", s["codec"], SLICED, _reference(s))[0] for f in FS}
    if all(g is not None for g in floor.values()):  # zero rows: the attackers add nothing, the rule still sees n rows
        md.append("- for scale: `free-rider` (the attackers send zero updates: no work, no harm, still n rows) costs "
                  + ", ".join(f"{_pct(g)} at f = {f}" for f, g in floor.items())
                  + ": training without the f peers' work, measured against the clean run of all 8")
    from scripts.machine_info import machine_lines

    code = meta.get("code") or {}
    dirty = ", ".join(f"`{f}` (sha256 {h})" for f, h in code.get("uncommitted", {}).items())
    md += ["", "## Machine", "", f"- code: commit {code.get('head', 'not recorded')}"
           + (f" with uncommitted changes to {dirty}" if dirty else " (optim/, peer/, protocol/ as committed)")
           + (" when the last invocation started; the checkout moved while it ran (a commit, or an edit to optim/, peer/, "
              "protocol/"
              + ("" if "trees" in code else ": this JSON records only the commit, not which") + "); each worker process ran "
              "the code it imported at its start" if code.get("changed_during_run") else ""), *machine_lines(meta.get("machine_facts"), meta.get("load_before"), meta.get("load_after"))]
    return "\n".join(md) + "\n"


def write_md(path: Path) -> Path:
    data = json.loads(path.read_text())
    md = path.with_suffix(".md")
    from scripts.machine_info import write_keeping_notes

    write_keeping_notes(md, report(load(path), data["meta"]))
    return md


# --- CLI -------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--workers", type=int, default=2, help="worker processes, 1 torch thread each (0: in-process)")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="bench")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per run (default: the profile's)")
    parser.add_argument("--attacks", default=None, help="comma-separated attacks (default: every one of optim.attacks)")
    parser.add_argument("--out", default=str(OUT), help=f"directory for {STEM}.{{json,md}}")
    parser.add_argument("--limit", type=int, default=None, help="run at most this many new cases")
    parser.add_argument("--recipe", default=RECIPE, help="the recipe whose settings every run takes")
    parser.add_argument("--variant", default="", help="a prototype's overrides over the recipe (e.g. vote: the agreed "
                        "support of docs/robust-compressed.md); '' = the recipe as shipped")
    parser.add_argument("--stem", default=STEM, help="file name of the JSON and md (e.g. byzantine_shared_support "
                        "for --variant vote; keep byzantine_recipe's for the shipped recipe)")
    parser.add_argument("--set", action="append", default=[], metavar="PATH=JSON",
                        help="a RunConfig override over recipe and variant, e.g. 'aggregation.options={\"min_votes\": 1}' "
                        "(screening a candidate; use its own --out or --stem)")
    parser.add_argument("--fs", default=",".join(map(str, FS)), help="the f values whose attacks run (screening)")
    parser.add_argument("--no-false-positives", action="store_true", help="skip the clean runs declaring f = 0 and the "
                        "cells' f (screening)")
    parser.add_argument("--merge", nargs="*", default=[], metavar="JSON",
                        help="byzantine_recipe.json files of invocations run in parallel (--out elsewhere): their runs of "
                        "this code and config join this JSON (with --limit 0: merge only)")
    parser.add_argument("--report-only", action="store_true", help="only rewrite the md from the JSON")
    args = parser.parse_args(argv)
    from scripts.machine_info import command_line, load_average, machine_facts

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{args.stem}.json"
    if not args.report_only:
        profile = PROFILES[args.profile]
        try:
            extra = tuple(parse_set(item) for item in args.set)
        except ValueError as exc:
            parser.error(str(exc))
        profile = RecipeProfile(**{**asdict(profile), "recipe": args.recipe, "variant": args.variant, "extra": extra,
                                   "rounds": args.rounds if args.rounds is not None else profile.rounds})
        fs = tuple(int(f) for f in args.fs.split(","))
        seeds = [int(s) for s in args.seeds.split(",")]
        names = list(attacks.NAMES) if args.attacks is None else [a.strip() for a in args.attacks.split(",")]
        if set(names) - set(attacks.NAMES):
            parser.error(f"unknown attack(s) {sorted(set(names) - set(attacks.NAMES))}; choose from {', '.join(attacks.NAMES)}")
        results = load(path)
        previous = json.loads(path.read_text())["meta"] if path.exists() else {}
        settings = resolved(profile)
        meta = {**previous, "profile": asdict(profile), "seeds": seeds, "workers": args.workers, "attacks": names,
                "fs": list(fs), "recipe": settings, **({"stem": args.stem} if args.stem != STEM else {})}
        load_before, started, code = load_average(), time.perf_counter(), code_state()
        for other in args.merge:  # runs made in parallel elsewhere (--out), kept only when they ran this code and config
            taken = merge_runs(results, json.loads(Path(other).read_text())["runs"], profile)
            meta["merged"] = [*previous.get("merged", []), f"{taken} runs from {other}"]
            print(f"merged {taken} current runs from {other}", flush=True)
        todo = [c for c in plan(settings, seeds, names, fs, not args.no_false_positives) if results.get(c.key, {}).get("fingerprint") != fingerprint(c, profile)]
        for case in todo:  # a stale record (another rule or config under the same key) never stays beside current ones
            results.pop(case.key, None)
        todo = todo[: args.limit] if args.limit is not None else todo
        if previous.get("command"):
            meta["invocations"] = [*previous.get("invocations", []), f"`{previous['command']}` ({previous.get('wall_min', 0):.1f} min)"]
        print(f"{len(todo)} runs to do ({len(results)} already in {path}); recipe resolves to {settings}", flush=True)
        run_all(todo, profile, args.workers, results, lambda: save(path, results, meta), run)
        meta.update(code={**code, "changed_during_run": _library(code_state()) != _library(code)}, machine_facts=machine_facts(), load_before=load_before, load_after=load_average(),
                    command=command_line(), wall_min=(time.perf_counter() - started) / 60)
        save(path, results, meta)
    print(f"wrote {write_md(path)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
