"""Robust aggregators, property tests (hypothesis): the output and report do not depend on the
rows' order, robust rules stay bounded under huge Byzantine rows, and every report's weights
reproduce the output. Golden values and validation: test_aggregate.py."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from optim import aggregate
from optim.aggregate_mixing import nearest_neighbour_mixing

ROBUST = ("median", "trimmed-mean", "krum", "multi-krum", "geometric-median", "centered-clip")

CONFIGS = [
    ("mean", {}),
    *[(name, {}) for name in ROBUST],
    ("trimmed-mean", {"nnm": True}),
    ("median", {"bucket_size": 2}),
    ("krum", {"nnm": True}),
    ("centered-clip", {"tau": 0.5}),
    ("dnc", {}),
    ("dnc", {"subsample": 2}),  # random coordinate subsets (d up to 4): drawn from the seed, not the row order
]


@st.composite
def rows_and_permutation(draw):
    n = draw(st.integers(5, 9))
    d = draw(st.integers(1, 4))
    # Small integers: many exact ties and duplicate rows, the hard case for order independence;
    # mixed with arbitrary floats, whose sums round differently in different orders.
    value = st.one_of(st.integers(-3, 3).map(float), st.floats(-1e3, 1e3, width=32))
    rows = torch.tensor(draw(st.lists(value, min_size=n * d, max_size=n * d)), dtype=torch.float32).reshape(n, d)
    for source, target in draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=3)):
        rows[target] = rows[source]  # duplicate rows
    perm = draw(st.permutations(list(range(n))))
    return rows, torch.tensor(perm)


def _report_by_content(rows, report, seen=None):
    """Report fields per distinct content (float32 bits: 0.0 and -0.0 are distinct rows):
    which copies of a duplicated row share its weight may follow input order (nearest-neighbour
    mixing breaks ties between identical rows by position, so 0.25 may go to one copy or be
    split over two), but each distinct content must get the same total weight and be selected
    or not as a whole. `seen`: the rows as the rule saw them (after nearest-neighbour mixing),
    the content to group by: two distinct rows that mix to the same bits are one to the rule, and
    which of them krum names may follow their order (hypothesis found [16, 0, 0] and
    [16, 0, 1e-6] among eight rows: test_two_rows_that_mix_to_the_same_bits_are_one_to_krum)."""
    grouped = {}
    for row, weight, selected, scale in zip(
        (rows if seen is None else seen).view(torch.int32).tolist(), report.weights, report.selected, report.clip_scale,
        strict=True
    ):
        total = grouped.setdefault(tuple(row), [0.0, False, []])
        total[0] += weight
        total[1] = total[1] or selected
        total[2].append(scale)
    return {key: (pytest.approx(w, abs=1e-12), s, sorted(c)) for key, (w, s, c) in grouped.items()}


def test_report_by_content_of_duplicates_under_nnm_does_not_follow_their_order():
    """The example hypothesis found: four 0.0 rows and one -0.0 row under trimmed mean + nnm.
    The output is bit-identical in every order and the report agrees per content."""
    rows = torch.tensor([[0.0], [0.0], [0.0], [0.0], [-0.0]])
    agg = aggregate.build("trimmed-mean", 1, nnm=True)
    out = agg(rows)
    expected = _report_by_content(rows, agg.last_report)
    for perm in ([0, 1, 2, 4, 3], [4, 0, 1, 2, 3], [1, 4, 3, 0, 2]):
        other = aggregate.build("trimmed-mean", 1, nnm=True)
        assert torch.equal(other(rows[perm]), out)
        assert _report_by_content(rows[perm], other.last_report) == expected


@pytest.mark.parametrize(("name", "options"), CONFIGS)
@settings(max_examples=25, deadline=None)
@given(case=rows_and_permutation())
def test_permutation_invariance(name, options, case):
    rows, perm = case
    f = 1
    if rows.shape[0] < aggregate.minimum_rows(name, f) + (2 if options.get("bucket_size") else 0):
        f = 0
    agg = aggregate.build(name, f, **options)
    out = agg(rows)
    report = agg.last_report
    agg_permuted = aggregate.build(name, f, **options)
    out_permuted = agg_permuted(rows[perm])
    # Bit for bit: every honest peer must reach the same parameters.
    assert torch.equal(out_permuted, out)
    mixed = nearest_neighbour_mixing(rows, f)[0] if options.get("nnm") else None  # (n, d): what the rule saw
    assert _report_by_content(rows[perm], agg_permuted.last_report, None if mixed is None else mixed[perm]) == \
        _report_by_content(rows, report, mixed)


def test_two_rows_that_mix_to_the_same_bits_are_one_to_krum():
    """The example hypothesis found (krum + nnm, f = 1): the output is bit-identical in either
    order; which of the two near-equal rows krum names follows the order, so the report is
    compared per content as the rule saw it."""
    rows = torch.zeros(8, 3)
    rows[1, 0] = rows[7, 0] = rows[2, 2] = 16.0
    rows[7, 2] = 1e-6
    perm = torch.tensor([1, 2, 0, 3, 4, 5, 6, 7])
    agg, other = aggregate.build("krum", 1, nnm=True), aggregate.build("krum", 1, nnm=True)
    out = agg(rows)
    assert torch.equal(other(rows[perm]), out)
    mixed = nearest_neighbour_mixing(rows, 1)[0]
    assert _report_by_content(rows[perm], other.last_report, mixed[perm]) == _report_by_content(rows, agg.last_report, mixed)


def _bound(name, n, f, max_honest_norm):
    """Worst-case output norm with f arbitrary rows, from each rule's guarantee."""
    if name in ("krum", "multi-krum"):  # averages honest rows only
        return max_honest_norm
    if name in ("median", "trimmed-mean"):  # each coordinate inside the honest range
        return math.sqrt(n) * max_honest_norm
    if name == "geometric-median":  # |z - mean_h| <= 2(n-f)/(n-2f) * max |h - mean_h|
        return (1 + 4 * (n - f) / (n - 2 * f)) * max_honest_norm
    # centered-clip, 3 iterations from the median, radius <= largest honest distance.
    return (8 * math.sqrt(n) + 7) * max_honest_norm


@st.composite
def honest_and_byzantine(draw):
    f = draw(st.integers(1, 3))
    n = draw(st.integers(2 * f + 3, 2 * f + 6))
    d = draw(st.integers(1, 5))
    honest = draw(st.lists(st.floats(-1, 1, width=32), min_size=(n - f) * d, max_size=(n - f) * d))
    huge = draw(st.lists(st.sampled_from([1e30, -1e30]), min_size=f * d, max_size=f * d))
    where = draw(st.permutations(list(range(n))))
    rows = torch.cat([torch.tensor(honest).reshape(n - f, d), torch.tensor(huge).reshape(f, d)])
    return rows[torch.tensor(where)].float(), f, torch.tensor(honest).reshape(n - f, d)


@pytest.mark.parametrize("name", ROBUST)
@settings(max_examples=30, deadline=None)
@given(case=honest_and_byzantine())
def test_bounded_output_under_huge_byzantine_rows(name, case):
    rows, f, honest = case
    max_norm = torch.linalg.vector_norm(honest, dim=1).max().item()
    out = aggregate.build(name, f)(rows)
    bound = _bound(name, rows.shape[0], f, max_norm)
    assert torch.linalg.vector_norm(out).item() <= bound * (1 + 1e-5) + 1e-6


@settings(max_examples=20, deadline=None)
@given(case=honest_and_byzantine())
def test_bounded_output_with_nnm_and_bucketing(case):
    rows, f, honest = case
    n = rows.shape[0]
    # Per coordinate the result stays inside the honest range: honest rows'
    # neighbourhoods (n - f nearest) hold only honest rows, and at most f mixed
    # rows or buckets are spoiled, which the trimmed mean / median discard.
    coordinate_bound = torch.linalg.vector_norm(honest.abs().max(dim=0).values).item()
    out = aggregate.build("trimmed-mean", f, nnm=True)(rows)
    assert torch.linalg.vector_norm(out).item() <= coordinate_bound * (1 + 1e-5) + 1e-6
    if -(-n // 2) >= 2 * f + 1:
        out = aggregate.build("median", f, bucket_size=2, seed=5)(rows)
        assert torch.linalg.vector_norm(out).item() <= coordinate_bound * (1 + 1e-5) + 1e-6


@pytest.mark.parametrize(("name", "options"), CONFIGS)
@settings(max_examples=15, deadline=None)
@given(case=rows_and_permutation())
def test_report_is_consistent(name, options, case):
    rows, _ = case
    n = rows.shape[0]
    agg = aggregate.build(name, 1 if n >= aggregate.minimum_rows(name, 1) + 2 else 0, **options)
    out = agg(rows)
    report = agg.last_report
    assert len(report.weights) == len(report.selected) == len(report.clip_scale) == n
    # Fresh aggregator: every rule is a (coordinate-averaged) convex combination of the rows.
    assert sum(report.weights) == pytest.approx(1.0)
    assert all(0.0 <= w <= 1.0 + 1e-12 for w in report.weights)
    assert all(0.0 <= c <= 1.0 for c in report.clip_scale)
    expected = torch.linalg.vector_norm(rows.double() - out.double(), dim=1)
    assert report.distance_to_aggregate == pytest.approx(expected.tolist())
    if name in ("mean", "krum", "multi-krum", "geometric-median") and not options:
        # Whole-vector rules: the weights reproduce the output exactly.
        weights = torch.tensor(report.weights, dtype=torch.float64)
        torch.testing.assert_close((weights @ rows.double()).float(), out, atol=1e-5, rtol=1e-5)
