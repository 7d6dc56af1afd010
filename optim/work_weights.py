"""Work weights: how much each update counts, from the work its author claims, capped so a
claim cannot buy influence (shared/DESIGN.md, "Heterogeneous peers").

A peer's signed header says how many tokens it trained on this round. Taken at its word, a
peer claiming 4x its work would weigh 4x. Every cap below uses only what every node holds (the
round's signed claims, the work accepted for each peer in earlier rounds), so every owner and
every peer computes the same weights:

- the swarm: at most ``median_factor`` x the round's median claim. A volunteer 10x faster than
  the typical peer counts 2x (its extra steps still make its own update better); a liar gains
  at most the same 2x;
- the peer's history: at most ``growth`` x the work accepted for it last round, when there was
  one, so a peer cannot jump from its usual share to the cap in one round;
- the rule: the f heaviest rows hold at most ``max_heavy_share`` (30%: strictly below a third) of
  the total, lowering the largest weights together (water-filling) until they do. The robust rules
  need f rows to hold less than half the mass (optim/aggregate_weighted.py); a median with f rows
  holding s of it, all on one side, lands at the honest rows' (1/2 - s)/(1 - s) quantile: 2/7 at
  0.3, 1/4 at a third, 1/6 at 0.4 (benchmarks/byzantine_mixed.md measured 0.4 2-3 points worse).
  Why not exactly a third: claims are whole steps, so the cut level then tends to equal a sum of
  other rows' weights (f = 2 of 8 at speeds 1, 1, 0.5, 0.25 x 2: the level is 6 = 4 + 2 steps),
  and the middle of the mass falls exactly on a boundary between two values in many coordinates;
  the median then averages in the value nearer the attackers' side. Every cap in (2/7, 1/3) gives
  that grid the same ranks, hence the same bits; 0.3 sits inside, off the tie. A lower cap is no
  better: at 1/4 (equal weights there) the slow peers' rows count as much as the fast ones' and
  the clean run alone loses 17% (docs/heterogeneous-peers.md).

A claim that is not a finite number >= 0 counts 0. Weights are returned raw (tokens, after the
caps); the rules normalise them.

Rows on one scale (``per_work_scales``). A pseudo-gradient grows with the steps behind it: in a
window, a fast peer's row is several times a slow one's. The mean weighs that correctly, but a rule
that compares rows by value (a median, a trimmed mean, a distance) then mostly compares work, not
direction: its middle lands among the small rows, and f heavy rows pushing to one side pull it
down to the slow peers' scale. So those rules see each row per unit of the work it claims, times
the round's typical work (FedNova's normalised averaging, Wang et al. 2020, there with tau the
weights' mean of the local steps): row_i x tau / claim_i, tau = the weighted median of the claims
after the median and history caps, by the weights above. A liar controls its row and its claim, so
it gains nothing it could not send anyway; while f rows hold less than half the weight, tau stays
within the honest rows' claims (a weighted mean of claims would move with every capped lie: +25%
with f = 2 of 8 claiming 4x in benchmarks/byzantine_mixed.md). Where the fast peers hold most of
the weight, tau is their work: the scale the median took from them on raw rows in a clean round.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(kw_only=True, slots=True)
class WorkCaps:
    median_factor: float = 2.0  # no claim counts more than this x the round's median claim
    growth: float = 2.0  # nor more than this x the peer's accepted work last round
    max_heavy_share: float = 0.3  # the f heaviest rows' share of the total weight, at most (below a third: see above)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.median_factor) and self.median_factor >= 1.0):
            raise ValueError(f"median_factor must be a number >= 1, got {self.median_factor!r}")
        if not (math.isfinite(self.growth) and self.growth >= 1.0):
            raise ValueError(f"growth must be a number >= 1, got {self.growth!r}")
        if not (0.0 < self.max_heavy_share < 0.5):
            raise ValueError(
                f"max_heavy_share must be in (0, 0.5): f rows at half the weight could outvote the rest; "
                f"got {self.max_heavy_share!r}"
            )


@dataclass(frozen=True, slots=True)
class WorkWeights:
    weights: tuple[float, ...]  # per row, after every cap
    claimed: tuple[float, ...]  # per row, as claimed (invalid claims as 0)
    credible: tuple[float, ...]  # per row, after the median and history caps (before the minority one)
    capped_by: tuple[str, ...]  # per row: "" (as claimed), "invalid", "median", "history" or "minority"


def _valid(claim: object) -> float | None:
    if isinstance(claim, bool) or not isinstance(claim, int | float):
        return None
    value = float(claim)
    return value if math.isfinite(value) and value >= 0 else None


def minority_level(weights: Sequence[float], num_byzantine: int, share: float) -> float:
    """The largest level c such that, with every weight cut to min(w, c), the f heaviest hold at
    most ``share`` of the total; inf when they already do. Where even equal weights would give f
    rows more than ``share`` (too few rows carry work), the smallest positive weight: all equal.
    Needs more than f positive weights."""
    f = num_byzantine
    ranked = sorted(weights, reverse=True)
    if f <= 0 or sum(ranked[:f]) <= share * sum(ranked):
        return math.inf
    carrying = sum(1 for w in ranked if w > 0)
    if carrying <= f:
        raise ValueError(
            f"only {carrying} rows carry work, so f={f} of them could hold all the weight; wait for more "
            f"peers or lower num_byzantine"
        )
    # Cut the top j weights to c (ranked[j] <= c <= ranked[j-1]); the total is then j*c + R with
    # R = sum(ranked[j:]). The f heaviest hold j*c + sum(ranked[j:f]) while j < f, f*c from j = f
    # on. Solve "f heaviest = share * total" for the first j that fits (the largest such c).
    for j in range(1, carrying):
        rest = sum(ranked[j:])
        if j < f:
            c = (share * rest - sum(ranked[j:f])) / (j * (1.0 - share))
        else:
            denominator = f - share * j
            if denominator <= 0:
                break
            c = share * rest / denominator
        if ranked[j] <= c <= ranked[j - 1]:
            return c
    return ranked[carrying - 1]


def capped_work(
    claims: Sequence[object],
    *,
    num_byzantine: int,
    previous: Sequence[float | None] | None = None,
    caps: WorkCaps | None = None,
) -> WorkWeights:
    """Each row's weight from its claimed work (tokens), every cap above applied in turn.
    ``previous``: the work accepted for each row's author last round, None where unknown."""
    caps = WorkCaps() if caps is None else caps
    if previous is not None and len(previous) != len(claims):
        raise ValueError(f"got {len(previous)} previous works for {len(claims)} claims; one per row")
    values = [_valid(c) for c in claims]
    claimed = [0.0 if v is None else v for v in values]
    reasons = ["" if v is not None else "invalid" for v in values]
    positive = [v for v in claimed if v > 0]
    median = statistics.median(positive) if positive else 0.0
    weights = list(claimed)
    for i, w in enumerate(weights):
        bound, why = caps.median_factor * median, "median"
        before = None if previous is None else _valid(previous[i])
        if before is not None and before > 0 and caps.growth * before < bound:
            bound, why = caps.growth * before, "history"
        if w > bound:
            weights[i], reasons[i] = bound, why
    credible = tuple(weights)
    level = minority_level(weights, num_byzantine, caps.max_heavy_share)
    if math.isfinite(level):
        for i, w in enumerate(weights):
            if w > level:
                weights[i], reasons[i] = level, "minority"
    return WorkWeights(weights=tuple(weights), claimed=tuple(claimed), credible=credible, capped_by=tuple(reasons))


def per_work_scales(shares: WorkWeights) -> tuple[float, ...] | None:
    """Each row's factor onto one scale, tau / claim_i (see the module's "Rows on one scale"), or
    None where every row carrying work claims the same (nothing to rescale: the rule's bits stay
    those of the unscaled rows). A row that claims nothing keeps its values (factor 1): its weight
    is 0."""
    positive = {c for c in shares.claimed if c > 0}
    if len(positive) <= 1:
        return None
    tau = weighted_median(shares.credible, shares.weights)
    return tuple(tau / c if c > 0 else 1.0 for c in shares.claimed)


def weighted_median(values: Sequence[float], weights: Sequence[float]) -> float:
    """The value at the middle of the weight mass (values sorted, each holding its weight); where
    the middle falls on the boundary between two values, their mean. Needs a positive total."""
    ranked = sorted((v, w) for v, w in zip(values, weights) if w > 0)
    half = math.fsum(w for _, w in ranked) / 2
    eps = 1e-9 * half
    mass = 0.0
    for k, (value, weight) in enumerate(ranked):
        mass += weight
        if mass > half + eps:
            return value
        if mass >= half - eps:  # the middle sits on this value's upper boundary
            return (value + ranked[k + 1][0]) / 2 if k + 1 < len(ranked) else value
    return ranked[-1][0]
