"""Eager updates for overlapped rounds (Kale et al. 2025, "Eager Updates for Overlapped
Communication and Computation in DiLoCo").

With the exchange of round r in flight while round r+1 trains, a peer must start round r+1
before θ_{r+1} = step(θ_r, mean_i Δ_i^r) is known. The naive schedule starts from its own local
model θ_r − Δ_own^r, as if its own pseudo-gradient were the whole average under plain averaging,
then moves its progress onto θ_{r+1} when it arrives. Eager updates instead take the outer step at
once on an estimate of the average in which the peer's own fresh pseudo-gradient stands in for its
share and the others' shares are taken from the last average it knows:

    estimate = mean^{r-1} − Δ_own^{r-1} / n + Δ_own^r / n       (n: peers in the average)

and start round r+1 from step(θ_r, estimate) with a copy of the outer state (the real state is
untouched: θ_{r+1}, what every node hashes, is computed from the real average as before, and the
phase's progress is moved onto it). Before any average is known the own Δ stands in for all of it.

Estimates (rounds.eager_estimate), measured in benchmarks/fidelity.md section (4):
  own        (the default) the peer's fresh Δ stands in for the whole average: estimate = Δ_own^r.
             The outer step is linear in its input, so the peers' start points average to exactly
             θ_{r+1}: their errors cancel in the next average to first order, and what is left is
             the spread of the start points (the peers' disagreement) through a nonlinear loss.
  share      the paper's mixture above. Under this project's rebasing the others' last shares are
             already inside θ_r, so the start points lag θ_{r+1} on average; the inner phase then
             makes up the lag and the progress moved onto θ_{r+1} repeats it, and Nesterov's
             momentum compounds the repeat: it diverged.
  own-share  Δ_own^r / n: the others' shares left for θ_{r+1} to bring (the paper's bookkeeping
             without its stale shares). The same lag, the same divergence.
  fit        c·Δ_own^r, c the least-squares fit of the last average on the last own Δ: a smaller
             start error per peer, but a lag on average again; unstable.
  drift      Δ_own^r − (Δ_own^{r-1} − mean^{r-1}): averages to the true average exactly (like own)
             and removes a drift that persists from round to round; the peers' drifts here change
             every round, so it doubles the spread instead; worse than own.
How much the start point matters depends on when θ_{r+1} lands: the overlapped schedule moves
the progress onto it as soon as the exchange finishes (peer/node/overlap.py), so only the inner
steps run before that are taken from the estimated start.
"""

from __future__ import annotations

import copy

import torch

from optim.outer import OuterOptimizer


def estimate(own: torch.Tensor, *, last_average: torch.Tensor | None, own_previous: torch.Tensor | None, peers: int,
             mode: str = "share") -> torch.Tensor:
    """(d,) estimate of this round's average from this peer's own Δ (d,) and what it last saw."""
    if mode == "fit":
        return own.mul(shrinkage(last_average, own_previous))
    if mode == "own-share":  # the others' fresh shares left out: they arrive with θ_{r+1}
        return own.div(max(peers, 1))
    if mode == "drift":
        if last_average is None or own_previous is None:
            return own.clone()
        return own - (own_previous - last_average)  # own Δ less this peer's drift from the last average
    if mode == "own" or last_average is None or peers < 1:
        return own.clone()
    out = last_average.clone()
    if own_previous is not None:
        out.sub_(own_previous, alpha=1.0 / peers)
    else:  # we were not in the last average: the others' shares are all of it, over n - 1 of n
        out.mul_((peers - 1) / peers if peers > 1 else 0.0)
    return out.add_(own, alpha=1.0 / peers)


def shrinkage(last_average: torch.Tensor | None, own_previous: torch.Tensor | None) -> float:
    """c in [0, 1] that made c·Δ_own the least-squares fit of the average last round:
    <Δ_own^{r-1}, mean^{r-1}> / |Δ_own^{r-1}|², 1 when that round is not known. Other peers' Δs
    share only part of the own one's direction (different data), so the own Δ overstates the
    average; c measures by how much, and the next estimate is c·Δ_own^r."""
    if last_average is None or own_previous is None:
        return 1.0
    norm = float(own_previous.dot(own_previous))
    if not norm > 0:
        return 1.0
    return min(1.0, max(0.0, float(own_previous.dot(last_average)) / norm))


def start_point(outer: OuterOptimizer, params: torch.Tensor, average_estimate: torch.Tensor) -> torch.Tensor:
    """step(θ_r, estimate) on a copy of `outer`'s state: the (d,) point the next inner phase starts from."""
    trial = copy.deepcopy(outer)
    point = params.clone()
    trial.step(point, average_estimate)
    return point


def next_start(outer: OuterOptimizer, params: torch.Tensor, own: torch.Tensor, *, eager: bool, mode: str,
               last_average: torch.Tensor | None, own_previous: torch.Tensor | None, peers: int) -> torch.Tensor:
    """Where an overlapped peer's next inner phase starts, given θ_r (params) and its own Δ_r (d,):
    the eager start point with estimate `mode`, or (eager off) its own local parameters θ_r − Δ_r."""
    if not eager:
        return params - own
    guess = estimate(own, last_average=last_average, own_previous=own_previous, peers=peers, mode=mode)
    return start_point(outer, params, guess)
