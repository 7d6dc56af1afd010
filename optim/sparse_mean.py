"""`sparse-mean`: each coordinate averaged over the peers that sent it (SparseLoCo's rule).

Under a top-k codec every peer keeps its own coordinates. The plain mean divides each coordinate
by all n peers, zero-filling the ones that did not select it, so a coordinate only one peer found
important moves by 1/n of that peer's value. SparseLoCo (Templar 2025) averages each coordinate
over the peers whose payload holds it: out[j] = Σ_i x[i, j] / #{i : x[i, j] ≠ 0}, and 0 where no
peer sent anything. A decoded value that is exactly 0 counts as "not sent" (a kept value that
quantizes to 0 carries nothing either). Not robust: one peer alone sets every coordinate only it
sent, so the rule refuses num_byzantine > 0.

Deterministic like optim/aggregate's rules: the sum runs in content order (canonical_order), so
every node gets the same bits whatever the row order or thread count.
"""

from __future__ import annotations

from typing import Any

import torch

from optim import aggregate, sparse_robust
from optim.aggregate_mixing import canonical_order
from optim.aggregate_rules import RuleResult

NAME = "sparse-mean"


def sparse_mean(rows: torch.Tensor) -> RuleResult:
    """(n, d) float32 -> RuleResult whose output (d,) is the mean over the non-zero entries."""
    n = rows.shape[0]
    order = canonical_order(rows).tolist()
    total = rows[order[0]].clone()  # (d,)
    count = (rows[order[0]] != 0).to(torch.float32)  # (d,) peers that sent each coordinate
    for k in order[1:]:
        total.add_(rows[k])
        count.add_((rows[k] != 0).to(torch.float32))
    output = total.div_(count.clamp_(min=1.0))
    weights = torch.full((n,), 1.0 / n, dtype=torch.float64)  # nominal: each row's share varies per coordinate
    return RuleResult(output=output, weights=weights, selected=torch.ones(n, dtype=torch.bool),
                      clip_scale=torch.ones(n, dtype=torch.float64))


class SparseMean(aggregate.Aggregator):
    """optim.aggregate.Aggregator running sparse_mean (bucketing and the report work as for any rule)."""

    def __init__(self, num_byzantine: int = 0, **options: Any) -> None:
        if num_byzantine:
            raise ValueError(
                f"{NAME} is not Byzantine-robust (a lone peer sets every coordinate only it sent): use it with "
                "num_byzantine = 0, or a robust rule (centered-clip) when peers may attack"
            )
        unknown = sorted(set(options) - {"bucket_size", "seed", "nnm"})
        if unknown:
            raise ValueError(f"unknown option(s) {', '.join(unknown)} for {NAME!r}; accepted: bucket_size, seed, nnm")
        super().__init__(NAME, 0, {"bucket_size": None, "seed": 0, "nnm": False, **options})

    def _rule(self, rows: torch.Tensor, *context: Any) -> RuleResult:  # f, centre, seed: unused here
        return sparse_mean(rows)


def build(name: str, num_byzantine: int = 0, **options: Any) -> aggregate.Aggregator:
    """optim.aggregate.build, plus `sparse-mean` and `sparse-trimmed-mean` (optim/sparse_robust.py)."""
    if name == NAME:
        return SparseMean(num_byzantine, **options)
    if name == sparse_robust.NAME:
        return sparse_robust.SparseTrimmedMean(num_byzantine, **options)
    return aggregate.build(name, num_byzantine=num_byzantine, **options)
