"""The weighted median / trimmed mean of a slice owner's reduce (optim/aggregate_weighted.py
band_output: a sorting network on keys that carry each value's row, and the median read off the
rank that holds the middle of the mass): the same bits as the sort-based rule it stands for, with
ties, zeros of both signs, weights of 0, and integer claims whose halves split exactly (the
boundary case), since every owner of a slice must sign the same bytes."""

from __future__ import annotations

import random

import pytest
import torch

from optim import aggregate
from optim import aggregate_weighted as weighted
from tests.test_aggregate_network import _bits, _rows


def _by_sort(rows: torch.Tensor, w: torch.Tensor, trim: float | None) -> torch.Tensor:
    return weighted._in_order(rows, w, lambda r, ww: weighted._band(r, ww, trim)).output


def _weights(kind: str, n: int, rng: random.Random) -> torch.Tensor:
    if kind == "claims":  # whole steps: subsets that hold exactly half the mass are common
        return torch.tensor([float(rng.randint(10, 45)) for _ in range(n)], dtype=torch.float64)
    if kind == "shares":  # capped shares, as the owners weigh rows
        raw = [rng.uniform(0.5, 2.0) for _ in range(n)]
        return torch.tensor([x / sum(raw) for x in raw], dtype=torch.float64)
    zeros = [0.0 if rng.random() < 0.3 else float(rng.randint(1, 5)) for _ in range(n)]  # rows of no work
    zeros[0] = max(zeros[0], 1.0)
    return torch.tensor(zeros, dtype=torch.float64)


@pytest.mark.parametrize("n", [*range(1, 12), 16, 33])
@pytest.mark.parametrize("kind", ["randn", "ties", "zeros"])
@pytest.mark.parametrize("weights", ["claims", "shares", "zeros"])
def test_band_output_is_the_sorts_bits(n, kind, weights):
    rng = random.Random(n * 31 + len(kind) * 7 + len(weights))
    gen = torch.Generator().manual_seed(n * 13 + len(kind))
    for _ in range(4):
        rows = _rows(kind, n, 513, gen)
        w = _weights(weights, n, rng)
        trims = [None] + [weighted.heaviest_mass(w, f) for f in range(n) if 2 * weighted.heaviest_mass(w, f) < float(w.sum())]
        for trim in trims:
            assert _bits(weighted.band_output(rows, w, trim)) == _bits(_by_sort(rows, w, trim)), (trim, w.tolist())


def test_the_boundary_columns_take_the_exact_arithmetic():
    # 2 + 2 of 4 rows: the middle falls on a boundary in every column whose two lowest values
    # belong to the rows weighing 1 and 3 (or 2 and 2): the mean of the two middle values there
    rows = torch.tensor([[1.0, 4.0, 5.0], [2.0, 3.0, 6.0], [3.0, 2.0, 7.0], [4.0, 1.0, 8.0]])
    w = torch.tensor([1.0, 2.0, 2.0, 1.0], dtype=torch.float64)  # total 6: half 3 = 1 + 2
    out = weighted.band_output(rows, w, None)
    assert out.tolist() == [2.5, 2.5, 6.5]
    assert _bits(out) == _bits(_by_sort(rows, w, None))


@pytest.mark.parametrize("name", ["median", "trimmed-mean"])
def test_an_owners_reduce_takes_it_and_reports_like_before(name):
    gen = torch.Generator().manual_seed(5)
    rows = torch.randn(8, 1000, generator=gen)
    w = torch.tensor([30.0, 34, 33, 44, 42, 37, 29, 37], dtype=torch.float64)
    rule = aggregate.build(name, num_byzantine=1)
    reported = rule.aggregate_part(rows, weights=w)  # the per-row shares: the sort-based rule
    alone = rule.aggregate_part(rows, weights=w, report=False)  # a slice owner's reduce
    assert _bits(alone) == _bits(reported)
    # and it is the weighted rule: other weights move it
    assert not torch.equal(rule.aggregate_part(rows, weights=torch.flip(w, [0]), report=False), alone)


def test_whole_weights_take_the_integer_median_and_others_do_not():
    rows = torch.randn(6, 50, generator=torch.Generator().manual_seed(3))
    assert weighted._whole_weight_median(rows, torch.tensor([25.0, 26, 24, 25, 0, 31], dtype=torch.float64)) is not None
    assert weighted._whole_weight_median(rows, torch.tensor([25.0, 26, 24.5, 25, 1, 31], dtype=torch.float64)) is None
    big = float(weighted.WHOLE_TOTAL_MAX) / 4  # six of them: past the total whose tolerance stays below 0.25
    assert weighted._whole_weight_median(rows, torch.full((6,), big, dtype=torch.float64)) is None


@pytest.mark.parametrize("n", [2, 7, 8, 16, 64])
def test_whole_weights_near_the_largest_total_split_exactly_like_the_sort(n):
    # large whole claims that are multiples of a power of two: many columns' middles fall exactly on
    # a boundary, and the total sits just below WHOLE_TOTAL_MAX where the masses fill the key's low bits
    rng = random.Random(n)
    gen = torch.Generator().manual_seed(n)
    unit = (weighted.WHOLE_TOTAL_MAX - 1) // (4 * n)
    for kind in ("randn", "ties", "zeros"):
        rows = _rows(kind, n, 700, gen)
        w = torch.tensor([float(unit * rng.choice([1, 2, 3, 4])) for _ in range(n)], dtype=torch.float64)
        assert float(w.sum()) < weighted.WHOLE_TOTAL_MAX
        got = weighted.band_output(rows, w, None)
        assert _bits(got) == _bits(_by_sort(rows, w, None)), w.tolist()
        perm = torch.randperm(n, generator=gen)  # any order of the (row, weight) pairs: the same bits
        assert _bits(weighted.band_output(rows[perm], w[perm], None)) == _bits(got)


def test_a_boundary_mean_that_rounds_to_a_negative_zero_keeps_its_sign():
    # -2**-149 (the smallest subnormal) and 0 split the mass evenly: their float64 mean -2**-150
    # rounds to -0.0 in float32, in the shares' sum and here alike (a review found +0.0 here once)
    rows = torch.tensor([[-1e-45, 1e-45, -1e-45], [0.0, -0.0, -1e-45]])
    w = torch.tensor([1.0, 1.0], dtype=torch.float64)
    assert _bits(weighted.band_output(rows, w, None)) == _bits(_by_sort(rows, w, None))
    assert _bits(weighted.band_output(rows, w, None))[0] == _bits(torch.tensor([-0.0]))[0]


@pytest.mark.parametrize("n", [2, 3, 4, 8, 9])
def test_subnormals_and_zeros_of_both_signs_take_the_sorts_bits(n):
    gen = torch.Generator().manual_seed(100 + n)
    rng = random.Random(n)
    tiny = torch.tensor([0.0, -0.0, 1e-45, -1e-45, 3e-45, -3e-45, 1e-38, -1e-38])
    for _ in range(6):
        rows = tiny[torch.randint(0, len(tiny), (n, 400), generator=gen)]
        w = torch.tensor([float(rng.randint(1, 4)) for _ in range(n)], dtype=torch.float64)
        assert _bits(weighted.band_output(rows, w, None)) == _bits(_by_sort(rows, w, None)), w.tolist()
