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
from optim.aggregate_rules import NETWORK_MAX_ROWS, RuleResult, _unclipped, in_input_order, krum_scores, network_sorted

# Where the middle of the mass falls "exactly" on a boundary between two values: relative to
# the total mass, far below any real weight difference, far above float64 rounding in a cumsum.
_BOUNDARY_TOLERANCE = 1e-9
# band_output's fast median: a column whose cumulative masses all lie this far (relative to the
# total) from the middle has no boundary case, with room to spare over the tolerance above and the
# rounding of a float64 cumsum (~1e-16).
_CLEAR_OF_MIDDLE = 1e-6
# band_output's whole-weight median: totals below this keep _BOUNDARY_TOLERANCE x total under 0.25,
# so with whole weights (cumulative masses exact integers) no tolerance can decide a boundary.
_MASS_BITS = 27
WHOLE_TOTAL_MAX = 1 << _MASS_BITS  # a row's mass fits the low bits of its sort key


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
    share = _band_shares(w[owner], float(w.sum()), trim)  # (n, d)
    output = (share * values.double()).sum(dim=0).float()  # (d,)
    per_row = torch.zeros(n, dtype=torch.float64)
    per_row.index_add_(0, owner.reshape(-1), share.reshape(-1))
    row_share = per_row / d
    return RuleResult(output=output, weights=row_share, selected=row_share > 0, clip_scale=_unclipped(n))


def _band_shares(mass: torch.Tensor, total: float, trim: float | None) -> torch.Tensor:
    """(n, d) share of each sorted value in its coordinate's result, from (n, d) the mass (row
    weight) each sorted value holds; every column sums to 1."""
    upper = torch.cumsum(mass, dim=0)  # (n, d): where each value's mass interval ends
    lower = upper - mass
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
        return share / share.sum(dim=0, keepdim=True)  # a convex combination in every coordinate
    keep_lo, keep_hi = trim, total - trim
    kept = (torch.minimum(upper, torch.tensor(keep_hi)) - torch.maximum(lower, torch.tensor(keep_lo))).clamp_min(0)
    return kept / (keep_hi - keep_lo)  # (n, d), sums to 1 per coordinate


def band_output(rows: torch.Tensor, weights: torch.Tensor, trim: float | None) -> torch.Tensor:
    """(d,) float32: ``_in_order(rows, weights, lambda r, w: _band(r, w, trim)).output`` bit for
    bit, without the per-row shares (a slice owner's reduce, which reports none: the median of a
    default overlapped run, whose rows carry work weights). Rows must be finite (the Aggregator
    checks them).

    ``_band`` costs ~6 ms for 8 rows x 14k columns: torch.sort sorts each column alone, and the
    mass arithmetic runs in float64 over every rank of every column. Here a sorting network of
    elementwise minimum / maximum over whole rows sorts every column at once, as the unweighted
    median does (optim/aggregate_rules.sorted_band_output). The median of whole weights (claims:
    the usual case) takes _whole_weight_median: integer masses, no tolerance to apply (1.5 ms
    where the arithmetic below took 4.6, 8 x 14k on this 2-core machine). Otherwise the network
    sorts int64 keys that carry each value's row along: the value's order-preserving integer image
    (-0.0 taken as +0.0, which torch.sort holds equal) times 256 plus the row's position in content
    order. Keys are unique, so the network and a stable sort give the one same permutation: the
    same value and mass at every rank. Then, for the median, a column whose every cumulative mass
    lies farther than _CLEAR_OF_MIDDLE from the middle has one value with the whole share (the one
    whose interval holds the middle: its bits are the result, -0.0 summed to +0.0) and no boundary
    case; ``_band_shares`` runs on the other columns only (the ones near a tie of mass).
    tests/test_aggregate_weighted_network.py holds every path to ``_band``'s bits."""
    n, d = rows.shape
    w = weights.to(torch.float64)
    if n > min(NETWORK_MAX_ROWS, 256):
        return _in_order(rows, w, lambda r, ww: _band(r, ww, trim)).output
    if trim is None:
        whole = _whole_weight_median(rows, w)
        if whole is not None:
            return whole
    order = weighted_order(rows, w)
    ordered, w = rows[order], w[order]  # content order, as _in_order takes them
    # keys that carry each value's row: unique, so the network and a stable sort give one permutation
    position = torch.stack(network_sorted(_order_image(ordered) * 256 + torch.arange(n).unsqueeze(1))) & 255  # (n, d): the row (in content order) of each sorted value
    mass, values = w[position], ordered.gather(0, position)  # (n, d) each
    total = float(w.sum())
    if trim is not None:
        return (_band_shares(mass, total, trim) * values.double()).sum(dim=0).float()
    upper = torch.cumsum(mass, dim=0)  # (n, d), as _band_shares sums it
    half, clear = total / 2, _CLEAR_OF_MIDDLE * total
    rank = (upper < half).sum(dim=0, keepdim=True)  # (1, d): the rank whose interval holds the middle
    output = values.gather(0, rank).squeeze(0) + 0.0  # (d,); + 0.0: a sum from +0.0 turns a lone -0.0 into +0.0
    # The cumulative masses nearest the middle (they rise with the rank): the holder's and the one before.
    at, before = upper.gather(0, rank).squeeze(0), upper.gather(0, (rank - 1).clamp_min(0)).squeeze(0)
    near = (at - half <= clear) | ((half - before <= clear) & (rank.squeeze(0) > 0))  # (d,)
    if bool(near.any()):
        columns = near.nonzero().squeeze(1)
        share = _band_shares(mass[:, columns], total, None)
        output[columns] = (share * values[:, columns].double()).sum(dim=0).float()
    return output


def _order_image(rows: torch.Tensor) -> torch.Tensor:
    """(n, d) int64: each float32 value's order-preserving integer image (-0.0 taken as +0.0,
    which torch.sort holds equal): its bits, negative floats' magnitude bits flipped."""
    bits = (rows + 0.0).view(torch.int32)  # x + 0.0 turns -0.0 into +0.0
    return (bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(torch.int64)


def _image_value(image: torch.Tensor) -> torch.Tensor:
    """float32 values from their _order_image (the map is its own inverse on int32)."""
    image = image.to(torch.int32)
    return (image ^ ((image >> 31) & 0x7FFFFFFF)).view(torch.float32)


def _whole_weight_median(rows: torch.Tensor, w: torch.Tensor) -> torch.Tensor | None:
    """band_output's median, bit for bit, where every weight is a whole number and the total is
    below WHOLE_TOTAL_MAX (claims in tokens or steps, as a window run weighs its rows); None
    elsewhere (then band_output's general arithmetic runs).

    Whole weights make every cumulative mass an exact integer in any order of summation, and the
    total's half a multiple of 0.5, so _band_shares' tolerances (1e-9 of the total, below 0.25
    here) decide nothing: in each column the middle either falls strictly inside one value's
    interval of mass (that value is the result), or exactly on the boundary after rank a (the mean
    of the values at ranks a and a + 1, as the shares 0.5 / 0.5 sum them in float64). Rows of
    weight 0 hold no interval and are left out first. The order between equal values moves no
    boundary that decides (a block of equal values ends at the same mass in any order, and inside
    it every candidate is the same value), so the keys the network sorts are the value's image
    and the row's mass side by side ((image << 27) | mass: equal keys are equal pairs), with no
    content order and no gather of the masses afterwards. ~3x less CPU than the general arithmetic
    for an owner's 8 x 14k slice, the reduce on an overlapped round's critical path (benchmarks/wan.md)."""
    positive = w > 0
    if not bool(positive.all()):
        rows, w = rows[positive], w[positive]
    total = float(w.sum())
    if total >= WHOLE_TOTAL_MAX or not bool((w == torch.round(w)).all()):
        return None
    n, whole = rows.shape[0], int(total)
    keys = torch.stack(network_sorted((_order_image(rows) << _MASS_BITS) | w.to(torch.int64).unsqueeze(1)))  # (n, d)
    reached = torch.cumsum(keys & (WHOLE_TOTAL_MAX - 1), dim=0).mul_(2)  # (n, d): twice the mass up to each rank, exact
    rank = (reached < whole).sum(dim=0, keepdim=True)  # (1, d): the first rank whose mass reaches the middle
    on_boundary = reached.gather(0, rank).squeeze(0) == whole  # (d,): the middle ends rank a's interval exactly
    low, high = _image_value(keys.gather(0, torch.cat([rank, (rank + 1).clamp_max(n - 1)])) >> _MASS_BITS)  # ranks a, a + 1
    # low and high come from images, never -0.0; the mean is rounded to float32 last, as the shares'
    # float64 sum is: a tiny negative mean (a subnormal beside a zero) becomes -0.0 there too
    mean = (0.5 * low.double() + 0.5 * high.double()).float()  # rank a + 1 exists wherever on_boundary
    return torch.where(on_boundary, mean, low)


def _band_trim(weights: torch.Tensor, num_byzantine: int, *, trimmed: bool) -> float | None:
    """The mass a band rule drops at each end (None: the median), once f rows are known to be a minority."""
    require_minority(weights, num_byzantine, "weighted trimmed-mean" if trimmed else "weighted median")
    return heaviest_mass(weights, num_byzantine) if trimmed else None


def weighted_median(rows: torch.Tensor, weights: torch.Tensor, num_byzantine: int = 0) -> RuleResult:
    trim = _band_trim(weights, num_byzantine, trimmed=False)
    return _in_order(rows, weights, lambda r, w: _band(r, w, trim))


def weighted_trimmed_mean(rows: torch.Tensor, weights: torch.Tensor, num_byzantine: int) -> RuleResult:
    trim = _band_trim(weights, num_byzantine, trimmed=True)
    return _in_order(rows, weights, lambda r, w: _band(r, w, trim))


def weighted_band_output(rows: torch.Tensor, weights: torch.Tensor, num_byzantine: int, *, trimmed: bool) -> torch.Tensor:
    """(d,) the output of weighted_trimmed_mean (trimmed) or weighted_median, bit for bit, alone (band_output)."""
    return band_output(rows, weights, _band_trim(weights, num_byzantine, trimmed=trimmed))


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
