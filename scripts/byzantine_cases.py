"""The Byzantine benchmark's grid and the reading of its results, shared by the bench
(scripts/byzantine_bench.py), the strong-attack grid (scripts/byzantine_strong.py) and the report
(scripts/byzantine_report.py): the rules and attacks, the run profile, a case and its key, which
cases a rule refuses, the JSON the runs are stored in, and a cell's gap (final validation loss
relative to the clean `mean` run of the same seed, averaged over seeds) and worst case.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from optim import aggregate, attacks  # noqa: E402
from peer.cli.simulate_slices import LYING_OWNER  # noqa: E402
from peer.run.config import (  # noqa: E402
    AggregationConfig, CompressionConfig, DataConfig, ExchangeConfig, InnerConfig, ModelConfig, OuterConfig, RunConfig,
)
from peer.run.mode_math import WHOLE_VECTOR_RULES  # noqa: E402

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
HONEST_ONLY = "honest-only"  # no attacker and only the n - f honest peers (the f declared): the missing work's reference
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


def refusal(aggregator: str, f: int, n: int = PEERS, exchange: str = A2A) -> str | None:
    """Why `aggregator` cannot tolerate f of n peers at all, or cannot run in `exchange` (None: it can)."""
    name, options = RULES.get(aggregator, (aggregator, {}))  # a rule outside the grids (a recipe's) runs as named
    if exchange == "sliced" and (name in WHOLE_VECTOR_RULES or options.get("nnm")):
        return "scores whole update vectors: refused by the sliced exchange (docs/sliced-exchange.md)"
    rows = n // options["bucket_size"] if options.get("bucket_size") else n
    need = aggregate.minimum_rows(name, min(f, rows))
    return None if rows >= need else f"needs {need} rows, has {rows}"


COMPRESSION = {
    "randk:0.05+int8": ["median", "trimmed-mean", "centered-clip"],
    "topk:0.05+int8": ["median", "trimmed-mean", "centered-clip", "krum"],
}
COMPRESSION_ATTACKS = ["alie"]  # the attack aimed at coordinate-wise statistics


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


def exchange_of(r: dict) -> str:
    return r.get("exchange", A2A)


def gap(results: dict[str, dict], agg: str, f: int, attack: str, codec: str = DENSE,
        exchange: str = A2A, reference: Callable[[int], str] | None = None) -> tuple[float | None, str]:
    """(seed-mean gap vs the clean mean run of the same seed and exchange, status) for one cell;
    `reference(seed)`: the key of another reference run (scripts/byzantine_recipe.py: the recipe's clean run)."""
    if agg == "mean" and attack == CLEAN:
        f = 0  # `mean` ignores the declared f: its no-attacker cell is the clean reference
    gaps, statuses = [], set()
    for r in results.values():
        if (r["aggregator"], r["f"], r["codec"], exchange_of(r)) != (agg, f, codec, exchange) or attack_label(r) != attack:
            continue
        statuses.add(r["status"])
        ref = results.get(Case("clean", "mean", 0, CLEAN, r["seed"], exchange=exchange).key if reference is None
                          else reference(r["seed"]))
        if r["status"] == "ok" and ref and ref["status"] == "ok":
            loss = r["final_val_loss"]
            gaps.append((loss - ref["final_val_loss"]) / ref["final_val_loss"] if math.isfinite(loss) else math.inf)
    if not statuses:
        return None, "missing"
    if statuses != {"ok"}:
        return None, "refused" if "refused" in statuses else "error"
    return (statistics.fmean(gaps) if gaps else None), "ok"


def attack_label(r: dict) -> str:
    """The attack's name, plus its resolved options where they differ from the grid's."""
    if r["attack"] in (CLEAN, LYING_OWNER, HONEST_ONLY):
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
              and r["f"] == f and r["codec"] == codec and exchange_of(r) == exchange and attack_label(r) == attack]
    return statistics.fmean(losses) if losses else None


def worst_case(results: dict[str, dict], agg: str, f: int, names: list[str], codec: str = DENSE,
               exchange: str = A2A, reference: Callable[[int], str] | None = None) -> tuple[float | None, str, str]:
    """(largest gap over `names`, that attack, note on cells that did not run)."""
    cells = {a: gap(results, agg, f, a, codec, exchange, reference) for a in names}
    bad = sorted(a for a, (_, st) in cells.items() if st in ("error", "refused"))
    done = {a: g for a, (g, st) in cells.items() if g is not None}
    if not done:
        return None, "", ", ".join(bad)
    a = max(done, key=lambda x: done[x])
    return done[a], a, ", ".join(bad)
