"""Pre-aggregation mixing (bucketing, nearest-neighbour mixing) and the shared
geometry that distance-based rules need (pairwise distances, order-independent
tie-breaking).

Every mixing step is a linear map of the input rows: ``mixed = M @ rows`` with
``M`` of shape (n_out, n_in). We return ``M`` itself so the public report can
say how much each *original* row weighs in the final output, and a ``home``
index per input row (the mixed row that stands for it) so per-row quantities
such as the clip scale can be mapped back.

Why order independence matters: every honest peer aggregates the same set of
updates and must reach bit-for-bit the same parameters, but nothing should
hinge on the order in which a caller happened to stack the rows. So whenever a
choice depends on *which* row wins (a tie in Krum scores, a tie at the
k-nearest-neighbour boundary, the bucketing shuffle) we decide it from the
rows' contents, never from their positions.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch


def content_rank(rows: torch.Tensor) -> torch.Tensor:
    """(n,) int64: each row's rank when rows are sorted by sha256 of their
    float32 bytes. Identical rows get distinct ranks, but as they are identical
    it does not matter which comes first."""
    digests = [hashlib.sha256(row.contiguous().numpy().tobytes()).digest() for row in rows]
    order = sorted(range(len(digests)), key=lambda i: digests[i])
    rank = torch.empty(len(digests), dtype=torch.int64)
    rank[torch.tensor(order, dtype=torch.int64)] = torch.arange(len(digests))
    return rank


class TieBreaker:
    """Sorts scores with ties broken by row content; hashes rows only if a tie
    actually occurs (hashing a large (n, d) tensor is the expensive part)."""

    def __init__(self, rows: torch.Tensor) -> None:
        self._rows = rows
        self._rank: torch.Tensor | None = None

    def argsort(self, scores: torch.Tensor, candidates: torch.Tensor | None = None) -> torch.Tensor:
        """Indices (into the rows) of ``candidates`` (default: all rows) in
        ascending score order; ``scores`` is aligned with ``candidates``."""
        if candidates is None:
            candidates = torch.arange(scores.numel())
        if torch.unique(scores).numel() == scores.numel():
            return candidates[torch.argsort(scores, stable=True)]
        if self._rank is None:
            self._rank = content_rank(self._rows)
        by_content = torch.argsort(self._rank[candidates], stable=True)
        by_score = torch.argsort(scores[by_content], stable=True)
        return candidates[by_content[by_score]]


def pairwise_sq_distances(rows: torch.Tensor) -> torch.Tensor:
    """(n, n) float64 squared L2 distances. Computed row by row in float64, as
    ``sum((x_j - x_i)**2)``: exact symmetry (so scores do not depend on row
    order) and no overflow for rows with entries near the float32 limit, where
    the Gram-matrix shortcut ``|x|^2 + |y|^2 - 2 x.y`` would overflow or cancel."""
    n = rows.shape[0]
    dist = torch.zeros(n, n, dtype=torch.float64)
    for i in range(n - 1):
        diff = rows[i + 1 :].double() - rows[i].double()  # (n - i - 1, d)
        sq = diff.square().sum(dim=1)
        dist[i, i + 1 :] = sq
        dist[i + 1 :, i] = sq
    return dist


@dataclass(frozen=True, slots=True)
class Mixing:
    """``rows_out = matrix @ rows_in``; ``home[i]`` is the output row that
    represents input row i."""

    matrix: torch.Tensor  # (n_out, n_in) float64
    home: torch.Tensor  # (n_in,) int64

    def then(self, later: Mixing) -> Mixing:
        """This mixing followed by ``later``."""
        return Mixing(matrix=later.matrix @ self.matrix, home=later.home[self.home])

    @staticmethod
    def identity(n: int) -> Mixing:
        return Mixing(matrix=torch.eye(n, dtype=torch.float64), home=torch.arange(n))


def nearest_neighbour_mixing(rows: torch.Tensor, num_byzantine: int) -> tuple[torch.Tensor, Mixing]:
    """NNM (Allouah et al., 2023, "Fixing by Mixing"): each row becomes the mean
    of its n - f nearest rows, itself included. Returns the mixed (n, d)
    float32 rows and the mixing matrix.

    Ties at the neighbourhood boundary are broken by row content; the row
    itself is always kept (distance 0 sorts first, and a duplicate of it that
    would tie is identical in content anyway)."""
    n = rows.shape[0]
    keep = n - num_byzantine
    dist = pairwise_sq_distances(rows)  # (n, n)
    ties = TieBreaker(rows)
    matrix = torch.zeros(n, n, dtype=torch.float64)
    everyone = torch.arange(n)
    for j in range(n):
        others = everyone[everyone != j]
        nearest = ties.argsort(dist[j, others], others)[: keep - 1]
        matrix[j, j] = 1.0 / keep
        matrix[j, nearest] = 1.0 / keep
    return _apply(matrix, rows), Mixing(matrix=matrix, home=everyone)


def bucketing(rows: torch.Tensor, bucket_size: int, seed: int) -> tuple[torch.Tensor, Mixing]:
    """Bucketing (Karimireddy, He & Jaggi, 2022): shuffle rows, average within
    buckets of ``bucket_size`` (the last bucket may be smaller). Returns the
    (ceil(n / s), d) bucket means and the mixing matrix.

    The shuffle must not depend on the caller's row order, so rows are first
    put in a canonical order (sha256 of their bytes) and only then permuted by
    a generator seeded with ``seed``. Give a fresh, agreed seed every round
    (e.g. derived from the round manifest hash) so nobody can precompute which
    bucket a crafted update lands in."""
    n = rows.shape[0]
    canonical = torch.argsort(content_rank(rows))  # canonical position -> input row
    generator = torch.Generator().manual_seed(seed)
    shuffled = canonical[torch.randperm(n, generator=generator)]
    num_buckets = -(-n // bucket_size)
    matrix = torch.zeros(num_buckets, n, dtype=torch.float64)
    home = torch.empty(n, dtype=torch.int64)
    for b in range(num_buckets):
        members = shuffled[b * bucket_size : (b + 1) * bucket_size]
        matrix[b, members] = 1.0 / members.numel()
        home[members] = b
    return _apply(matrix, rows), Mixing(matrix=matrix, home=home)


def _apply(matrix: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    # float64 accumulation: averaging rows near the float32 limit must not overflow.
    return (matrix @ rows.double()).float()
