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

Order independence is bit-exact: sums over rows run in content order
(``canonical_order``), either by summing in that order (mean, Krum) or by
running the rule on the rows sorted into it and mapping the per-row fields
back (median, trimmed mean, geometric median, centered clip). Otherwise float
rounding would differ with the input order and, through a stopping test or a
tie, so could a decision.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from optim.aggregate_mixing import TieBreaker, canonical_order, ordered_mean, pairwise_sq_distances


@dataclass(kw_only=True, slots=True)
class RuleResult:
    output: torch.Tensor  # (d,) float32
    weights: torch.Tensor  # (n,) float64, each row's share in the output
    selected: torch.Tensor  # (n,) bool
    clip_scale: torch.Tensor  # (n,) float64, 1.0 where the row was not clipped


def _unclipped(n: int) -> torch.Tensor:
    return torch.ones(n, dtype=torch.float64)


def _in_content_order(rows: torch.Tensor, rule: Callable[[torch.Tensor], RuleResult]) -> RuleResult:
    """``rule`` run on the rows sorted into content order, its per-row fields
    mapped back to input order. Costs one (n, d) float32 gather, only for rules
    that already copy or sort all rows."""
    order = canonical_order(rows)  # (n,) canonical position -> input row
    if torch.equal(order, torch.arange(order.numel())):
        return rule(rows)
    return in_input_order(rule(rows[order]), order)


def in_input_order(result: RuleResult, order: torch.Tensor) -> RuleResult:
    """The per-row fields of a result computed on ``rows[order]``, mapped back to input order."""

    def back(values: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(values)
        out[order] = values
        return out

    return RuleResult(
        output=result.output,
        weights=back(result.weights),
        selected=back(result.selected),
        clip_scale=back(result.clip_scale),
    )


def mean(rows: torch.Tensor) -> RuleResult:
    n = rows.shape[0]
    # Accumulate row by row in content order: no (n, d) float64 copy (the swarm's hot path on
    # 10M-float updates), the same bits whatever the thread count and whatever the row order.
    order = canonical_order(rows)
    total = rows[order[0]].clone()  # (d,)
    for k in order[1:].tolist():
        total.add_(rows[k])
    if not (math.isfinite(total.amax()) and math.isfinite(total.amin())):
        # The float32 sum overflowed (entries near the float32 limit): redo it in float64,
        # where the mean itself is representable.
        output = ordered_mean(rows, order)
    else:
        output = total.div_(n)
    return RuleResult(
        output=output,
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


def band(name: str, n: int, num_byzantine: int) -> tuple[int, int]:
    """The sorted ranks lo..hi-1 that median and trimmed mean average over n rows."""
    if name == "median":  # for even n the two middle values (torch.median's lower one alone would be biased)
        return (n - 1) // 2, n // 2 + 1
    if name == "trimmed-mean":  # without the f largest and f smallest values
        return num_byzantine, n - num_byzantine
    raise ValueError(f"{name!r} is not a sorted-band rule (median, trimmed-mean)")


def median(rows: torch.Tensor) -> RuleResult:
    """Coordinate-wise median; for even n the mean of the two middle values
    (``torch.median`` would return the lower one, a biased choice). In content
    order so equal values' shares go to the same rows whatever the order."""
    lo, hi = band("median", rows.shape[0], 0)
    return _in_content_order(rows, lambda r: _sorted_band_mean(r, lo, hi))


def trimmed_mean(rows: torch.Tensor, num_byzantine: int) -> RuleResult:
    """Drop the f largest and f smallest values per coordinate, average the rest."""
    lo, hi = band("trimmed-mean", rows.shape[0], num_byzantine)
    return _in_content_order(rows, lambda r: _sorted_band_mean(r, lo, hi))


NETWORK_MAX_ROWS = 64  # up to here a sorting network beats torch.sort's per-column sorts; above, torch.sort


def sorted_band_output(rows: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """(d,) float32: ``_in_content_order(rows, _sorted_band_mean(., lo, hi)).output``
    bit for bit, without the per-row shares (a slice owner's reduce, which reports
    none: the median of the default run).

    torch.sort along dim 0 sorts each of the d columns alone: ~8 ms for 8 rows x 31k
    columns, where the swarm's mean takes 0.6. A sorting network of elementwise
    minimum / maximum over whole rows sorts every column at once (19 comparators for
    8 rows). It puts the same value at every rank, so the band sums to the same bits.
    The one freedom, which of two equal values goes where, only matters for -0.0
    against +0.0, and torch's sum starts from +0.0, so a zero sum is +0.0 either way
    (tests/test_aggregate_network.py holds it to the sort's bits, ties and zeros included)."""
    n = rows.shape[0]
    if n > NETWORK_MAX_ROWS:
        return _in_content_order(rows, lambda r: _sorted_band_mean(r, lo, hi)).output
    values = network_sorted(rows)
    return torch.stack(values[lo:hi]).double().mean(dim=0).float()  # (d,) summed as _sorted_band_mean sums it


def network_sorted(rows: torch.Tensor) -> list[torch.Tensor]:
    """(n, d) rows -> n (d,) rows with every column sorted, by the comparators of a sorting network
    over whole rows (also optim/aggregate_weighted.py's sort keys, int64)."""
    if rows.device.type == "cpu" and rows.dtype in (torch.float32, torch.int64):
        return _numpy_network(rows, rows.shape[0])
    values = list(rows.unbind(0))  # n views of (d,)
    for i, j in _comparators(rows.shape[0]):
        values[i], values[j] = torch.minimum(values[i], values[j]), torch.maximum(values[i], values[j])
    return values


def _numpy_network(rows: torch.Tensor, n: int) -> list[torch.Tensor]:
    """The comparators over a copy of the rows with numpy, in place plus one spare row: no
    allocation per comparator, and a numpy call costs about half a torch call here (8 x 31k:
    ~0.6 ms against ~1.3 ms on a loaded machine). Each column's values end sorted, as torch's
    minimum / maximum leave them."""
    work = rows.detach().numpy().copy()  # (n, d)
    values = list(work)  # n row views
    spare = np.empty_like(values[0])
    for i, j in _comparators(n):
        np.minimum(values[i], values[j], out=spare)
        np.maximum(values[i], values[j], out=values[j])
        values[i], spare = spare, values[i]
    return [torch.from_numpy(v) for v in values]


@functools.cache
def _comparators(n: int) -> tuple[tuple[int, int], ...]:
    """Batcher's odd-even merge sort for n wires: (i, j) pairs, i < j, applied in order
    (min to i, max to j). Built for the next power of two; a comparator reaching past
    n would meet a +inf padding wire and move nothing, so it is left out."""
    size = 1
    while size < n:
        size *= 2
    pairs = []
    p = 1
    while p < size:
        k = p
        while k >= 1:
            for j in range(k % p, size - k, 2 * k):
                for i in range(min(k, size - j - k)):
                    if (i + j) // (2 * p) == (i + j + k) // (2 * p):
                        pairs.append((i + j, i + j + k))
            k //= 2
        p *= 2
    return tuple((i, j) for i, j in pairs if j < n)


def krum_scores(rows: torch.Tensor, num_byzantine: int) -> torch.Tensor:
    """(n,) float64 Krum scores (Blanchard et al., 2017): the sum of squared
    distances from each row to its n - f - 2 nearest other rows. Summed with
    ``math.fsum`` (correctly rounded): equal multisets of distances give equal
    scores exactly, so ties are real ties, whatever the summation order."""
    n = rows.shape[0]
    dist = pairwise_sq_distances(rows)  # (n, n)
    dist.fill_diagonal_(float("inf"))
    nearest, _ = torch.sort(dist, dim=1)  # (n, n)
    return torch.tensor(
        [math.fsum(row) for row in nearest[:, : n - num_byzantine - 2].tolist()], dtype=torch.float64
    )


def multi_krum(rows: torch.Tensor, num_byzantine: int, m: int) -> RuleResult:
    """Average of the m rows with the lowest Krum scores (the one-shot
    selection of Allouah et al. 2023; m = 1 is Krum). Ties are broken by row
    content so the choice does not depend on row order."""
    n = rows.shape[0]
    scores = krum_scores(rows, num_byzantine)
    ties = TieBreaker(rows)
    chosen = ties.argsort(scores)[:m]
    selected = torch.zeros(n, dtype=torch.bool)
    selected[chosen] = True
    return RuleResult(
        output=ordered_mean(rows, ties.in_content_order(chosen)),
        weights=selected.double() / m,
        selected=selected,
        clip_scale=_unclipped(n),
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
    return _in_content_order(rows, lambda r: _weiszfeld(r, iterations=iterations, eps=eps, nu=nu))


def _weiszfeld(rows: torch.Tensor, *, iterations: int, eps: float, nu: float) -> RuleResult:
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
        # Vardi-Zhang: only rows *at* z hold it in place. With none (eta = 0) this is a plain
        # Weiszfeld step, also where the pull is exactly 0 (z is then the optimum, a fixed point).
        stay = 0.0 if eta == 0 else (min(1.0, eta / pull) if pull > 0 else 1.0)
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
    return _in_content_order(rows, lambda r: _centered_clip(r, tau=tau, iterations=iterations, center=center))


def _centered_clip(
    rows: torch.Tensor, *, tau: float | None, iterations: int, center: torch.Tensor | None
) -> RuleResult:
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
