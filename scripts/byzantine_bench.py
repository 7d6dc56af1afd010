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
through scripts/byzantine_report.py); with --exchange sliced, byzantine_sliced.json and .md. This module holds the grid, the runs and the reading of their
results (gap, loss_of, worst_case); the report module turns those into the table and the heatmap.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from optim import aggregate, attacks  # noqa: E402
from peer.cli.simulate import SimulationOptions, run_simulation  # noqa: E402
from peer.cli.simulate_slices import LYING_OWNER  # noqa: E402
from peer.run.config import (  # noqa: E402
    AggregationConfig, CompressionConfig, DataConfig, ExchangeConfig, InnerConfig, ModelConfig, OuterConfig, RunConfig,
)
from peer.run.round_math import WHOLE_VECTOR_RULES  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "benchmarks"
PEERS = 8
DENSE = "fp16"  # the run config's default codec
# Non-default attack strengths, chosen so the attack can hurt: with f=2 of 8, sign-flip x1 only halves
# the mean (DiLoCo's outer lr 0.7 tolerates that); x4 makes the mean point uphill.
ATTACK_OPTIONS: dict[str, dict[str, Any]] = {"sign-flip": {"scale": 4.0}}
# label -> (aggregator name, options): the rules plus the pre-aggregation variants worth trying.
# The first grid's rules and attacks, frozen: later ones (dnc, min-max, ...) run in scripts/byzantine_strong.py.
CLASSIC_RULES = ("mean", "median", "trimmed-mean", "krum", "multi-krum", "geometric-median", "centered-clip")
CLASSIC_ATTACKS = ("sign-flip", "gaussian", "label-flip", "alie", "ipm", "mimic", "stale-replay", "free-rider", "nan",
                   "huge-norm")
AGGREGATORS: dict[str, tuple[str, dict[str, Any]]] = {name: (name, {}) for name in CLASSIC_RULES}
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "centered-clip+bucket2": ("centered-clip", {"bucket_size": 2}),
    "krum+nnm": ("krum", {"nnm": True}),
    "centered-clip+nnm": ("centered-clip", {"nnm": True}),
}
ALL_AGGREGATORS = {**AGGREGATORS, **VARIANTS}
# Every rule label a run may name (the strong grid adds its own).
RULES: dict[str, tuple[str, dict[str, Any]]] = {
    **ALL_AGGREGATORS, "dnc": ("dnc", {}), "trimmed-mean+nnm": ("trimmed-mean", {"nnm": True}),
    "median+bucket2": ("median", {"bucket_size": 2}),
}
CLEAN = "none"  # the attack label of runs without attackers
EXCHANGES = ("all-to-all", "sliced")
A2A = "all-to-all"  # the original grid's exchange: records without an `exchange` field ran it


@dataclass(frozen=True)
class Profile:
    """Model and schedule of every run: small enough for ~10 s per run on a shared core."""

    d_model: int = 64
    n_layer: int = 1
    n_head: int = 4
    seq_len: int = 32
    batch_size: int = 4
    val_batches: int = 8
    inner_steps: int = 8
    warmup_steps: int = 16
    rounds: int = 6
    max_corpus_bytes: int = 8_000_000
    # fedavg (θ -= aggregate): the run's default Nesterov (lr 0.7, momentum 0.9) makes a 6-round val loss
    # non-monotone (up 9% in the last round on one seed), a noise floor above the 1% and 5% targets.
    outer: str = "fedavg"

    def config(self, seed: int, aggregator: str, f: int, codec: str, exchange: str = A2A) -> RunConfig:
        name, options = RULES[aggregator]
        return RunConfig(
            seed=seed,
            model=ModelConfig(d_model=self.d_model, n_layer=self.n_layer, n_head=self.n_head, seq_len=self.seq_len),
            data=DataConfig(
                batch_size=self.batch_size, val_batches=self.val_batches, max_corpus_bytes=self.max_corpus_bytes
            ),
            inner=InnerConfig(steps=self.inner_steps, warmup_steps=self.warmup_steps),
            outer=OuterConfig(name=self.outer),
            compression=CompressionConfig(codec=codec),
            aggregation=AggregationConfig(name=name, num_byzantine=f, options=dict(options)),
            exchange=ExchangeConfig(mode=exchange),  # sliced: the run config's defaults S=32, r=2, 1 spot check
        )


PROFILES = {
    "bench": Profile(),
    "tiny": Profile(d_model=16, n_head=2, seq_len=16, batch_size=2, val_batches=2, inner_steps=2, warmup_steps=2,
                    rounds=2, max_corpus_bytes=200_000),
}


@dataclass(frozen=True)
class Case:
    phase: str
    aggregator: str  # a key of RULES
    f: int  # declared Byzantine (the aggregator's num_byzantine)
    attack: str  # CLEAN or an attack name; attackers = f when an attack is set
    seed: int
    codec: str = DENSE
    attack_options: tuple[tuple[str, Any], ...] = ()
    exchange: str = A2A

    @property
    def key(self) -> str:
        extra = ",".join(f"{k}={v}" for k, v in self.attack_options)
        prefix = "" if self.exchange == A2A else f"{self.exchange}|"  # all-to-all keys predate the field
        return f"{prefix}{self.codec}|{self.aggregator}|f{self.f}|{self.attack}{'(' + extra + ')' if extra else ''}|s{self.seed}"


def _attack_case(phase: str, aggregator: str, f: int, attack: str, seed: int, codec: str = DENSE,
                 exchange: str = A2A) -> Case:
    options = tuple(sorted(ATTACK_OPTIONS.get(attack, {}).items()))
    return Case(phase, aggregator, f, attack, seed, codec, options, exchange)


def refusal(aggregator: str, f: int, n: int = PEERS, exchange: str = A2A) -> str | None:
    """Why `aggregator` cannot tolerate f of n peers at all, or cannot run in `exchange` (None: it can)."""
    name, options = RULES[aggregator]
    if exchange == "sliced" and (name in WHOLE_VECTOR_RULES or options.get("nnm")):
        return "scores whole update vectors: refused by the sliced exchange (docs/sliced-exchange.md)"
    rows = n // options["bucket_size"] if options.get("bucket_size") else n
    need = aggregate.minimum_rows(name, min(f, rows))
    return None if rows >= need else f"needs {need} rows, has {rows}"


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


COMPRESSION = {
    "randk:0.05+int8": ["median", "trimmed-mean", "centered-clip"],
    "topk:0.05+int8": ["median", "trimmed-mean", "centered-clip", "krum"],
}
COMPRESSION_ATTACKS = ["alie"]  # the attack aimed at coordinate-wise statistics


def run_case(case: Case, profile: Profile) -> dict[str, Any]:
    record: dict[str, Any] = {"key": case.key, **asdict(case), "attack_options": dict(case.attack_options)}
    why = refusal(case.aggregator, case.f, exchange=case.exchange)
    if why:
        return {**record, "status": "refused", "error": why}
    attacked = case.attack != CLEAN
    opts = SimulationOptions(
        peers=PEERS, rounds=profile.rounds, byzantine=case.f if attacked else 0,
        attack=case.attack if attacked else None, attack_options=dict(case.attack_options),
        seed=case.seed, threads=1, config=profile.config(case.seed, case.aggregator, case.f, case.codec, case.exchange),
    )
    started = time.perf_counter()
    try:
        result = run_simulation(opts)
    except (ValueError, RuntimeError) as exc:  # e.g. too few rows left once excluded updates are dropped
        return {**record, "status": "error", "error": str(exc), "wall_s": time.perf_counter() - started}
    return {
        **record, "status": "ok", "final_val_loss": result["final_val_loss"],
        "initial_val_loss": result["initial_val_loss"], "val_loss_per_round": result["val_loss_per_round"],
        "excluded": sum(len(e) for e in result["excluded_per_round"]), "wall_s": result["wall_s"],
        "final_params_sha256": result["final_params_sha256"], "lying_owner": result["lying_owner"],
    }


# --- results --------------------------------------------------------------------------------


def load(path: Path) -> dict[str, dict]:
    if not path.exists():
        return {}
    runs = json.loads(path.read_text())["runs"]
    return {r["key"]: {"exchange": A2A, **r} for r in runs}  # the first grid's records predate `exchange`


def save(path: Path, results: dict[str, dict], meta: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"meta": meta, "runs": sorted(results.values(), key=lambda r: r["key"])}, indent=1) + "\n")
    tmp.replace(path)


def _exchange(r: dict) -> str:
    return r.get("exchange", A2A)


def gap(results: dict[str, dict], agg: str, f: int, attack: str, codec: str = DENSE,
        exchange: str = A2A) -> tuple[float | None, str]:
    """(seed-mean gap vs the clean mean run of the same seed and exchange, status) for one cell."""
    if agg == "mean" and attack == CLEAN:
        f = 0  # `mean` ignores the declared f: its no-attacker cell is the clean reference
    gaps, statuses = [], set()
    for r in results.values():
        if (r["aggregator"], r["f"], r["codec"], _exchange(r)) != (agg, f, codec, exchange) or _attack_label(r) != attack:
            continue
        statuses.add(r["status"])
        ref = results.get(Case("clean", "mean", 0, CLEAN, r["seed"], exchange=exchange).key)
        if r["status"] == "ok" and ref and ref["status"] == "ok":
            loss = r["final_val_loss"]
            gaps.append((loss - ref["final_val_loss"]) / ref["final_val_loss"] if math.isfinite(loss) else math.inf)
    if not statuses:
        return None, "missing"
    if statuses != {"ok"}:
        return None, "refused" if "refused" in statuses else "error"
    return (statistics.fmean(gaps) if gaps else None), "ok"


def _attack_label(r: dict) -> str:
    """The attack's name, plus its resolved options where they differ from the grid's."""
    if r["attack"] in (CLEAN, LYING_OWNER):
        return r["attack"]
    ran = attacks.build(r["attack"], **r["attack_options"]).options
    grid = attacks.build(r["attack"], **ATTACK_OPTIONS.get(r["attack"], {})).options
    differ = {k: v for k, v in ran.items() if grid.get(k) != v}
    return r["attack"] + ("(" + ",".join(f"{k}={v}" for k, v in differ.items()) + ")" if differ else "")


def loss_of(results: dict[str, dict], agg: str, f: int, attack: str, codec: str = DENSE,
            exchange: str = A2A) -> float | None:
    if agg == "mean" and attack == CLEAN:
        f = 0
    losses = [r["final_val_loss"] for r in results.values() if r["status"] == "ok" and r["aggregator"] == agg
              and r["f"] == f and r["codec"] == codec and _exchange(r) == exchange and _attack_label(r) == attack]
    return statistics.fmean(losses) if losses else None


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


def worst_case(results: dict[str, dict], agg: str, f: int, names: list[str], codec: str = DENSE,
               exchange: str = A2A) -> tuple[float | None, str, str]:
    """(largest gap over `names`, that attack, note on cells that did not run)."""
    cells = {a: gap(results, agg, f, a, codec, exchange) for a in names}
    bad = sorted(a for a, (_, st) in cells.items() if st in ("error", "refused"))
    done = {a: g for a, (g, st) in cells.items() if g is not None}
    if not done:
        return None, "", ", ".join(bad)
    a = max(done, key=lambda x: done[x])
    return done[a], a, ", ".join(bad)


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
            _run_all(todo, profile, args.workers, results, lambda: save(path, results, meta))
            budget = None if budget is None else budget - len(todo)
        if "compression" in phases and args.exchange == A2A:
            meta["support_demo"] = support_demo(profile)
        meta.update(machine=machine_lines(machine_facts(), load_before, load_average()), command=command_line(),
                    wall_min=(time.perf_counter() - started) / 60)
        save(path, results, meta)
    # Imported here: the report reads this module's grid and result helpers (no import cycle at load).
    from scripts.byzantine_report import write_report, write_sliced_report

    if args.exchange == A2A:
        write_report(results, meta, meta.get("support_demo", []), out)
        print(f"wrote {out / 'byzantine.md'} and {out / 'byzantine.png'}")
    else:
        write_sliced_report(results, meta, out / f"{stem}.md")
        print(f"wrote {out / stem}.md")
    return 0


def _run_all(todo: list[Case], profile: Profile, workers: int, results: dict[str, dict], checkpoint, runner=run_case) -> None:
    t0 = time.perf_counter()

    def done(i: int, record: dict[str, Any]) -> None:
        results[record["key"]] = record
        checkpoint()
        loss = record.get("final_val_loss")
        print(f"[{i}/{len(todo)} {time.perf_counter() - t0:.0f}s] {record['key']}: {record['status']}"
              + (f" val {loss:.4f}" if loss is not None else f" ({record.get('error')})"), flush=True)

    if workers <= 0:
        for i, case in enumerate(todo, 1):
            done(i, runner(case, profile))
        return
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(runner, case, profile) for case in todo]
        for i, future in enumerate(as_completed(futures), 1):
            done(i, future.result())


if __name__ == "__main__":
    raise SystemExit(main())
