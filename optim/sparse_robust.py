"""`sparse-trimmed-mean`: a Byzantine-robust rule for sparse rows (top-k payloads), vote-gated.

Coordinate-wise rules over rows whose supports differ zero out the signal (the sparse-support
trap, optim/aggregate.py): a coordinate only a few peers sent is mostly zeros, so its median or
trimmed mean is 0. sparse-mean (optim/sparse_mean.py) avoids the trap by averaging over the peers
that sent each coordinate, but then one peer alone sets every coordinate only it sent. This rule
keeps sparse-mean's "over the senders" and adds three defences (the threat-model row "poisoned
compressed update"). Rows are (n, d) float32, an exact 0 meaning "this peer did not send that
coordinate"; f = num_byzantine.

  a) clipping: each row is scaled down (never up) to an L2 norm <= clip_ratio x the lower median
     of the rows' norms, so an attacker cannot win by magnitude. Votes are read before clipping
     (a value that clipping rounds to 0 still counts as sent).
  b) votes: count_j = #{i : x_ij != 0}. Coordinate j is aggregated only when count_j >= min_votes
     (default min(f + 1, 2)): a lone attacker never creates a coordinate (index poisoning); below
     it the output is 0 (and each sender's error feedback keeps what it sent there). Not f + 1 for
     f >= 2: requiring 3 senders of every coordinate cost +8.6% final loss with no attacker (8
     peers, top-64 of 4096; docs/compressed-exchange.md); colluding attackers that create a
     coordinate together hold it only within the clipped range of (c).
  c) value over the senders of j (the "selectors"): count_j >= 2f + 1: their mean after dropping
     the f largest and f smallest; min_votes <= count_j <= 2f: their lower median (f attackers
     among up to 2f senders can still pick it, but only within the clipped range).

With f = 0 and no row clipped this is sparse-mean (the mean over the senders), up to rounding
order: the senders' values are summed in float64 in sorted-value order.

Determinism: rows are sorted into content order first (canonical_order), each row's norm is a
sequential float64 sum (cumsum: no thread-dependent reduction tree), the per-coordinate sort and
the band sums run in a fixed order, so the same rows in any order, on any thread count, give the
same bits. Columns are processed in blocks of COLUMN_BLOCK to bound memory at d ~ 1e6.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from optim import aggregate
from optim.aggregate_rules import RuleResult, _in_content_order

NAME = "sparse-trimmed-mean"
DEFAULT_CLIP_RATIO = 2.0
COLUMN_BLOCK = 1 << 16  # columns sorted at a time: (n, 65536) float32 + int64 owners
DEFAULT_MIN_VOTES = 2  # senders a coordinate needs when f >= 1 (see b)
_OPTIONS: dict[str, Any] = {"clip_ratio": DEFAULT_CLIP_RATIO, "min_votes": None, "bucket_size": None, "seed": 0, "nnm": False}


def row_norms(rows: torch.Tensor) -> torch.Tensor:
    """(n,) float64 L2 norms, each a sequential float64 sum of squares (the same bits whatever the
    thread count; float64: Byzantine entries near the float32 limit would overflow a float32 square)."""
    out = torch.empty(rows.shape[0], dtype=torch.float64)
    for i, row in enumerate(rows):
        out[i] = torch.cumsum(row.double().square_(), dim=0)[-1].sqrt() if row.numel() else 0.0
    return out


def clip_scales(norms: torch.Tensor, clip_ratio: float | None) -> torch.Tensor:
    """(n,) float64 factors in (0, 1]: min(1, clip_ratio * lower_median(norms) / norm); 1 for a zero
    row and when clip_ratio is None. A median of 0 (most rows empty) scales every non-empty row to 0."""
    if clip_ratio is None:
        return torch.ones_like(norms)
    limit = clip_ratio * float(torch.sort(norms).values[(norms.numel() - 1) // 2])
    return torch.where(norms > limit, limit / norms.clamp(min=torch.finfo(torch.float64).tiny), torch.ones_like(norms))


def sparse_trimmed_mean(
    rows: torch.Tensor, num_byzantine: int, *, clip_ratio: float | None = DEFAULT_CLIP_RATIO, min_votes: int | None = None
) -> RuleResult:
    """(n, d) float32 -> RuleResult: output (d,) float32 as in the module docstring. weights: each
    row's share averaged over the aggregated coordinates (sum 1 when any is); selected: the row is
    kept in at least one coordinate and was not clipped; clip_scale: each row's clip factor."""
    return _in_content_order(rows, lambda r: _vote_gated(r, num_byzantine, clip_ratio, min_votes))


def _vote_gated(rows: torch.Tensor, f: int, clip_ratio: float | None, min_votes: int | None) -> RuleResult:
    n, d = rows.shape
    votes_needed = min(f + 1, DEFAULT_MIN_VOTES) if min_votes is None else min_votes
    scale = clip_scales(row_norms(rows), clip_ratio)  # (n,) float64
    factor = scale.float()[:, None] if bool((scale < 1).any()) else None  # (n, 1)
    output = torch.zeros(d, dtype=torch.float32)
    shares = torch.zeros(n, dtype=torch.float64)  # each row's share, summed over aggregated coordinates
    aggregated = 0
    rank = torch.arange(n)[:, None]  # (n, 1)
    for start in range(0, d, COLUMN_BLOCK):
        block = rows[:, start : start + COLUMN_BLOCK]  # (n, c)
        count = (block != 0).view(torch.uint8).sum(dim=0, dtype=torch.int32)  # (c,) senders per coordinate
        columns = (count >= votes_needed).nonzero().view(-1)  # (v,) only these are aggregated
        if not columns.numel():
            continue
        count = count[columns]
        values = block[:, columns]  # (n, v)
        sent = values != 0  # votes are read before clipping
        if factor is not None:
            values = values * factor
        # Non-senders sort last: ranks 0..count-1 are the senders' values, ascending. Stable, on
        # content-ordered rows: equal values' ranks (and their shares) go to the same rows.
        ordered, owner = torch.sort(torch.where(sent, values, torch.inf), dim=0, stable=True)
        trimmed = count >= 2 * f + 1
        lo = torch.where(trimmed, f, (count - 1) // 2)  # (v,) the band of ranks [lo, hi) kept
        hi = torch.where(trimmed, count - f, (count - 1) // 2 + 1)
        keep = (rank >= lo) & (rank < hi)  # (n, v)
        kept = torch.where(keep, ordered, 0.0)
        total = kept[0].double()
        for k in range(1, n):  # rank by rank: a fixed summation order, float64
            total.add_(kept[k])
        width = (hi - lo).double()  # (v,) >= 1
        mean = (total / width).float()
        output[start + columns] = torch.where(mean != 0, mean, 0.0)  # +0.0, never -0.0
        shares.index_add_(0, owner.view(-1), torch.where(keep, 1.0 / width, 0.0).view(-1))  # serial: exact order
        aggregated += columns.numel()
    weights = shares / aggregated if aggregated else shares
    return RuleResult(output=output, weights=weights, selected=(shares > 0) & (scale >= 1), clip_scale=scale)


class SparseTrimmedMean(aggregate.Aggregator):
    """optim.aggregate.Aggregator running sparse_trimmed_mean; needs 2f+1 rows like trimmed-mean.
    Options: clip_ratio (2.0; None: no clipping), min_votes (None: min(f + 1, 2)), and bucket_size, seed,
    nnm as for any rule."""

    def __init__(self, num_byzantine: int = 0, **options: Any) -> None:
        if isinstance(num_byzantine, bool) or not isinstance(num_byzantine, int) or num_byzantine < 0:
            raise ValueError(f"num_byzantine must be an integer >= 0, got {num_byzantine!r}")
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise ValueError(f"unknown option(s) {', '.join(unknown)} for {NAME!r}; accepted: {', '.join(_OPTIONS)}")
        ratio = options.get("clip_ratio", DEFAULT_CLIP_RATIO)
        if ratio is not None and (isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not (math.isfinite(ratio) and ratio > 0)):
            raise ValueError(f"{NAME}: option clip_ratio must be a finite number > 0 (or None: no clipping), got {ratio!r}")
        votes = options.get("min_votes")
        if votes is not None and (isinstance(votes, bool) or not isinstance(votes, int) or votes < 1):
            raise ValueError(f"{NAME}: option min_votes must be an integer >= 1 (or None: min(f + 1, 2)), got {votes!r}")
        for key in ("bucket_size", "seed", "nnm"):
            if key in options:
                aggregate._check_option(NAME, key, options[key])
        super().__init__(NAME, num_byzantine, {**_OPTIONS, **options})

    def _rule(self, rows: torch.Tensor, f: int, center: torch.Tensor | None, seed: int) -> RuleResult:
        return sparse_trimmed_mean(rows, f, clip_ratio=self.options["clip_ratio"], min_votes=self.options["min_votes"])
