"""The aggregation rules weighted by work: row i counts with weight w_i >= 0 (its capped
share of the round's work, optim/work_weights.py) instead of 1/n.

How each rule treats weights (``optim.aggregate`` routes a call here only when the weights
are not all equal; equal weights take the unweighted rules, bit for bit):
- mean: sum_i w_i x_i / sum_i w_i.
- median: per coordinate, the value at the middle of the weight mass (sorted values, each
  holding its row's weight as an interval of mass); where the middle falls exactly between
  two values, their mean (equal weights: the usual median, even n included).
- trimmed-mean: per coordinate, drop the mass the f heaviest rows hold (the most any f rows
  can hold) from each end of the sorted values and average what is left, mass-weighted
  (equal weights: exactly f values from each end). f Byzantine rows, wherever they sit, are
  inside the dropped mass on the side they push to.
- geometric-median: argmin_z sum_i w_i |z - x_i| (weighted Weiszfeld, the same Vardi-Zhang
  step as the unweighted rule).
- centered-clip: v <- v + sum_i w_i clip_tau(x_i - v) / sum_i w_i, from the weighted median
  (or the previous aggregate).
- multi-krum: selects by distances (weights do not buy a place), then the selected rows'
  weighted mean.
- krum (one row) and dnc: refused with weights (a selection of one row has nothing to weigh;
  dnc's filter is defined on counts).
Robustness needs the f heaviest rows to hold less than half the mass (median, trimmed-mean,
centered-clip's start): refused otherwise, so cap the weights first.

Determinism as in optim/aggregate_rules.py: rows are taken in content order (identical rows
then by weight), so the same (row, weight) pairs in any order give the same bits.
"""

from __future__ import annotations

import torch

from optim.aggregate_mixing import TieBreaker, canonical_order
from optim.aggregate_rules import RuleResult, _unclipped, in_input_order, krum_scores

# Where the middle of the mass falls "exactly" on a boundary between two values: relative to
# the total mass, far below any real weight difference, far above float64 rounding in a cumsum.
_BOUNDARY_TOLERANCE = 1e-9


def checked_weights(weights: object, n: int) -> torch.Tensor:
    """(n,) float64 weights, refused with a message unless finite, >= 0 and not all 0."""
    w = torch.as_tensor(weights, dtype=torch.float64).flatten()
    if w.numel() != n:
        raise ValueError(f"got {w.numel()} weights for {n} update rows; pass one weight per row")
    if not bool(torch.isfinite(w).all()) or bool((w < 0).any()):
        raise ValueError(f"weights must be finite and >= 0, got {w.tolist()}")
    if float(w.sum()) <= 0:
        raise ValueError("every weight is 0: at least one row must count")
    return w


def weighted_order(rows: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """(n,) row indices in content order, identical rows ordered by weight."""
    order = canonical_order(rows).tolist()
    start = 0
    while start < len(order):
        stop = start + 1
        while stop < len(order) and torch.equal(rows[order[stop]], rows[order[start]]):
            stop += 1
        order[start:stop] = sorted(order[start:stop], key=lambda k: float(weights[k]))
        start = stop
    return torch.tensor(order, dtype=torch.int64)


def heaviest_mass(weights: torch.Tensor, f: int) -> float:
    """The most weight any f rows hold."""
    weights = torch.as_tensor(weights, dtype=torch.float64)
    return float(torch.sort(weights, descending=True).values[:f].sum()) if f > 0 else 0.0


def require_minority(weights: torch.Tensor, f: int, rule: str) -> None:
    weights = torch.as_tensor(weights, dtype=torch.float64)
    total = float(weights.sum())
    heavy = heaviest_mass(weights, f)
    if 2 * heavy >= total:
        raise ValueError(
            f"{rule} with num_byzantine={f}: the {f} heaviest rows hold {heavy / total:.0%} of the weight, "
            f"so f rows could outweigh the rest; cap the work weights (optim.work_weights) or lower f"
        )


def _in_order(rows: torch.Tensor, weights: torch.Tensor, rule) -> RuleResult:
    weights = weights.to(torch.float64)
    order = weighted_order(rows, weights)
    return in_input_order(rule(rows[order], weights[order]), order)


def _mean_in_order(rows: torch.Tensor, w: torch.Tensor) -> RuleResult:
    n = rows.shape[0]
    total = torch.zeros(rows.shape[1], dtype=torch.float64)  # (d,)
    for k in range(n):
        if float(w[k]) > 0:
            total.add_(rows[k].double(), alpha=float(w[k]))
    share = w / w.sum()
    return RuleResult(
        output=total.div_(float(w.sum())).float(), weights=share, selected=w > 0, clip_scale=_unclipped(n)
    )


def weighted_mean(rows: torch.Tensor, weights: torch.Tensor) -> RuleResult:
    return _in_order(rows, weights, _mean_in_order)


def _band(rows: torch.Tensor, w: torch.Tensor, trim: float | None) -> RuleResult:
    """Per coordinate over the mass-sorted values: ``trim`` mass dropped at each end and the
    rest averaged, or (``trim`` None) the value at the middle of the mass."""
    n, d = rows.shape
    values, owner = torch.sort(rows, dim=0, stable=True)  # (n, d) each
    mass = w[owner]  # (n, d): each sorted value's weight
    upper = torch.cumsum(mass, dim=0)  # (n, d): where each value's mass interval ends
    lower = upper - mass
    total = float(w.sum())
    if trim is None:
        half, eps = total / 2, _BOUNDARY_TOLERANCE * total
        # A value counts if the middle lies inside its interval; at a boundary both neighbours
        # count half (the mean of the two middle values).
        # Only a value with more mass than the tolerance window can sit at a boundary: a sliver
        # of mass at the middle (a claim of ~0 work) would otherwise count beside both neighbours.
        inside = (lower < half - eps) & (upper > half + eps)
        at_top = (upper - half).abs() <= eps
        at_bottom = (lower - half).abs() <= eps
        share = inside.double() + 0.5 * ((at_top | at_bottom) & (mass > 2 * eps)).double()  # (n, d)
        share = share / share.sum(dim=0, keepdim=True)  # a convex combination in every coordinate
    else:
        keep_lo, keep_hi = trim, total - trim
        kept = (torch.minimum(upper, torch.tensor(keep_hi)) - torch.maximum(lower, torch.tensor(keep_lo))).clamp_min(0)
        share = kept / (keep_hi - keep_lo)  # (n, d), sums to 1 per coordinate
    output = (share * values.double()).sum(dim=0).float()  # (d,)
    per_row = torch.zeros(n, dtype=torch.float64)
    per_row.index_add_(0, owner.reshape(-1), share.reshape(-1))
    row_share = per_row / d
    return RuleResult(output=output, weights=row_share, selected=row_share > 0, clip_scale=_unclipped(n))


def weighted_median(rows: torch.Tensor, weights: torch.Tensor, num_byzantine: int = 0) -> RuleResult:
    require_minority(weights, num_byzantine, "weighted median")
    return _in_order(rows, weights, lambda r, w: _band(r, w, None))


def weighted_trimmed_mean(rows: torch.Tensor, weights: torch.Tensor, num_byzantine: int) -> RuleResult:
    require_minority(weights, num_byzantine, "weighted trimmed-mean")
    trim = heaviest_mass(weights, num_byzantine)
    return _in_order(rows, weights, lambda r, w: _band(r, w, trim))


def weighted_multi_krum(rows: torch.Tensor, weights: torch.Tensor, num_byzantine: int, m: int) -> RuleResult:
    """The m rows with the lowest Krum scores (by distances alone), then their weighted mean."""
    n = rows.shape[0]
    chosen = TieBreaker(rows).argsort(krum_scores(rows, num_byzantine))[:m]
    selected = torch.zeros(n, dtype=torch.bool)
    selected[chosen] = True
    kept = torch.where(selected, weights, torch.zeros_like(weights))
    if float(kept.sum()) <= 0:
        raise ValueError("multi-krum selected only rows of weight 0; nothing to average")
    result = weighted_mean(rows, kept)
    return RuleResult(output=result.output, weights=result.weights, selected=selected, clip_scale=_unclipped(n))


def _weiszfeld(rows: torch.Tensor, w: torch.Tensor, *, iterations: int, eps: float, nu: float) -> RuleResult:
    n = rows.shape[0]
    x = rows.double()  # (n, d)
    z = _band(rows, w, None).output.double()  # (d,): the weighted median
    share = w / w.sum()
    for _ in range(iterations):
        diff = x - z  # (n, d)
        distance = torch.linalg.vector_norm(diff, dim=1)  # (n,)
        at = (distance <= nu) & (w > 0)
        beta = torch.where(at | (w == 0), torch.zeros_like(distance), w / distance.clamp_min(nu))
        if not bool(beta.any()):
            share = torch.where(at, w, torch.zeros_like(w))
            share = share / share.sum()
            z = share @ x
            break
        eta = float(w[at].sum())
        pull = torch.linalg.vector_norm(beta @ diff).item()
        stay = 0.0 if eta == 0 else (min(1.0, eta / pull) if pull > 0 else 1.0)
        at_share = torch.where(at, w, torch.zeros_like(w)) / max(eta, 1e-300)
        share = (1.0 - stay) * beta / beta.sum() + stay * at_share
        new_z = share @ x
        step = torch.linalg.vector_norm(new_z - z).item()
        z = new_z
        if step <= eps * distance.median().item():
            break
    return RuleResult(output=z.float(), weights=share, selected=w > 0, clip_scale=_unclipped(n))


def weighted_geometric_median(
    rows: torch.Tensor, weights: torch.Tensor, *, iterations: int, eps: float, nu: float
) -> RuleResult:
    return _in_order(rows, weights, lambda r, w: _weiszfeld(r, w, iterations=iterations, eps=eps, nu=nu))


def _centered_clip(
    rows: torch.Tensor, w: torch.Tensor, *, tau: float | None, iterations: int, center: torch.Tensor | None
) -> RuleResult:
    n = rows.shape[0]
    x = rows.double()  # (n, d)
    share = w / w.sum()  # (n,)
    if center is None:
        start = _band(rows, w, None)
        v, start_weights = start.output.double(), start.weights
    else:
        v, start_weights = center.double(), torch.zeros(n, dtype=torch.float64)
    a, b, scale = 1.0, torch.zeros(n, dtype=torch.float64), _unclipped(n)
    for _ in range(iterations):
        diff = x - v  # (n, d)
        distance = torch.linalg.vector_norm(diff, dim=1)  # (n,)
        radius = distance.median().item() if tau is None else tau
        scale = torch.where(distance > radius, radius / distance, torch.ones_like(distance))
        v = v + (share * scale) @ diff
        keep = 1.0 - float((share * scale).sum())
        a, b = a * keep, b * keep + share * scale
    return RuleResult(output=v.float(), weights=b + a * start_weights, selected=scale >= 1.0, clip_scale=scale)


def weighted_centered_clip(
    rows: torch.Tensor,
    weights: torch.Tensor,
    *,
    num_byzantine: int,
    tau: float | None,
    iterations: int,
    center: torch.Tensor | None,
) -> RuleResult:
    if center is None:
        require_minority(weights, num_byzantine, "weighted centered-clip (its median start)")
    return _in_order(
        rows, weights, lambda r, w: _centered_clip(r, w, tau=tau, iterations=iterations, center=center)
    )
