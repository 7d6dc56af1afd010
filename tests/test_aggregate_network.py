"""The sorting network behind a slice owner's median / trimmed mean (optim/aggregate_rules.py
sorted_band_output): the same bits as the sort it replaces, ties, zeros of both signs and
row order included, since every owner of a slice must sign the same bytes."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from optim import aggregate
from optim import aggregate_rules as rules


def _bits(t: torch.Tensor) -> list[int]:
    return t.contiguous().view(torch.int32).tolist()


def _by_sort(rows: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    return rules._in_content_order(rows, lambda r: rules._sorted_band_mean(r, lo, hi)).output


@pytest.mark.parametrize("n", range(1, 11))
def test_comparators_sort_every_zero_one_input(n):
    # The 0-1 principle: a comparator network that sorts every 0/1 input sorts every input.
    columns = torch.tensor(list(itertools.product([0.0, 1.0], repeat=n))).t().contiguous()  # (n, 2^n)
    values = list(columns.unbind(0))
    for i, j in rules._comparators(n):
        assert i < j < n
        values[i], values[j] = torch.minimum(values[i], values[j]), torch.maximum(values[i], values[j])
    assert torch.equal(torch.stack(values), columns.sort(dim=0).values)


def test_comparator_counts_are_batchers():
    assert [len(rules._comparators(n)) for n in (1, 2, 4, 8, 16, 32)] == [0, 1, 5, 19, 63, 191]


def _rows(kind: str, n: int, d: int, gen: torch.Generator) -> torch.Tensor:
    if kind == "randn":
        return torch.randn(n, d, generator=gen)
    if kind == "ties":  # few distinct values: ranks full of equal values
        return torch.randint(-2, 3, (n, d), generator=gen).float()
    # zeros of both signs beside a few equal non-zero values
    signs = torch.where(torch.rand(n, d, generator=gen) < 0.5, -1.0, 1.0)
    rows = signs * 0.0  # -0.0 or +0.0
    rows[torch.rand(n, d, generator=gen) < 0.2] = 1.5
    rows[torch.rand(n, d, generator=gen) < 0.1] = -2.0
    return rows


@pytest.mark.parametrize("n", [*range(1, 20), 31, 32, 33, 64, 65])
@pytest.mark.parametrize("kind", ["randn", "ties", "zeros"])
def test_network_band_is_the_sorts_bits(n, kind):
    gen = torch.Generator().manual_seed(n * 7 + len(kind))
    rows = _rows(kind, n, 257, gen)
    bands = {rules.band("median", n, 0), *(rules.band("trimmed-mean", n, f) for f in range((n + 1) // 2))}
    for lo, hi in bands:
        want = _by_sort(rows, lo, hi)
        got = rules.sorted_band_output(rows, lo, hi)
        assert _bits(got) == _bits(want), (n, lo, hi)
        # whatever order the rows come in
        perm = torch.tensor(random.Random(n).sample(range(n), n))
        assert _bits(rules.sorted_band_output(rows[perm], lo, hi)) == _bits(want)


@pytest.mark.parametrize("name,f", [("median", 0), ("median", 2), ("trimmed-mean", 1), ("trimmed-mean", 3)])
def test_owner_reduce_matches_the_reported_rule(name, f):
    """aggregate_part without a report (a slice owner's reduce) takes the network; with one, the
    sort that also yields each row's share. Same output bits."""
    gen = torch.Generator().manual_seed(3)
    rows = torch.cat([torch.randn(6, 1000, generator=gen), torch.zeros(2, 1000), -torch.zeros(1, 1000)])
    rows[:, :100] = torch.randint(-1, 2, (9, 100), generator=gen).float()
    rule = aggregate.build(name, num_byzantine=f)
    fast = rule.aggregate_part(rows, num_byzantine=f, report=False)
    reported = rule.aggregate_part(rows, num_byzantine=f, report=True)
    assert _bits(fast) == _bits(reported)
    assert rule.last_report is not None and len(rule.last_report.weights) == 9
