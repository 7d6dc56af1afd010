"""Recipes: published training settings reachable by name (`--recipe NAME`).

A recipe is a set of RunConfig overrides applied after the config file and before the explicit
flags (peer/cli/run_flags.py), so `--recipe sparseloco --inner-steps 30` runs SparseLoCo with
H = 30. benchmarks/fidelity.md measures each one; README "Recipes" says which link suits which.

    diloco      DiLoCo (Douillard et al. 2023): Nesterov outer step, dense fp16 pseudo-gradients;
                momentum 0.8 instead of the paper's 0.9 (better on 3 seeds in benchmarks/fidelity.md
                and on 2 seeds at 24 rounds in benchmarks/compression.md).
    sparseloco  the public-swarm recipe: SparseLoCo's payloads (Templar 2025, CCLoco: top-64 per
                chunk of 4096, 2-bit statistical values, error feedback decay 0.9, outer SGD lr 2,
                H = 15), aggregated robustly with sparse-trimmed-mean (f = 1 declared, raise it with
                --num-byzantine; rows too few others vouch for in sign, bit-identical copies and rows
                under half the median norm are set aside first, the screen of optim/sparse_screen.py;
                a coordinate needs 2 senders) and gathered compressed (each aggregated slice as its top-192
                per chunk of 4096, 2-bit; what it drops returns to the senders' error feedback):
                docs/compressed-exchange.md says why and what it measured.
    demo        DeMo (Peng et al. 2024) as Psyche runs it: decoupled momentum (decay 0.999),
                only the top-4 DCT coefficients per chunk of 64 on the wire as 1-bit signs,
                a sign step on their average, taken often: H = 5 with step 2.5e-3 (+2.1% vs
                DiLoCo fp32 on 3 seeds in benchmarks/fidelity.md; at H = 25 the best step,
                1e-2, lost +7.3%). DeMo's paper steps every inner step with 1e-3.

Imports no torch (the CLI's --help stays fast).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Recipe:
    name: str
    summary: str  # one line for --help and the README
    link: str  # which network it suits
    overrides: dict[str, Any] = field(default_factory=dict)  # RunConfig path -> value


RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe(
            "diloco", "DiLoCo: Nesterov outer step (lr 0.7, momentum 0.8), dense fp16 pseudo-gradients",
            "fast links (datacenter, >= 1 Gbit/s): the best loss per round",
            {"outer.name": "nesterov", "outer.lr": 0.7, "outer.momentum": 0.8, "compression.codec": "fp16",
             "compression.error_feedback": True, "compression.error_feedback_decay": 1.0},
        ),
        Recipe(
            "sparseloco",
            "the public-swarm recipe: SparseLoCo payloads (top-64 of every 4096 values, 2-bit statistical values, "
            "error feedback decay 0.9), the robust sparse-trimmed-mean with f = 1 declared and its row screen, a compressed "
            "all-gather (top-192 of every 4096, 2-bit), outer SGD lr 2, H=15",
            "slow links (home broadband, WAN), open swarms with hostile peers: compressed both ways in the default "
            "exchange (benchmarks/compressed_exchange.md)",
            {"compression.codec": "chunk-topk:4096:64+stat2", "compression.error_feedback": True,
             "compression.error_feedback_decay": 0.9, "aggregation.name": "sparse-trimmed-mean",
             "aggregation.num_byzantine": 1,
             "exchange.result_codec": "chunk-topk:4096:192+stat2", "outer.name": "fedavg", "outer.lr": 2.0,
             "inner.steps": 15},
        ),
        Recipe(
            "demo",
            "DeMo: decoupled momentum 0.999, top-4 DCT coefficients per chunk of 64 as 1-bit signs, sign step 2.5e-3, H=5",
            "parity with DeMo/Psyche; on the default model sparseloco is better on loss and on bytes",
            {"outer.name": "demo", "outer.lr": 2.5e-3, "outer.demo_decay": 0.999, "outer.demo_chunk": 64, "outer.demo_topk": 4,
             "compression.codec": "dct-topk:64:4+sign", "compression.error_feedback": False,
             "aggregation.name": "mean", "inner.steps": 5},
        ),
    )
}
NAMES = tuple(RECIPES)


def recipe_overrides(name: str) -> dict[str, Any]:
    """The overrides of recipe `name`; ValueError naming the known recipes otherwise."""
    recipe = RECIPES.get(name)
    if recipe is None:
        raise ValueError(f"unknown recipe {name!r}: choose one of {', '.join(NAMES)}")
    return dict(recipe.overrides)
