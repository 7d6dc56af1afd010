"""The rows of scripts/bench_fidelity.py: each a `swarmloco simulate` setting written out in full
(RunConfig overrides on top of an optional recipe, baseline, H x rounds, seeds, overlap schedule)
and the section of benchmarks/fidelity.md it belongs to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from peer.cli.simulate_shared import VARIANTS

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


# SparseLoCo as these rows ran it, before the recipe became the public-swarm recipe (e8d350b): the
# non-robust sparse-mean, f = 0, a dense all-gather; pinned so the stored runs stay what the rows say.
SPARSE_MEAN = {"aggregation.name": "sparse-mean", "aggregation.num_byzantine": 0, "exchange.result_codec": ""}
A2A = {"exchange.mode": "all-to-all", **SPARSE_MEAN}


def _sl(lr: float, decay: float) -> dict[str, Any]:
    """Overrides of a SparseLoCo row with its outer SGD step and error-feedback decay named."""
    return {**A2A, "outer.name": "fedavg", "outer.lr": lr, "compression.error_feedback_decay": decay}


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
    Row("Public-swarm recipe", "sparseloco", {}, recipe="sparseloco", rounds=13, inner_steps=15, seeds=SEEDS3,
        note="recipe sparseloco as shipped: the default sliced exchange, sparse-trimmed-mean with f = 1, "
             "the all-gather compressed to the top-192 of 4096 (2-bit)"),
    Row("Agreed support (vote)", "sparseloco", VARIANTS["vote"], recipe="sparseloco", rounds=13, inner_steps=15, seeds=SEEDS3,
        note="prototype (simulate only, docs/robust-compressed.md): peers vote with their top-128 of 4096, every peer "
             "sends 2-bit values on the 128 most-voted (f + 1 = 2 votes needed), trimmed-mean f = 1, 2-bit result"),
    Row("Agreed support (vote) mean f=0", "sparseloco", {**VARIANTS["vote"], "aggregation.name": "mean",
                                                          "aggregation.num_byzantine": 0}, recipe="sparseloco", rounds=13,
        inner_steps=15, note="diagnostic: the vote's support with the plain mean and f = 0 (1 vote needed): what trimming costs"),
    Row("Agreed support (vote) K=192", "sparseloco", {**VARIANTS["vote"], "compression.codec": "chunk-topk:4096:192+stat2"},
        recipe="sparseloco", rounds=13, inner_steps=15, note="diagnostic: the vote on top-192 index sets, 192 per chunk aligned"),
    Row("Public-swarm recipe dense gather", "sparseloco", {"exchange.result_codec": "fp16"}, recipe="sparseloco", rounds=13,
        inner_steps=15, note="the recipe with a dense fp16 all-gather (what the compressed aggregate costs or buys)"),
    Row("SparseLoCo", "sparseloco", A2A, recipe="sparseloco", rounds=13, inner_steps=15,
        seeds=SEEDS3, note="recipe sparseloco (outer SGD lr 2, error feedback decay 0.9); 13 x 15 = 195 inner steps (~ 8 x 25)"),
    Row("SparseLoCo published", "sparseloco", _sl(1.0, 0.95), recipe="sparseloco", rounds=13, inner_steps=15, seeds=SEEDS3,
        note="the published settings: outer SGD lr 1.0, error feedback decay 0.95"),
    Row("SparseLoCo H=10", "sparseloco", {**A2A, "inner.steps": 10}, recipe="sparseloco",
        rounds=20, inner_steps=10, seeds=SEEDS3, note="recipe sparseloco at 20 rounds x H=10: 1.5x the rounds of H=15"),
    Row("SparseLoCo H=25", "sparseloco", {**A2A, "inner.steps": 25}, recipe="sparseloco",
        note="recipe sparseloco at the reference's 8 x H=25"),
    Row("SparseLoCo plain mean", "sparseloco", {**A2A, "aggregation.name": "mean"},
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
