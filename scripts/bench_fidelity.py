"""Training fidelity: sparse codecs, SparseLoCo, DeMo, overlapped rounds, DiLoCo vs DDP.

Every row is `swarmloco simulate` (same model, corpus, peers; 1 torch thread) with its settings
written out in full: codec, outer optimizer, aggregator, H, rounds, seeds and the overlap schedule.
Writes benchmarks/fidelity.json (one record per row and seed) and, through
scripts/fidelity_report.py, benchmarks/fidelity.md and benchmarks/fidelity.png.

    nice -n 15 .venv/bin/python scripts/bench_fidelity.py --rows "DiLoCo fp32,SparseLoCo"  # resumable
    .venv/bin/python scripts/bench_fidelity.py --report-only
    .venv/bin/python scripts/bench_fidelity.py --rounds 1 --inner-steps 2 --rows "DiLoCo fp32" --out /tmp/f  # smoke

A stored (row, seed) run is kept by --resume-style default when its stored run config and
schedule equal what the row would run now; otherwise it runs again.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from peer.cli.run_flags import resolve_run_config  # noqa: E402
from peer.cli import simulate  # noqa: E402
from peer.cli.simulate import SimulationOptions, run_simulation  # noqa: E402
from peer.learn.data import ShardSampler, load_corpus, validation_batches  # noqa: E402
from optim.codecs import FORMAT_VERSION  # noqa: E402
from peer.run.recipes import recipe_overrides  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fidelity_report import write_report  # noqa: E402
from machine_info import machine_facts  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "benchmarks"
SEEDS3 = (0, 1, 2)


@dataclass(frozen=True)
class Row:
    label: str
    group: str  # the section of the report: sparse, sparseloco, demo, overlap, ddp
    overrides: dict[str, Any] = field(default_factory=dict)  # RunConfig path -> value
    recipe: str | None = None  # applied before `overrides`, as --recipe is before flags
    baseline: str = "diloco"
    rounds: int = 8
    inner_steps: int = 25
    seeds: tuple[int, ...] = (0,)
    twin: str | None = None  # the row this one is measured against (overlapped: the same run synchronous)
    arrival: float = 1.0  # overlapped: share of the next phase run before the average lands (simulate --overlap-arrival)
    iid: bool = False  # diagnostic: every peer samples the whole corpus (own stream) instead of its shard
    note: str = ""


def _sl(lr: float, decay: float) -> dict[str, Any]:
    """Overrides of a SparseLoCo row with its outer SGD step and error-feedback decay named."""
    return {"exchange.mode": "all-to-all", "outer.name": "fedavg", "outer.lr": lr, "compression.error_feedback_decay": decay}


def _d(codec: str = "fp32", aggregator: str = "mean", **more: Any) -> dict[str, Any]:
    """Overrides of a DiLoCo row: codec, aggregator (explicit: no default rule) and the rest."""
    return {"compression.codec": codec, "aggregation.name": aggregator, "exchange.mode": "all-to-all", **more}


ROWS: list[Row] = [
    Row("DDP", "ref", baseline="ddp", seeds=SEEDS3, note="fp32 gradient all-reduce every inner step"),
    Row("DiLoCo fp32", "ref", _d(), seeds=SEEDS3, note="reference: Nesterov 0.7/0.9"),
    # (1) why the sparse path loses: the same codec through each stage of the project's path
    Row("topk 1% + int8 sliced", "sparse", {**_d("topk:0.01+int8"), "exchange.mode": "sliced"},
        note="the issue's run: per-slice top-k (32 slices), fp16 results"),
    Row("topk 1% + int8", "sparse", _d("topk:0.01+int8"), seeds=SEEDS3, note="global top-k, int8 blocks of 64"),
    Row("topk 1% + int8 one scale", "sparse", _d("topk:0.01+int8:65536"),
        note="the naive reference: global top-k of Δ+e, one int8 scale"),
    Row("topk 1% fp32 values", "sparse", _d("topk:0.01"), note="no value quantization"),
    Row("topk 1% + int8 sparse-mean", "sparse", _d("topk:0.01+int8", "sparse-mean"),
        note="each coordinate averaged over the peers that sent it"),
    # (2) SparseLoCo as published (peer/run/recipes.py), and what moves it
    Row("SparseLoCo", "sparseloco", {"exchange.mode": "all-to-all"}, recipe="sparseloco", rounds=13, inner_steps=15,
        seeds=SEEDS3, note="recipe sparseloco (outer SGD lr 2, error feedback decay 0.9); 13 x 15 = 195 inner steps (~ 8 x 25)"),
    Row("SparseLoCo published", "sparseloco", _sl(1.0, 0.95), recipe="sparseloco", rounds=13, inner_steps=15, seeds=SEEDS3,
        note="the published settings: outer SGD lr 1.0, error feedback decay 0.95"),
    Row("SparseLoCo H=10", "sparseloco", {"exchange.mode": "all-to-all", "inner.steps": 10}, recipe="sparseloco",
        rounds=20, inner_steps=10, seeds=SEEDS3, note="recipe sparseloco at 20 rounds x H=10: 1.5x the rounds of H=15"),
    Row("SparseLoCo H=25", "sparseloco", {"exchange.mode": "all-to-all", "inner.steps": 25}, recipe="sparseloco",
        note="recipe sparseloco at the reference's 8 x H=25"),
    Row("SparseLoCo plain mean", "sparseloco", {"exchange.mode": "all-to-all", "aggregation.name": "mean"},
        recipe="sparseloco", rounds=13, inner_steps=15, note="zero-filled mean instead of sparse-mean"),
    # what moves it (explicit outer step and error-feedback decay: independent of the recipe's values)
    *[Row(f"SparseLoCo outer lr {lr:g}" + (f" EF {ef:g}" if ef != 0.95 else ""), "sparseloco", _sl(lr, ef),
          recipe="sparseloco", rounds=13, inner_steps=15, seeds=SEEDS3 if (lr, ef) == (2.0, 0.95) else (0,),
          note=f"screen: outer SGD lr {lr:g}, error feedback decay {ef:g}")
      for lr, ef in ((2.0, 0.95), (3.0, 0.95), (2.0, 1.0), (2.0, 0.8), (1.5, 0.9), (2.5, 0.9))],
    Row("SparseLoCo outer lr 2 H=10", "sparseloco", {**_sl(2.0, 0.95), "inner.steps": 10}, recipe="sparseloco",
        rounds=20, inner_steps=10, seeds=SEEDS3, note="screen: outer SGD lr 2, error feedback decay 0.95, 20 rounds x H=10"),
    *[Row(f"SparseLoCo nesterov {lr:g}/{m:g}", "sparseloco",
          {**_sl(1.0, 0.95), "outer.name": "nesterov", "outer.lr": lr, "outer.momentum": m}, recipe="sparseloco",
          rounds=13, inner_steps=15, seeds=SEEDS3 if (lr, m) == (0.7, 0.7) else (0,),
          note=f"screen: DiLoCo's Nesterov outer step ({lr:g}/{m:g}) on the sparse mean, error feedback decay 0.95")
      for lr, m in ((0.7, 0.7), (0.7, 0.9), (1.0, 0.7))],
    # (3) DeMo as Psyche runs it: DCT top-k as 1-bit signs, sign step
    Row("DeMo lr 5e-3", "demo", {"exchange.mode": "all-to-all", "outer.lr": 5e-3}, recipe="demo",
        note="recipe demo (top-4 of 64, signs, decay 0.999)"),
    Row("DeMo lr 1e-2", "demo", {"exchange.mode": "all-to-all", "outer.lr": 1e-2}, recipe="demo", seeds=SEEDS3),
    Row("DeMo lr 2e-2", "demo", {"exchange.mode": "all-to-all", "outer.lr": 2e-2}, recipe="demo"),
    Row("DeMo lr 5e-3 decay 0.995", "demo", {"exchange.mode": "all-to-all", "outer.lr": 5e-3, "outer.demo_decay": 0.995},
        recipe="demo"),
    Row("DeMo lr 1e-3 (paper)", "demo", {"exchange.mode": "all-to-all", "outer.lr": 1e-3}, recipe="demo"),
    Row("DeMo top-8", "demo", {"exchange.mode": "all-to-all", "outer.lr": 1e-2, "outer.demo_topk": 8,
                               "compression.codec": "dct-topk:64:8+sign"}, recipe="demo", note="screen: top-8 of 64 (34x)"),
    Row("DeMo top-8 lr 5e-3", "demo", {"exchange.mode": "all-to-all", "outer.lr": 5e-3, "outer.demo_topk": 8,
                                       "compression.codec": "dct-topk:64:8+sign"}, recipe="demo",
        note="screen: top-8 of 64 (34x), sign step 5e-3"),
    Row("DeMo H=10 lr 5e-3", "demo", {"exchange.mode": "all-to-all", "outer.lr": 5e-3, "inner.steps": 10}, recipe="demo",
        rounds=20, inner_steps=10, note="screen: 20 rounds x H=10 (more, smaller sign steps)"),
    Row("DeMo H=10 lr 1e-2", "demo", {"exchange.mode": "all-to-all", "outer.lr": 1e-2, "inner.steps": 10}, recipe="demo",
        rounds=20, inner_steps=10, note="screen: 20 rounds x H=10"),
    Row("DeMo H=5 lr 2.5e-3", "demo", {"exchange.mode": "all-to-all", "outer.lr": 2.5e-3, "inner.steps": 5}, recipe="demo",
        rounds=40, inner_steps=5, seeds=SEEDS3, note="recipe demo: 40 rounds x H=5, sign step 2.5e-3"),
    Row("DeMo H=5 lr 5e-3", "demo", {"exchange.mode": "all-to-all", "outer.lr": 5e-3, "inner.steps": 5}, recipe="demo",
        rounds=40, inner_steps=5, note="screen: 40 rounds x H=5"),
    Row("DeMo H=10 lr 2.5e-3", "demo", {"exchange.mode": "all-to-all", "outer.lr": 2.5e-3, "inner.steps": 10}, recipe="demo",
        rounds=20, inner_steps=10, note="screen: 20 rounds x H=10"),
    Row("DeMo H=5 lr 1.25e-3", "demo", {"exchange.mode": "all-to-all", "outer.lr": 1.25e-3, "inner.steps": 5}, recipe="demo",
        rounds=40, inner_steps=5, note="screen: 40 rounds x H=5"),
    Row("DeMo H=1 lr 1e-3", "demo", {"exchange.mode": "all-to-all", "outer.lr": 1e-3, "inner.steps": 1}, recipe="demo",
        rounds=200, inner_steps=1, note="screen: the paper's regime, a sign step every inner step (200 rounds x H=1)"),
    Row("DeMo lr 1e-2 cosine", "demo", {"exchange.mode": "all-to-all", "outer.lr": 1e-2, "outer.lr_schedule": "cosine"},
        recipe="demo", note="screen: sign step decayed with the run (cosine)"),
    Row("DeMo lr 2e-2 cosine", "demo", {"exchange.mode": "all-to-all", "outer.lr": 2e-2, "outer.lr_schedule": "cosine"},
        recipe="demo", note="screen: sign step decayed with the run (cosine)"),
    Row("DeMo lr 2e-2 linear", "demo", {"exchange.mode": "all-to-all", "outer.lr": 2e-2, "outer.lr_schedule": "linear"},
        recipe="demo", note="screen: sign step decayed with the run (linear)"),
    Row("DeMo lr 1e-2 decay 0.995", "demo", {"exchange.mode": "all-to-all", "outer.lr": 1e-2, "outer.demo_decay": 0.995},
        recipe="demo", note="screen: local momentum decay 0.995"),
    # (4) overlapped rounds: the synchronous reference is DiLoCo fp32 (same codec, outer, H, rounds)
    Row("overlap delayed", "overlap", _d(**{"rounds.overlap_communication": True, "rounds.eager_updates": False}),
        twin="DiLoCo fp32", note="next phase starts from the local model (before this change)"),
    Row("overlap eager", "overlap", _d(**{"rounds.overlap_communication": True, "rounds.eager_updates": True,
                                          "rounds.eager_estimate": "own"}),
        seeds=SEEDS3, twin="DiLoCo fp32", note="eager start: step(θ_r, own fresh Δ) (the default)"),
    Row("overlap eager fit", "overlap", _d(**{"rounds.overlap_communication": True, "rounds.eager_updates": True,
                                              "rounds.eager_estimate": "fit"}),
        twin="DiLoCo fp32", note="eager start: step(θ_r, c·own fresh Δ), c the least-squares fit of the last average on the own Δ"),
    Row("overlap eager lands at 1/2", "overlap", _d(**{"rounds.overlap_communication": True, "rounds.eager_updates": True,
                                                        "rounds.eager_estimate": "own"}), arrival=0.5,
        seeds=SEEDS3, twin="DiLoCo fp32", note="eager start; the average lands halfway through the next phase and the peer moves onto it then"),
    Row("overlap eager lands at 2/5", "overlap", _d(**{"rounds.overlap_communication": True, "rounds.eager_updates": True,
                                                        "rounds.eager_estimate": "own"}), arrival=0.4, twin="DiLoCo fp32",
        seeds=SEEDS3, note="eager start; lands 0.4 into the next phase: the median measured on the emulated WAN with "
                           "the all-to-all exchange and fp16 (benchmarks/wan.md)"),
    Row("overlap eager lands at 1/5", "overlap", _d(**{"rounds.overlap_communication": True, "rounds.eager_updates": True,
                                                        "rounds.eager_estimate": "own"}), arrival=0.2,
        seeds=SEEDS3, twin="DiLoCo fp32", note="eager start; the average lands a fifth into the next phase (an exchange 1/5 as long as a phase)"),
    Row("overlap eager fp16 0.7/0.8", "overlap", _d("fp16", **{"outer.momentum": 0.8, "rounds.overlap_communication": True,
                                                                "rounds.eager_updates": True, "rounds.eager_estimate": "own"}),
        twin="fp16 0.7/0.8", note="eager start, recipe diloco's outer step (Nesterov 0.7/0.8, fp16); synchronous: fp16 0.7/0.8"),
    Row("overlap eager fp16 0.7/0.7", "overlap", _d("fp16", **{"outer.momentum": 0.7, "rounds.overlap_communication": True,
                                                                "rounds.eager_updates": True, "rounds.eager_estimate": "own"}),
        seeds=SEEDS3, twin="fp16 0.7/0.7", note="eager start, Nesterov 0.7/0.7, fp16; synchronous: fp16 0.7/0.7"),
    Row("overlap eager fp16 0.7/0.8 lands at 1/2", "overlap",
        _d("fp16", **{"outer.momentum": 0.8, "rounds.overlap_communication": True, "rounds.eager_updates": True,
                      "rounds.eager_estimate": "own"}), arrival=0.5,
        twin="fp16 0.7/0.8", note="eager start, Nesterov 0.7/0.8, fp16, the average lands halfway; synchronous: fp16 0.7/0.8"),
    Row("overlap eager own-share", "overlap", _d(**{"rounds.overlap_communication": True, "rounds.eager_updates": True,
                                                    "rounds.eager_estimate": "own-share"}),
        twin="DiLoCo fp32", note="eager start: step(θ_r, own fresh Δ / n) (the others' shares come with θ(r+1))"),
    Row("overlap eager drift", "overlap", _d(**{"rounds.overlap_communication": True, "rounds.eager_updates": True,
                                                "rounds.eager_estimate": "drift"}), twin="DiLoCo fp32",
        note="eager start: step(θ_r, own fresh Δ − (own last Δ − last average)): the peers' estimates average to the true average"),
    Row("overlap eager drift lands at 1/2", "overlap", _d(**{"rounds.overlap_communication": True, "rounds.eager_updates": True,
                                                             "rounds.eager_estimate": "drift"}), twin="DiLoCo fp32", arrival=0.5,
        note="drift-corrected eager start; the average lands halfway"),
    Row("overlap eager share", "overlap", _d(**{"rounds.overlap_communication": True, "rounds.eager_updates": True,
                                                "rounds.eager_estimate": "share"}),
        twin="DiLoCo fp32", note="eager start: step(θ_r, own fresh share + others' shares of the last average) (Kale et al.'s mixture)"),
    # (5) DiLoCo vs DDP at >= 20x fewer bytes
    Row("fp16 0.7/0.9", "ddp", _d("fp16"), note="37x fewer bytes than DDP"),
    Row("fp16 0.7/0.8", "ddp", _d("fp16", **{"outer.momentum": 0.8}), seeds=SEEDS3),
    Row("fp16 0.7/0.7", "ddp", _d("fp16", **{"outer.momentum": 0.7}), seeds=SEEDS3),
    Row("fp16 0.7/0.7 outer warm-up 2", "ddp", _d("fp16", **{"outer.momentum": 0.7, "outer.lr_warmup_rounds": 2}),
        note="outer step ramped over the first 2 rounds (1/3, 2/3, then 0.7)"),
    Row("fp16 1.0/0.7", "ddp", _d("fp16", **{"outer.lr": 1.0, "outer.momentum": 0.7}), note="outer lr 1.0"),
    Row("fp16 0.5/0.7", "ddp", _d("fp16", **{"outer.lr": 0.5, "outer.momentum": 0.7}), note="outer lr 0.5"),
    Row("fp16 0.7/0.7 H=10", "ddp", _d("fp16", **{"outer.momentum": 0.7, "inner.steps": 10}), rounds=20, inner_steps=10,
        note="H sweep: 20 rounds x H=10 (the same 200 inner steps; 2.5x the rounds)"),
    Row("fp16 0.7/0.7 H=50", "ddp", _d("fp16", **{"outer.momentum": 0.7, "inner.steps": 50}), rounds=4, inner_steps=50,
        note="H sweep: 4 rounds x H=50"),
    Row("DDP batch 16", "ddp", {"data.batch_size": 16}, baseline="ddp", note="twice the batch: 16x128 per peer per step"),
    Row("fp16 0.7/0.7 batch 16", "ddp", _d("fp16", **{"outer.momentum": 0.7, "data.batch_size": 16}), twin="DDP batch 16",
        note="twice the inner batch (16x128); compared with DDP at the same batch"),
    Row("DDP 48 rounds", "ddp", {}, baseline="ddp", rounds=48, note="6x longer: 48 x 25 steps"),
    Row("fp16 0.7/0.7 48 rounds", "ddp", _d("fp16", **{"outer.momentum": 0.7}), rounds=48, twin="DDP 48 rounds",
        note="6x longer; the gap after rounds 8, 24 and 48 is in the table below"),
    Row("DiLoCo fp32 iid data", "sparse", _d(), iid=True, note="diagnostic: peers sample the whole corpus"),
    Row("topk 1% + int8 iid data", "sparse", _d("topk:0.01+int8"), iid=True,
        note="diagnostic: peers sample the whole corpus; gap vs DiLoCo fp32 iid data in the finding"),
    # (1) continued: what lies outside the sparse path (inner AdamW settings a plain reference may not share),
    # each change run on both DiLoCo fp32 and top-1% + int8 (the gap is read pairwise in the findings)
    *[Row(f"{name} {tag}", "sparse", _d(codec, **{key: value}), note=f"diagnostic: {what}",
          seeds=SEEDS3 if tag in ("no clip", "beta2 0.999") else (0,))
      for tag, key, value, what in (("wd 0", "inner.weight_decay", 0.0, "inner AdamW without weight decay"),
                                    ("no clip", "inner.grad_clip", 0.0, "no gradient clipping"),
                                    ("no warm-up", "inner.warmup_steps", 0, "no inner lr warm-up"),
                                    ("beta2 0.999", "inner.beta2", 0.999, "inner AdamW beta2 0.999 (torch's default)"))
      for name, codec in (("DiLoCo fp32", "fp32"), ("topk 1% + int8", "topk:0.01+int8"))],
    *[Row(f"{name} plain AdamW", "sparse", _d(codec, **{"inner.weight_decay": 0.0, "inner.grad_clip": 0.0,
                                                        "inner.warmup_steps": 0, "inner.beta2": 0.999}),
          seeds=SEEDS3, note="diagnostic: all four at once (torch's AdamW defaults, no clipping, no warm-up)")
      for name, codec in (("DiLoCo fp32", "fp32"), ("topk 1% + int8", "topk:0.01+int8"))],
    Row("topk 1% + int8 no EF", "sparse", _d("topk:0.01+int8", **{"compression.error_feedback": False}),
        note="error feedback off"),
]
ROW_BY_LABEL = {row.label: row for row in ROWS}

# What the runs showed, written after reading them; figures come from fidelity.json ({label} ->
# that row's paired gap vs DiLoCo fp32, {label:ddp} -> vs DDP, {label:final} -> mean final loss).
FINDINGS: list[str] = [
    "- (1) No bug was found in the sparse path's codec, error feedback or scale handling. The naive "
    "reference's algorithm run in this harness (`topk 1% + int8 one scale`: global top-1% of Δ+e, one int8 "
    "scale, zero-filled mean, Nesterov 0.7/0.9) loses {topk 1% + int8 one scale} against DiLoCo fp32, the "
    "project's blockwise int8 {topk 1% + int8}; one scale against blockwise on the same seed: "
    "{topk 1% + int8 one scale vs topk 1% + int8}, the same. Error feedback under the zero-filled mean is "
    "unbiased (the applied sum equals the mean input minus the mean residual, pinned by "
    "tests/test_codecs.py::test_sparse_updates_averaged_with_error_feedback_lose_nothing_but_the_residuals). "
    "Non-iid shards are not the cause: with every peer sampling the whole corpus, top-1% + int8 still loses "
    "{topk 1% + int8 iid data vs DiLoCo fp32 iid data} against DiLoCo fp32 on the same data. **The inner "
    "optimizer is**: each setting a plain reference may not share changed on both sides, top-1% + "
    "int8 against DiLoCo fp32 loses, without weight decay {topk 1% + int8 wd 0 vs DiLoCo fp32 wd 0}, without "
    "the inner warm-up {topk 1% + int8 no warm-up vs DiLoCo fp32 no warm-up}, with AdamW's beta2 0.999 instead "
    "of 0.95 {topk 1% + int8 beta2 0.999 vs DiLoCo fp32 beta2 0.999}, without gradient clipping "
    "{topk 1% + int8 no clip vs DiLoCo fp32 no clip}, and with all four at once (torch's AdamW defaults, no "
    "clipping, no warm-up) {topk 1% + int8 plain AdamW vs DiLoCo fp32 plain AdamW}: the reference's +19%. "
    "The project's inner settings suit dense exchange (plain AdamW costs DiLoCo fp32 "
    "{DiLoCo fp32 plain AdamW}) and cost the sparse one (top-1% + int8 ends at "
    "{topk 1% + int8:final} with them, {topk 1% + int8 plain AdamW:final} without); the likely reading (not "
    "measured in this JSON) is that a shorter second-moment memory and clipping spread each step over more "
    "coordinates, so a top-1% keeps less of the round's pseudo-gradient. The aggregation and the outer step matter more still: averaging each coordinate over "
    "the peers that sent it (`sparse-mean`) takes the same codec to {topk 1% + int8 sparse-mean}, and "
    "SparseLoCo (2) reaches {SparseLoCo} at a similar byte count with the project's inner settings.",
    "- (2) SparseLoCo with the published settings (outer SGD lr 1.0, error-feedback decay 0.95): "
    "{SparseLoCo published}. What moved it: the outer step, lr 2 {SparseLoCo outer lr 2}, lr 3 "
    "{SparseLoCo outer lr 3}; DiLoCo's Nesterov step on the sparse mean 0.7/0.7 {SparseLoCo nesterov 0.7/0.7}, "
    "0.7/0.9 {SparseLoCo nesterov 0.7/0.9}, 1.0/0.7 {SparseLoCo nesterov 1/0.7}; then the error-feedback "
    "decay at lr 2: 1.0 {SparseLoCo outer lr 2 EF 1}, 0.9 {SparseLoCo} (the recipe now), 0.8 "
    "{SparseLoCo outer lr 2 EF 0.8}; lr 1.5 and 2.5 at decay 0.9: {SparseLoCo outer lr 1.5 EF 0.9}, "
    "{SparseLoCo outer lr 2.5 EF 0.9}. A coordinate is sent only in the rounds it makes its chunk's top 64, "
    "so a round applies a fraction of the round's progress and error feedback hands the rest to later rounds; "
    "an outer step of 2 makes up part of what DiLoCo's momentum gives the dense average, and a decay of 0.9 "
    "forgets residuals that have gone stale sooner. The zero-filled mean instead of sparse-mean: "
    "{SparseLoCo plain mean}. H: 20 rounds of H=10 {SparseLoCo H=10} (the same 146x per round, 58x over the "
    "run), 8 rounds of H=25 {SparseLoCo H=25}. Offsets bit-packed (payload format 2) took the payload from "
    "113x to 146x fewer bytes than fp32.",
    "- (3) DeMo as Psyche runs it (top-4 DCT coefficients of 64 as 1-bit signs, 68x fewer upload bytes per "
    "round; before, `--outer demo` sent dense fp16). At H=25 the sign step 5e-3 {DeMo lr 5e-3}, 1e-2 "
    "{DeMo lr 1e-2}, 2e-2 {DeMo lr 2e-2}; decaying the step over the run (cosine from 1e-2 "
    "{DeMo lr 1e-2 cosine}, from 2e-2 {DeMo lr 2e-2 cosine}, linear from 2e-2 {DeMo lr 2e-2 linear}), momentum "
    "decay 0.995 {DeMo lr 1e-2 decay 0.995}, top-8 (34x) {DeMo top-8} and top-8 at 5e-3 {DeMo top-8 lr 5e-3} "
    "did not close it. More, smaller sign steps did: H=10 (20 rounds) at 2.5e-3 / 5e-3 / 1e-2 "
    "{DeMo H=10 lr 2.5e-3}, {DeMo H=10 lr 5e-3}, {DeMo H=10 lr 1e-2}; H=5 (40 rounds) at 1.25e-3 / 2.5e-3 / "
    "5e-3 {DeMo H=5 lr 1.25e-3}, {DeMo H=5 lr 2.5e-3}, {DeMo H=5 lr 5e-3}; every step (H=1, 200 rounds, the "
    "paper's regime) {DeMo H=1 lr 1e-3}. A sign step moves every coordinate by the same amount whatever the "
    "size of the consensus, so one step per 25 inner steps throws away most of what they learned; taken every "
    "5 it tracks them. The goal is met per round, but those peers talk 5x as often: over the run DeMo at H=5 "
    "sends 14x fewer bytes than DiLoCo fp32, where SparseLoCo sends 90x fewer at a smaller gap, so on this "
    "model SparseLoCo dominates DeMo. The step sizes are sharp (a factor 2 either way costs 8-15%), single "
    "seeds except where marked.",
    "- (4) Overlapped rounds. The schedule now moves onto θ(r+1) as soon as it lands (the phase is cut after "
    "that inner step); where it lands decides the cost, against the same run synchronous: a fifth into the "
    "next phase {overlap eager lands at 1/5}, two fifths {overlap eager lands at 2/5}, halfway "
    "{overlap eager lands at 1/2}, at the phase's end {overlap eager} (an exchange as long as a phase). So the "
    "1% goal holds when the exchange takes at most about a fifth of a phase. Measured on the emulated 100 Mbit/s, "
    "50 ms RTT link (benchmarks/wan.md, fp16): with the all-to-all exchange the average lands a median 0.40 "
    "into the phase (the 2/5 row), with the sliced exchange (the default) at its end. The start point's estimate (optim/eager.py): own fresh Δ (the default; the "
    "peers' start points average to θ(r+1) exactly) {overlap eager}; the paper's mixture of the own fresh "
    "share with the others' last shares {overlap eager share}; the own share alone {overlap eager own-share}; "
    "a least-squares shrink of the own Δ {overlap eager fit}; own Δ less its last drift {overlap eager drift} "
    "(lands halfway: {overlap eager drift lands at 1/2}); starting from the local model (the schedule before "
    "eager updates) {overlap delayed}. Every estimate whose start points do not average to θ(r+1) lags it, "
    "the inner phase makes the lag up, moving the progress repeats it and the outer momentum compounds the "
    "repeat. With DiLoCo's recipe step (fp16, Nesterov 0.7/0.8) overlapped against synchronous: "
    "{overlap eager fp16 0.7/0.8 vs fp16 0.7/0.8}, landing halfway {overlap eager fp16 0.7/0.8 lands at 1/2 vs "
    "fp16 0.7/0.8}; at 0.7/0.7 {overlap eager fp16 0.7/0.7 vs fp16 0.7/0.7}. Where the peers disagree as much "
    "as here (non-iid shards: |Δ_own − mean| is as large as |mean| after round 5), any start point taken "
    "before the average is known is off by about one step.",
    "- (5) DiLoCo vs DDP: DiLoCo fp32 (19x fewer bytes) {DiLoCo fp32:ddp}; fp16 with Nesterov momentum 0.8 "
    "(37x, recipe diloco) {fp16 0.7/0.8:ddp}, momentum 0.7 {fp16 0.7/0.7:ddp}; on 3 seeds a lower outer "
    "momentum is better than 0.9 ({fp16 0.7/0.7 vs DiLoCo fp32} and {fp16 0.7/0.8 vs DiLoCo fp32} against "
    "fp32 at 0.9; fp16 is within 0.0% of fp32 in benchmarks/compression.md) and 0.7 against 0.8 is "
    "{fp16 0.7/0.7 vs fp16 0.7/0.8}: within noise. What else was tried at 0.7/0.7 (seed 0, against DDP): an "
    "outer warm-up over 2 rounds {fp16 0.7/0.7 outer warm-up 2:ddp}, outer lr 1.0 {fp16 1.0/0.7:ddp}, 0.5 "
    "{fp16 0.5/0.7:ddp}; H=10 over 20 rounds {fp16 0.7/0.7 H=10:ddp} (15x fewer bytes than DDP), H=50 over 4 "
    "{fp16 0.7/0.7 H=50:ddp}; twice the batch against DDP at that batch {fp16 0.7/0.7 batch 16 vs DDP batch 16}; "
    "6x longer, against DDP over 48 rounds, {fp16 0.7/0.7 48 rounds vs DDP 48 rounds} (after rounds 8, 16, "
    "24, 32, 40 and 48 in the table above: the gap does not close with length at this scale).",
]


def row_options(row: Row, seed: int, rounds: int | None, inner_steps: int | None) -> SimulationOptions:
    overrides = {**(recipe_overrides(row.recipe) if row.recipe else {}), **row.overrides, "seed": seed,
                 "rounds.rounds": rounds or row.rounds, "inner.steps": inner_steps or row.inner_steps}
    cfg = resolve_run_config(None, overrides)
    return SimulationOptions(peers=4, baseline=row.baseline, threads=1, overlap_arrival=row.arrival, config=cfg)


@contextlib.contextmanager
def _iid_samplers(enabled: bool) -> Iterator[None]:
    """Diagnostic only: simulate's peers each draw from the whole train set, streams told apart by
    the shard index folded into the seed (the same sampler class, a different split)."""
    if not enabled:
        yield
        return
    original = simulate._samplers

    def whole_corpus(cfg, peers):
        corpus = load_corpus(cfg.data, seq_len=cfg.model.seq_len)
        samplers = [ShardSampler(corpus.train, shard=0, num_shards=1, batch_size=cfg.data.batch_size,
                                 seq_len=cfg.model.seq_len, seed=cfg.seed * 1000 + i) for i in range(peers)]
        return samplers, validation_batches(corpus, cfg.data.batch_size, cfg.model.seq_len, cfg.data.val_batches)

    simulate._samplers = whole_corpus
    try:
        yield
    finally:
        simulate._samplers = original


def _same(stored: dict[str, Any], now: dict[str, Any]) -> bool:
    """Equal configs, ignoring fields added to RunConfig after the run was stored."""
    return all(k not in now or (_same(v, now[k]) if isinstance(v, dict) and isinstance(now[k], dict) else v == now[k])
               for k, v in stored.items()) if isinstance(stored, dict) else stored == now


def _stale_wire(stored: dict[str, Any]) -> bool:
    """A run stored before the codec's current payload format (optim/codecs.FORMAT_VERSION) measured
    other bytes for the codecs whose layout changed (format 2 bit-packs per-chunk offsets)."""
    chunked = any(stage.startswith(("chunk-topk", "dct-topk")) for stage in str(stored.get("codec", "")).split("+"))
    return chunked and stored.get("codec_format", 1) != FORMAT_VERSION


def _key(record: dict[str, Any]) -> tuple[str, int]:
    return record["label"], record["seed"]


def run_rows(rows: list[Row], out: Path, rounds: int | None, inner_steps: int | None, command: str) -> None:
    path = out / "fidelity.json"
    data = json.loads(path.read_text()) if path.exists() else {"runs": []}
    data["commands"] = [*data.get("commands", []), command]
    stored = {_key(r): r for r in data["runs"]}
    for row in rows:
        for seed in row.seeds:
            opts = row_options(row, seed, rounds, inner_steps)
            cfg = opts.run_config().to_dict()
            old = stored.get((row.label, seed))
            if (old is not None and _same(old["config"], cfg) and old.get("overlap_arrival") in (None, opts.overlap_arrival)
                    and not _stale_wire(old)):
                continue
            started = time.time()
            with _iid_samplers(row.iid):
                result = run_simulation(opts)
            result.update(label=row.label, group=row.group, recipe=row.recipe, note=row.note, iid_data=row.iid,
                          codec_format=FORMAT_VERSION,
                          loadavg_1m=os.getloadavg()[0], machine=machine_facts())
            print(f"{row.label} seed {seed}: {result['final_val_loss']:.4f} in {time.time() - started:.0f}s", flush=True)
            stored[(row.label, seed)] = result
            data["runs"] = sorted(stored.values(), key=_key)
            out.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(data, indent=1) + "\n")  # after every run: resumable


def merge(out: Path, others: list[Path]) -> None:
    """Add the runs of other fidelity.json files to out/fidelity.json (a later file's run of the same
    row and seed wins)."""
    path = out / "fidelity.json"
    data = json.loads(path.read_text()) if path.exists() else {"runs": []}
    runs = {_key(r): r for r in data["runs"]}
    commands = data.get("commands", [])
    for other in others:
        theirs = json.loads(other.read_text())
        runs.update({_key(r): r for r in theirs["runs"]})
        commands += [f"{c}  (merged from {other})" for c in theirs.get("commands", [])]
    path.write_text(json.dumps({"commands": commands, "runs": sorted(runs.values(), key=_key)}, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", help="comma-separated row labels (default: every row)")
    p.add_argument("--rounds", type=int, help="override every row's rounds (smoke tests)")
    p.add_argument("--inner-steps", type=int, help="override every row's H (smoke tests)")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--seeds", help="comma-separated seeds: run only these of each row's seeds (parallel invocations)")
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--merge", type=Path, nargs="*", default=[],
                   help="fidelity.json files of runs made in parallel (--out elsewhere) to add to --out's JSON")
    args = p.parse_args(argv)
    if args.merge:
        merge(args.out, args.merge)
    if not args.report_only:
        labels = [x.strip() for x in args.rows.split(",")] if args.rows else [r.label for r in ROWS]
        unknown = [x for x in labels if x not in ROW_BY_LABEL]
        if unknown:
            p.error(f"unknown rows {unknown}; known: {', '.join(ROW_BY_LABEL)}")
        command = "python scripts/bench_fidelity.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
        only = {int(x) for x in args.seeds.split(",")} if args.seeds else None
        chosen = [ROW_BY_LABEL[x] for x in labels]
        if only is not None:
            chosen = [dataclasses.replace(r, seeds=tuple(s for s in r.seeds if s in only)) for r in chosen]
        run_rows(chosen, args.out, args.rounds, args.inner_steps, command)
    write_report(args.out, ROWS, FINDINGS)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
