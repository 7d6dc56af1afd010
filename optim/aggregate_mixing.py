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
rows' contents, never from their positions. And because such a choice can
hinge on the last bit of a mixed row or a distance, every sum over rows runs
in content order (:func:`ordered_mean`) and every distance is computed alone
(:func:`pairwise_sq_distances`): the same rows in any order give bit-identical
results, not merely close ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cmp_to_key

import torch

# Rows are compared a chunk at a time, the chunk growing 16-fold: distinct rows
# usually differ in the first chunk, and identical rows cost one pass over their
# values in a handful of (parallel) comparisons.
_FIRST_CHUNK = 1024
_CHUNK_GROWTH = 16


def _compare_bits(a: torch.Tensor, b: torch.Tensor) -> int:
    """-1, 0 or 1: lexicographic order of two (d,) int32 bit patterns, read
    only up to their first difference."""
    start, size, d = 0, _FIRST_CHUNK, a.numel()
    while start < d:
        stop = min(start + size, d)
        if not torch.equal(a[start:stop], b[start:stop]):  # integer views: bitwise equality
            differ = torch.ne(a[start:stop], b[start:stop]).to(torch.uint8)  # (chunk,)
            k = start + int(differ.argmax())  # first difference
            return -1 if int(a[k]) < int(b[k]) else 1
        start, size = stop, size * _CHUNK_GROWTH
    return 0


def canonical_order(rows: torch.Tensor) -> torch.Tensor:
    """(n,) int64 input indices of the (n, d) float32 rows sorted by content:
    lexicographic on their float32 bit patterns (a total order on contents,
    not a numeric one). Identical rows keep their input order among
    themselves; being identical, nothing computed from them can tell.

    Cheap (it reads rows only up to where they first differ), so even plain
    mean can afford it; a hash of every row would cost more than the mean."""
    bits = rows.view(torch.int32)  # (n, d): same bytes, exact integer comparisons
    n = rows.shape[0]
    first = bits[:, 0].tolist() if rows.shape[1] else []
    if len(set(first)) == n:  # the usual case: the first values already decide the whole order
        return torch.tensor(sorted(range(n), key=first.__getitem__), dtype=torch.int64)
    order = sorted(range(n), key=cmp_to_key(lambda i, j: _compare_bits(bits[i], bits[j])))
    return torch.tensor(order, dtype=torch.int64)


def content_rank(rows: torch.Tensor) -> torch.Tensor:
    """(n,) int64: each row's position in :func:`canonical_order`."""
    order = canonical_order(rows)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel())
    return rank


def ordered_mean(rows: torch.Tensor, ordered: torch.Tensor) -> torch.Tensor:
    """(d,) float32 mean of ``rows[ordered]``, summed in exactly that order in
    float64: the same members in the same (content) order give the same bits
    whatever their positions, and rows near the float32 limit do not overflow.
    A (d,) float64 accumulator, never an (n, d) copy."""
    total = rows[ordered[0]].double()  # (d,)
    for k in ordered[1:].tolist():
        total.add_(rows[k])
    return total.div_(ordered.numel()).float()


class TieBreaker:
    """Sorts scores with ties broken by row content; ranks rows by content
    only if a tie actually occurs."""

    def __init__(self, rows: torch.Tensor) -> None:
        self._rows = rows
        self._rank: torch.Tensor | None = None

    @property
    def rank(self) -> torch.Tensor:
        """(n,) int64 content rank of each row (see :func:`content_rank`)."""
        if self._rank is None:
            self._rank = content_rank(self._rows)
        return self._rank

    def in_content_order(self, members: torch.Tensor) -> torch.Tensor:
        """``members`` (row indices) sorted by content."""
        return members[torch.argsort(self.rank[members], stable=True)]

    def argsort(self, scores: torch.Tensor, candidates: torch.Tensor | None = None) -> torch.Tensor:
        """Indices (into the rows) of ``candidates`` (default: all rows) in
        ascending score order; ``scores`` is aligned with ``candidates``."""
        if candidates is None:
            candidates = torch.arange(scores.numel())
        if torch.unique(scores).numel() == scores.numel():
            return candidates[torch.argsort(scores, stable=True)]
        by_content = torch.argsort(self.rank[candidates], stable=True)
        by_score = torch.argsort(scores[by_content], stable=True)
        return candidates[by_content[by_score]]


def pairwise_sq_distances(rows: torch.Tensor) -> torch.Tensor:
    """(n, n) float64 squared L2 distances, ``sum((x_j - x_i)**2)`` in float64.

    Each pair is computed alone, with the same (d,) shapes and buffer: a
    batched reduction may split or vectorise differently depending on how
    many rows share the batch, so a pair's distance (and with it a Krum or
    NNM decision at a tie) could depend on the pair's position. One
    computation per pair also makes the matrix exactly symmetric. float64,
    not the Gram shortcut ``|x|^2 + |y|^2 - 2 x.y``, which would overflow or
    cancel for rows with entries near the float32 limit."""
    n, d = rows.shape
    dist = torch.zeros(n, n, dtype=torch.float64)
    diff = torch.empty(d, dtype=torch.float64)  # (d,), reused
    for i in range(n - 1):
        anchor = rows[i].double()  # (d,)
        for j in range(i + 1, n):
            torch.sub(rows[j], anchor, out=diff)
            dist[i, j] = dist[j, i] = diff.square_().sum()
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
    mixed = torch.empty_like(rows)  # (n, d)
    everyone = torch.arange(n)
    for j in range(n):
        others = everyone[everyone != j]
        nearest = ties.argsort(dist[j, others], others)[: keep - 1]
        members = torch.cat([torch.tensor([j]), nearest])
        matrix[j, members] = 1.0 / keep
        # Summed in content order: mixed rows are bit-identical whatever the input order,
        # so rules that break ties by the mixed rows' content decide alike.
        mixed[j] = ordered_mean(rows, ties.in_content_order(members))
    return mixed, Mixing(matrix=matrix, home=everyone)


def bucketing(rows: torch.Tensor, bucket_size: int, seed: int) -> tuple[torch.Tensor, Mixing]:
    """Bucketing (Karimireddy, He & Jaggi, 2022): shuffle rows, average within
    buckets of ``bucket_size`` (the last bucket may be smaller). Returns the
    (ceil(n / s), d) bucket means and the mixing matrix.

    The shuffle must not depend on the caller's row order, so rows are first
    put in a canonical order (:func:`canonical_order`) and only then permuted by
    a generator seeded with ``seed``. Give a fresh, agreed seed every round
    (e.g. derived from the round manifest hash) so nobody can precompute which
    bucket a crafted update lands in."""
    n = rows.shape[0]
    ties = TieBreaker(rows)
    canonical = torch.argsort(ties.rank)  # canonical position -> input row
    generator = torch.Generator().manual_seed(seed)
    shuffled = canonical[torch.randperm(n, generator=generator)]
    num_buckets = -(-n // bucket_size)
    matrix = torch.zeros(num_buckets, n, dtype=torch.float64)
    home = torch.empty(n, dtype=torch.int64)
    means = torch.empty(num_buckets, rows.shape[1], dtype=torch.float32)  # (num_buckets, d)
    for b in range(num_buckets):
        members = shuffled[b * bucket_size : (b + 1) * bucket_size]
        matrix[b, members] = 1.0 / members.numel()
        home[members] = b
        means[b] = ordered_mean(rows, ties.in_content_order(members))
    return means, Mixing(matrix=matrix, home=home)

