"""The optimisation attacks of Shejwalkar & Houmansadr (NDSS 2021), "Manipulating the Byzantine:
optimizing model poisoning attacks and defenses for federated learning". Reached through
optim.attacks.build("min-max" | "min-sum" | "agr-tailored", ...).

Every attacker sends  m = μ + γ·p,  μ the honest updates' mean, p a perturbation:

    perturbation="unit-vector"   p = −μ/|μ|              (inverse unit vector)
    perturbation="std"           p = −std(honest)         (inverse coordinate-wise standard deviation)
    perturbation="sign"          p = −sign(μ)             (inverse sign)

and the scale γ is the largest the attack's constraint allows:

    min-max  (AGR-agnostic)  max_i |m − h_i|   <= max_{i,j} |h_i − h_j|
    min-sum  (AGR-agnostic)  Σ_i |m − h_i|²    <= max_j Σ_i |h_j − h_i|²
    agr-tailored             γ minimising the progress <AGR(m ×f, honest), μ>/|μ|² of the rule
                             option `rule` (default "median", the run's default rule)

so the malicious update is no farther from the honest ones than they are from each other: rules
that score rows by distance (Krum, clipping) or by rank (median, trimmed mean) cannot tell it from
an honest row. The paper finds γ by a halving search; both constraints are quadratic in γ
(|μ + γp − h_i|² = |μ − h_i|² + 2γ<p, μ − h_i> + γ²|p|²), so here γ is that search's limit,
solved exactly. agr-tailored searches γ on a grid (powers of √2 around the min-max γ) and refines
the best with a golden-section search: its objective is not monotone in γ.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

PERTURBATIONS = ("unit-vector", "std", "sign")
OPTIONS: dict[str, dict[str, Any]] = {
    "min-max": {"perturbation": "unit-vector"},
    "min-sum": {"perturbation": "unit-vector"},
    "agr-tailored": {"perturbation": "unit-vector", "rule": "median"},
}


def check_options(name: str, o: dict[str, Any]) -> None:
    if "perturbation" in o and o["perturbation"] not in PERTURBATIONS:
        raise ValueError(f"attack {name}: option perturbation must be one of {', '.join(PERTURBATIONS)}, got {o['perturbation']!r}")
    if "rule" in o:
        from optim import aggregate

        if o["rule"] not in aggregate.NAMES:
            raise ValueError(f"attack {name}: option rule must name an aggregator ({', '.join(aggregate.NAMES)}), got {o['rule']!r}")


def perturbation(kind: str, honest: torch.Tensor) -> torch.Tensor:
    """(d,) float64 direction p for (k, d) honest updates (zeros when it is undefined)."""
    mu = honest.double().mean(dim=0)
    if kind == "unit-vector":
        norm = torch.linalg.vector_norm(mu)
        return -mu / norm if norm > 0 else torch.zeros_like(mu)
    if kind == "std":
        return -honest.double().std(dim=0) if honest.shape[0] > 1 else torch.zeros_like(mu)
    return -torch.sign(mu)


def _geometry(honest: torch.Tensor, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(μ, |μ − h_i|², <p, μ − h_i>, pairwise |h_i − h_j|²), all float64, no (k, d) float64 copy."""
    from optim.aggregate_mixing import pairwise_sq_distances

    mu = honest.double().mean(dim=0)  # (d,)
    sq, dot = [], []
    for row in honest:
        dev = mu - row.double()
        sq.append(float(dev.square().sum()))
        dot.append(float(dev @ p))
    return mu, torch.tensor(sq, dtype=torch.float64), torch.tensor(dot, dtype=torch.float64), pairwise_sq_distances(honest)


def min_max_gamma(honest: torch.Tensor, p: torch.Tensor) -> float:
    """Largest γ with max_i |μ + γp − h_i| <= max_{i,j} |h_i − h_j| (per row, the larger root of a quadratic)."""
    a = float(p.square().sum())
    if a == 0.0:
        return 0.0
    _, sq, dot, pair = _geometry(honest, p)
    radius = float(pair.max())
    roots = [(-2 * b + math.sqrt(max(0.0, 4 * b * b - 4 * a * (c - radius)))) / (2 * a) for c, b in zip(sq.tolist(), dot.tolist())]
    return max(0.0, min(roots))


def min_sum_gamma(honest: torch.Tensor, p: torch.Tensor) -> float:
    """Largest γ with Σ_i |μ + γp − h_i|² <= max_j Σ_i |h_j − h_i|². The cross terms sum to 0
    (Σ_i (μ − h_i) = 0), so γ² = (max_j Σ_i |h_j − h_i|² − Σ_i |μ − h_i|²) / (k |p|²)."""
    a = float(p.square().sum())
    if a == 0.0:
        return 0.0
    _, sq, _, pair = _geometry(honest, p)
    budget = float(pair.sum(dim=1).max()) - float(sq.sum())
    return math.sqrt(max(0.0, budget) / (honest.shape[0] * a))


def _need_honest(name: str, honest: torch.Tensor) -> None:
    if honest.shape[0] == 0:
        raise ValueError(f"{name}: needs at least one honest update to work from, got none")


def _min_max(o: dict[str, Any], *, honest: torch.Tensor, **_: Any) -> torch.Tensor:
    _need_honest("min-max", honest)
    p = perturbation(o["perturbation"], honest)
    return honest.double().mean(dim=0) + min_max_gamma(honest, p) * p


def _min_sum(o: dict[str, Any], *, honest: torch.Tensor, **_: Any) -> torch.Tensor:
    _need_honest("min-sum", honest)
    p = perturbation(o["perturbation"], honest)
    return honest.double().mean(dim=0) + min_sum_gamma(honest, p) * p


def tailored_progress(rule: str, honest: torch.Tensor, malicious: torch.Tensor, num_byzantine: int) -> float:
    """<AGR(f copies of `malicious` + honest), μ>/|μ|²: 1 = the honest mean's progress."""
    from optim import aggregate

    mu = honest.double().mean(dim=0)
    rows = torch.cat([malicious.float().expand(num_byzantine, -1), honest.float()])
    f = num_byzantine
    while f > 0 and aggregate.minimum_rows(rule, f) > rows.shape[0]:
        f -= 1  # the swarm lowers f the same way (RoundMath.effective_byzantine)
    out = aggregate.build(rule, f)(rows, seed=0).double()
    return float(out @ mu) / float(mu @ mu)


_LAST: dict[str, Any] = {}  # agr-tailored's last answer: every attacker of a round asks the same question


def _agr_tailored(o: dict[str, Any], *, honest: torch.Tensor, num_byzantine: int, **_: Any) -> torch.Tensor:
    _need_honest("agr-tailored", honest)
    key = (o["rule"], o["perturbation"], num_byzantine, tuple(honest.shape), honest.numpy().tobytes())
    if _LAST.get("key") != key:
        _LAST.update(key=key, answer=_tailored(o, honest, num_byzantine))
    return _LAST["answer"].clone()


def _tailored(o: dict[str, Any], honest: torch.Tensor, num_byzantine: int) -> torch.Tensor:
    mu = honest.double().mean(dim=0)
    p = perturbation(o["perturbation"], honest)
    if not bool(mu.any()) or not bool(p.any()):
        return mu

    def progress(gamma: float) -> float:
        return tailored_progress(o["rule"], honest, mu + gamma * p, num_byzantine)

    base = min_max_gamma(honest, p) or float(torch.linalg.vector_norm(mu) / torch.linalg.vector_norm(p))
    grid = [0.0] + [base * 2 ** (k / 2) for k in range(-8, 9)]
    scores = [progress(g) for g in grid]
    best = min(range(len(grid)), key=lambda i: (scores[i], grid[i]))
    lo, hi = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
    inv = (math.sqrt(5) - 1) / 2
    x1, x2 = hi - inv * (hi - lo), lo + inv * (hi - lo)
    p1, p2 = progress(x1), progress(x2)
    for _ in range(8):  # golden section between the best grid point's neighbours
        if p1 <= p2:
            hi, x2, p2 = x2, x1, p1
            x1 = hi - inv * (hi - lo)
            p1 = progress(x1)
        else:
            lo, x1, p1 = x1, x2, p2
            x2 = lo + inv * (hi - lo)
            p2 = progress(x2)
    gamma = min([(scores[best], grid[best]), (p1, x1), (p2, x2)])[1]
    return mu + gamma * p


CRAFT: dict[str, Callable[..., torch.Tensor]] = {"min-max": _min_max, "min-sum": _min_sum, "agr-tailored": _agr_tailored}
