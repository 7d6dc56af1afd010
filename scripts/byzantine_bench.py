"""Byzantine benchmark: every attack x every aggregator on a simulated swarm of 8 peers.

Each cell is `swarmloco simulate` (peer/cli/simulate.py: the real RoundMath, attackers = the first f
virtual peers, omniscient, on non-identical shards) with one aggregator, f declared Byzantine and
f attackers. The gap of a cell is its final validation loss relative to the clean run with `mean`
(f = 0, no attacker) of the same seed, averaged over seeds. Phases:

    main         f=2, fp16: every attack x every aggregator (+ no attacker: the false-positive column)
    variants     f=2: centered-clip with bucketing (bucket_size 2), nnm + krum, nnm + centered-clip
    fvalues      f=1 and f=3: the worst attacks of `main` x every aggregator that accepts that f
    compression  f=2 with randk:0.05+int8 (one index set shared by all peers) and topk:0.05+int8
                 (each peer its own support), plus a direct numeric check on real pseudo-gradients

    .venv/bin/python scripts/byzantine_bench.py                      # all phases (resumes from the JSON)
    .venv/bin/python scripts/byzantine_bench.py --phases main        # one phase
    .venv/bin/python scripts/byzantine_bench.py --report-only        # redo md/png from the JSON
    .venv/bin/python scripts/byzantine_bench.py --exchange sliced --aggregators median --phases main,fvalues

Every run states its exchange: `all-to-all` (each node aggregates whole updates; the original grid)
or `sliced` (each slice reduced by its owners with the rule, result rounded to the result format,
as `exchange.mode = "sliced"` runs; krum, multi-krum, geometric-median and nnm are refused there).
Writes benchmarks/byzantine.json (one record per run), byzantine.md and byzantine.png (the last two
through scripts/byzantine_report.py); with --exchange sliced, byzantine_sliced.json and .md. This module plans
the phases' cases and runs them; the grid and the reading of results (gap, loss_of, worst_case) are
scripts/byzantine_cases.py, running a case scripts/byzantine_runs.py, the tables and heatmap the report module.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from optim import aggregate  # noqa: E402
from scripts.byzantine_cases import (  # noqa: E402
    A2A, AGGREGATORS, ALL_AGGREGATORS, ATTACK_OPTIONS, CLASSIC_ATTACKS, CLEAN, COMPRESSION, COMPRESSION_ATTACKS, DENSE,
    EXCHANGES, LYING_OWNER, OUT, PEERS, PROFILES, VARIANTS, Case, Profile, gap, load, refusal, save,
)
from scripts.byzantine_report import write_report, write_sliced_report  # noqa: E402
from scripts.byzantine_runs import run_all, run_case  # noqa: E402
from scripts.byzantine_strong import strong_section  # noqa: E402


def _attack_case(phase: str, aggregator: str, f: int, attack: str, seed: int, codec: str = DENSE,
                 exchange: str = A2A) -> Case:
    options = tuple(sorted(ATTACK_OPTIONS.get(attack, {}).items()))
    return Case(phase, aggregator, f, attack, seed, codec, options, exchange)


def plan(phases: list[str], seeds: list[int], results: dict[str, dict], exchange: str = A2A,
         aggregators: list[str] | None = None, worst: int = 1) -> list[Case]:
    """The cases of `phases`; `aggregators` limits the rules (default all), `worst` = how many of
    main's worst attacks fvalues runs. Sliced: rules it refuses are not planned, and main adds the
    lying slice owner for each rule."""
    aggs = {a: v for a, v in AGGREGATORS.items() if aggregators is None or a in aggregators}
    variants = {a: v for a, v in VARIANTS.items() if aggregators is None or a in aggregators}
    if exchange == "sliced":
        aggs = {a: v for a, v in aggs.items() if refusal(a, 0, exchange=exchange) is None}
        variants = {a: v for a, v in variants.items() if refusal(a, 0, exchange=exchange) is None}
    x = exchange
    cases: list[Case] = []
    for s in seeds:
        cases.append(Case("clean", "mean", 0, CLEAN, s, exchange=x))  # the reference every gap is measured against
    if "main" in phases:
        for s in seeds:
            for agg in aggs:
                if agg != "mean":  # `mean` ignores f: with nobody attacking it IS the clean reference
                    cases.append(Case("main", agg, 2, CLEAN, s, exchange=x))  # false positive: f declared, nobody attacks
                cases += [_attack_case("main", agg, 2, a, s, exchange=x) for a in CLASSIC_ATTACKS]
                if x == "sliced" and agg != "mean":
                    cases.append(Case("main", agg, 2, LYING_OWNER, s, exchange=x))  # honest updates, false slice results
            if "mean" in aggs:
                cases.append(Case("main", "mean", 2, "sign-flip", s, exchange=x))  # the literature's x1 sign flip, for the control
    if "variants" in phases:
        for s in seeds:
            for agg in variants:
                cases.append(Case("variants", agg, 2, CLEAN, s, exchange=x))
                cases += [_attack_case("variants", agg, 2, a, s, exchange=x) for a in worst_attacks(results, 2, x)]
    if "fvalues" in phases:
        for f in (1, 3):
            for agg in aggs:
                if refusal(agg, f, exchange=x) is None:
                    for s in seeds:
                        if agg != "mean":
                            cases.append(Case("fvalues", agg, f, CLEAN, s, exchange=x))
                        cases += [_attack_case("fvalues", agg, f, a, s, exchange=x) for a in worst_attacks(results, worst, x)]
    if "compression" in phases:
        for codec, compressed in COMPRESSION.items():
            for s in seeds:
                cases.append(Case("compression", "mean", 0, CLEAN, s, codec, exchange=x))  # what the codec alone costs
                for agg in compressed:
                    if refusal(agg, 2, exchange=x) is None:
                        cases.append(Case("compression", agg, 2, CLEAN, s, codec, exchange=x))
                        cases += [_attack_case("compression", agg, 2, a, s, codec, x) for a in COMPRESSION_ATTACKS]
    unique = {c.key: c for c in cases}
    return list(unique.values())


def worst_attacks(results: dict[str, dict], k: int = 3, exchange: str = A2A) -> list[str]:
    """The k attacks that hurt the robust rules most at f=2 (fixed list before `main` has run)."""
    scores = {}
    for a in CLASSIC_ATTACKS:
        gaps = [gap(results, agg, 2, a, exchange=exchange)[0] for agg in AGGREGATORS if agg != "mean"]
        gaps = [g for g in gaps if g is not None]
        if gaps:
            scores[a] = max(gaps)
    if len(scores) < len(CLASSIC_ATTACKS):
        return ["alie", "ipm", "mimic"][:k]
    return sorted(scores, key=lambda a: -scores[a])[:k]


# --- the sparse-support trap, measured directly ----------------------------------------------


def support_demo(profile: Profile, seed: int = 0) -> list[dict[str, Any]]:
    """Aggregate the decoded updates of real round-0 pseudo-gradients (8 peers, H inner steps from
    the same θ_0) with each rule and compare with the same codec's plain mean: how much of the
    signal each rule keeps. No attacker: this isolates what the codec does to the rule."""
    import torch

    from optim import codecs
    from peer.learn.data import ShardSampler, load_corpus
    from peer.learn.model import build_model, flat_params, load_flat_params
    from peer.learn.training import InnerTrainer

    torch.set_num_threads(1)
    cfg = profile.config(seed, "mean", 0, DENSE)
    corpus = load_corpus(cfg.data, seq_len=cfg.model.seq_len)
    model = build_model(cfg.model, seed)
    theta = flat_params(model)  # θ_0, (d,)
    deltas = []
    for i in range(PEERS):
        sampler = ShardSampler(corpus.train, shard=i, num_shards=PEERS, batch_size=cfg.data.batch_size,
                               seq_len=cfg.model.seq_len, seed=seed)
        load_flat_params(model, theta)
        InnerTrainer(model, cfg.inner, sampler).run(cfg.inner.steps)
        deltas.append(theta - flat_params(model))
    rows_dense = torch.stack(deltas)  # (n, d)
    out = []
    for spec in ("randk:0.05+int8", "topk:0.05+int8"):
        codec = codecs.build(spec)
        rows = torch.stack([codec.decode(codec.encode(d, seed=7), theta.numel(), seed=7) for d in rows_dense])
        reference = rows.mean(dim=0)  # what `mean` aggregates from these payloads, (d,)
        for agg in ("mean", "median", "trimmed-mean", "centered-clip", "krum", "geometric-median"):
            got = aggregate.build(agg, num_byzantine=2)(rows)
            out.append({
                "codec": spec, "aggregator": agg,
                "cosine_to_mean": float(torch.nn.functional.cosine_similarity(got, reference, dim=0)),
                "norm_ratio": float(got.norm() / reference.norm()),
                "nonzero_fraction": float((got != 0).float().mean() / (reference != 0).float().mean()),
                "peers_per_kept_coordinate": float((rows != 0).sum(0)[reference != 0].float().mean()),
            })
    return out


# --- CLI -------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--phases", default="main,variants,fvalues,compression", help="comma-separated phases")
    parser.add_argument("--seeds", default="0,1", help="comma-separated seeds (default 0,1)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes, 1 torch thread each (0: in-process)")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="bench", help="run size (tiny: smoke test)")
    parser.add_argument("--out", default=str(OUT), help="directory for byzantine.{json,md,png}")
    parser.add_argument("--fresh", action="store_true", help="ignore runs already in the JSON")
    parser.add_argument("--report-only", action="store_true", help="only redo md/png from the JSON")
    parser.add_argument("--limit", type=int, default=None, help="run at most this many new cases (for testing)")
    parser.add_argument("--exchange", choices=EXCHANGES, default=A2A,
                        help="how updates meet in every run (sliced: results in byzantine_sliced.{json,md})")
    parser.add_argument("--aggregators", default=None, help="comma-separated rules to run (default: all)")
    parser.add_argument("--worst", type=int, default=1, help="fvalues runs main's WORST worst attacks (default 1)")
    args = parser.parse_args(argv)
    from scripts.machine_info import command_line, load_average, machine_facts, machine_lines

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "byzantine" if args.exchange == A2A else f"byzantine_{args.exchange}"
    path = out / f"{stem}.json"
    profile = PROFILES[args.profile]
    seeds = [int(s) for s in args.seeds.split(",")]
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = sorted(set(phases) - {"main", "variants", "fvalues", "compression"})
    if unknown:
        parser.error(f"unknown phase(s) {unknown}; choose from main, variants, fvalues, compression")
    aggregators = None if args.aggregators is None else [a.strip() for a in args.aggregators.split(",") if a.strip()]
    if aggregators is not None and set(aggregators) - set(ALL_AGGREGATORS):
        parser.error(f"unknown aggregator(s) {sorted(set(aggregators) - set(ALL_AGGREGATORS))}; choose from {', '.join(ALL_AGGREGATORS)}")
    results = {} if args.fresh else load(path)
    previous = json.loads(path.read_text())["meta"] if path.exists() and not args.fresh else {}
    meta = {**previous, "profile": asdict(profile), "seeds": seeds, "workers": args.workers, "exchange": args.exchange}
    load_before, started = load_average(), time.perf_counter()
    if not args.report_only:
        if previous.get("command"):  # resuming: the md names every invocation that added runs
            meta["invocations"] = [*previous.get("invocations", []),
                                   f"`{previous['command']}` ({previous.get('wall_min', 0):.1f} min)"]
        # variants and fvalues pick their attacks from main's results: planned once those are in.
        budget = args.limit
        for stage in (["main", "compression"], ["fvalues", "variants"]):
            todo = [c for c in plan([p for p in phases if p in stage], seeds, results, args.exchange, aggregators, args.worst)
                    if c.key not in results]
            todo = todo[:budget] if budget is not None else todo
            print(f"{len(todo)} runs to do for {stage} ({len(results)} already in {path})", flush=True)
            run_all(todo, profile, args.workers, results, lambda: save(path, results, meta), run_case)
            budget = None if budget is None else budget - len(todo)
        if "compression" in phases and args.exchange == A2A:
            meta["support_demo"] = support_demo(profile)
        meta.update(machine=machine_lines(machine_facts(), load_before, load_average()), command=command_line(),
                    wall_min=(time.perf_counter() - started) / 60)
        save(path, results, meta)
    if args.exchange == A2A:
        write_report(results, meta, meta.get("support_demo", []), out, strong_section(out))
        print(f"wrote {out / 'byzantine.md'} and {out / 'byzantine.png'}")
    else:
        write_sliced_report(results, meta, out / f"{stem}.md")
        print(f"wrote {out / stem}.md")
    return 0



if __name__ == "__main__":
    raise SystemExit(main())
