"""The aggregation rules themselves: (n, d) float32 rows -> (d,) float32, plus
each row's share in the result. ``optim.aggregate`` wraps them with
validation, pre-aggregation mixing and the public report.

Shares ("weights") are honest attributions, not decoration:
- mean / krum / multi-krum / geometric median: the exact convex weights.
- median / trimmed mean: per coordinate, each kept value has an equal share;
  a row's weight is its share averaged over coordinates (so a row trimmed in
  every coordinate weighs 0 and the weights sum to 1).
- centered clip: the output is an affine combination of the starting centre
  and the rows; we track the coefficients through the iterations.

Distances, norms and iterative rules run in float64: Byzantine rows can hold
entries near the float32 limit, whose squares overflow float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from optim.aggregate_mixing import TieBreaker, pairwise_sq_distances


@dataclass(kw_only=True, slots=True)
class RuleResult:
    output: torch.Tensor  # (d,) float32
    weights: torch.Tensor  # (n,) float64, each row's share in the output
    selected: torch.Tensor  # (n,) bool
    clip_scale: torch.Tensor  # (n,) float64, 1.0 where the row was not clipped


def _unclipped(n: int) -> torch.Tensor:
    return torch.ones(n, dtype=torch.float64)


def mean(rows: torch.Tensor) -> RuleResult:
    n = rows.shape[0]
    # Accumulate row by row in a fixed order: no (n, d) float64 copy (the swarm's hot path on
    # 10M-float updates) and the same bits whatever the thread count.
    total = rows[0].clone()  # (d,)
    for row in rows[1:]:
        total.add_(row)
    return RuleResult(
        output=total.div_(n),
        weights=torch.full((n,), 1.0 / n, dtype=torch.float64),
        selected=torch.ones(n, dtype=torch.bool),
        clip_scale=_unclipped(n),
    )


def _sorted_band_mean(rows: torch.Tensor, lo: int, hi: int) -> RuleResult:
    """Per coordinate, average the sorted values at ranks lo..hi-1. Median and
    trimmed mean are both this, with different bands."""
    n, d = rows.shape
    values, owner = torch.sort(rows, dim=0, stable=True)  # (n, d) each
    output = values[lo:hi].double().mean(dim=0).float()
    counts = torch.bincount(owner[lo:hi].reshape(-1), minlength=n).double()  # (n,)
    weights = counts / (d * (hi - lo))
    return RuleResult(output=output, weights=weights, selected=counts > 0, clip_scale=_unclipped(n))


def median(rows: torch.Tensor) -> RuleResult:
    """Coordinate-wise median; for even n the mean of the two middle values
    (``torch.median`` would return the lower one, a biased choice)."""
    n = rows.shape[0]
    return _sorted_band_mean(rows, (n - 1) // 2, n // 2 + 1)


def trimmed_mean(rows: torch.Tensor, num_byzantine: int) -> RuleResult:
    """Drop the f largest and f smallest values per coordinate, average the rest."""
    n = rows.shape[0]
    return _sorted_band_mean(rows, num_byzantine, n - num_byzantine)


def krum_scores(rows: torch.Tensor, num_byzantine: int) -> torch.Tensor:
    """(n,) float64 Krum scores (Blanchard et al., 2017): the sum of squared
    distances from each row to its n - f - 2 nearest other rows."""
    n = rows.shape[0]
    dist = pairwise_sq_distances(rows)  # (n, n)
    dist.fill_diagonal_(float("inf"))
    nearest, _ = torch.sort(dist, dim=1)
    return nearest[:, : n - num_byzantine - 2].sum(dim=1)


def multi_krum(rows: torch.Tensor, num_byzantine: int, m: int) -> RuleResult:
    """Average of the m rows with the lowest Krum scores (the one-shot
    selection of Allouah et al. 2023; m = 1 is Krum). Ties are broken by row
    content so the choice does not depend on row order."""
    n = rows.shape[0]
    scores = krum_scores(rows, num_byzantine)
    chosen = TieBreaker(rows).argsort(scores)[:m]
    selected = torch.zeros(n, dtype=torch.bool)
    selected[chosen] = True
    weights = selected.double() / m
    return RuleResult(
        output=(weights @ rows.double()).float(), weights=weights, selected=selected, clip_scale=_unclipped(n)
    )


def geometric_median(rows: torch.Tensor, *, iterations: int, eps: float, nu: float) -> RuleResult:
    """Geometric median, argmin_z sum_i |z - x_i|, by Weiszfeld iterations
    (Weiszfeld 1937; as used for aggregation by Pillutla, Kakade & Harchaoui,
    2019, RFA) with the Vardi & Zhang (2000) step at data points.

    Starts at the coordinate-wise median: a robust point, so far outliers cost
    no extra iterations. Plain smoothing (distances floored at nu) stalls when
    the iterate sits on a row, which the coordinate-wise median often is (in
    1-D, always): that row's weight 1/nu then pins the iterate in place. So
    rows closer than ``nu`` count as *at* the iterate, and the step mixes the
    Weiszfeld point of the other rows with the current point, by how strongly
    the others pull (|R| against the multiplicity eta). Stops after
    ``iterations`` or once a step moves less than ``eps`` times the median
    distance to the rows (a scale-free tolerance). ``nu`` is absolute: the
    result is accurate to about nu, so keep it well below the update norms."""
    n = rows.shape[0]
    x = rows.double()  # (n, d)
    z = median(rows).output.double()  # (d,)
    weights = torch.full((n,), 1.0 / n, dtype=torch.float64)
    for _ in range(iterations):
        diff = x - z  # (n, d)
        distance = torch.linalg.vector_norm(diff, dim=1)  # (n,)
        at = distance <= nu  # rows the iterate sits on
        beta = torch.where(at, torch.zeros_like(distance), 1.0 / distance.clamp_min(nu))
        if not bool(beta.any()):  # every row is at the iterate: z is the answer
            weights = at.double() / at.sum()
            z = weights @ x
            break
        eta = int(at.sum())
        pull = torch.linalg.vector_norm(beta @ diff).item()  # |R|: sum of unit vectors to the other rows
        stay = min(1.0, eta / pull) if pull > 0 else 1.0
        weights = (1.0 - stay) * beta / beta.sum() + (stay / max(eta, 1)) * at.double()
        new_z = weights @ x
        step = torch.linalg.vector_norm(new_z - z).item()
        z = new_z
        if step <= eps * distance.median().item():
            break
    return RuleResult(
        output=z.float(), weights=weights, selected=torch.ones(n, dtype=torch.bool), clip_scale=_unclipped(n)
    )


def centered_clip(
    rows: torch.Tensor, *, tau: float | None, iterations: int, center: torch.Tensor | None
) -> RuleResult:
    """Centered clipping (Karimireddy, He & Jaggi, 2021):
    v <- v + (1/n) sum_i clip_tau(x_i - v), with clip_tau(u) = u * min(1, tau/|u|).

    Starts from ``center`` (the previous aggregate) or, without one, the
    coordinate-wise median. ``tau=None`` uses, at every iteration, the median
    distance of the rows to the current centre: scale-free, and at least half
    the rows stay unclipped.

    Shares: v_k = a_k * v_0 + sum_i b_ki * x_i. With a median start, v_0's
    share a_L is spread by the median's own shares; with a previous-aggregate
    start it belongs to no current row, so the weights then sum to 1 - a_L."""
    n = rows.shape[0]
    x = rows.double()  # (n, d)
    if center is None:
        start = median(rows)
        v = start.output.double()
        start_weights = start.weights
    else:
        v = center.double()
        start_weights = torch.zeros(n, dtype=torch.float64)
    a = 1.0
    b = torch.zeros(n, dtype=torch.float64)
    scale = _unclipped(n)
    for _ in range(iterations):
        diff = x - v  # (n, d)
        distance = torch.linalg.vector_norm(diff, dim=1)  # (n,)
        radius = distance.median().item() if tau is None else tau
        scale = torch.where(distance > radius, radius / distance, torch.ones_like(distance))
        v = v + scale @ diff / n
        keep = 1.0 - scale.sum().item() / n
        a, b = a * keep, b * keep + scale / n
    return RuleResult(
        output=v.float(), weights=b + a * start_weights, selected=scale >= 1.0, clip_scale=scale
    )
