"""Robust aggregators: hand-computed golden values, reports, row order, validation. Property
tests (order independence, bounded output under huge Byzantine rows): test_aggregate_properties.py."""

import math

import pytest
import torch

from optim import aggregate
from optim.aggregate_mixing import bucketing, canonical_order, nearest_neighbour_mixing
from optim.aggregate_rules import krum_scores


def t(rows):
    return torch.tensor(rows, dtype=torch.float32)


# ---------------------------------------------------------------- golden values


def test_trimmed_mean_golden():
    agg = aggregate.build("trimmed-mean", num_byzantine=1)
    out = agg(t([[1, 2, 3], [4, 5, 6], [7, 8, 9]]))
    assert out.tolist() == [4.0, 5.0, 6.0]
    assert agg.last_report.weights == [0.0, 1.0, 0.0]
    # Per coordinate: col0 sorted 1,2,3,100 keeps 2,3 -> 2.5; col1 sorted -100,0,5,10 keeps 0,5 -> 2.5.
    out = agg(t([[1, 10], [2, 0], [3, 5], [100, -100]]))
    assert out.tolist() == [2.5, 2.5]
    # Rows 1 and 2 are kept in both coordinates: share 2 of 4 kept values each.
    assert agg.last_report.weights == [0.0, 0.5, 0.5, 0.0]
    assert agg.last_report.selected == [False, True, True, False]


def test_median_odd_and_even():
    agg = aggregate.build("median", num_byzantine=1)
    assert agg(t([[1, 5], [3, -1], [2, 0]])).tolist() == [2.0, 0.0]
    # Even n: mean of the two middle values (not torch.median's lower one).
    assert agg(t([[1], [2], [10], [20]])).tolist() == [6.0]
    assert agg.last_report.weights == [0.0, 0.5, 0.5, 0.0]
    assert agg.last_report.distance_to_aggregate == [5.0, 4.0, 4.0, 14.0]


# Cluster of four plus an outlier. Squared distances: the centre (.5,.5) is 0.5
# from each corner; corners are 1 or 2 apart; the outlier (10,10) is 180.5 from
# the centre, 181 from (1,0) and (0,1), 200 from (0,0).
KRUM_ROWS = [[0, 0], [1, 0], [0, 1], [0.5, 0.5], [10, 10]]


def test_krum_scores_and_choice():
    rows = t(KRUM_ROWS)
    # n - f - 2 = 2 nearest: corners 0.5 + 1, centre 0.5 + 0.5, outlier 180.5 + 181.
    assert krum_scores(rows, 1).tolist() == [1.5, 1.5, 1.5, 1.0, 361.5]
    agg = aggregate.build("krum", num_byzantine=1)
    assert agg(rows).tolist() == [0.5, 0.5]
    assert agg.last_report.selected == [False, False, False, True, False]
    assert agg.last_report.weights == [0.0, 0.0, 0.0, 1.0, 0.0]


def test_multi_krum_default_m_and_explicit_m():
    rows = t(KRUM_ROWS)
    agg = aggregate.build("multi-krum", num_byzantine=1)  # m = n - f = 4: the cluster
    assert agg(rows).tolist() == [0.375, 0.375]
    assert agg.last_report.selected == [True, True, True, True, False]
    assert agg.last_report.weights == [0.25, 0.25, 0.25, 0.25, 0.0]
    assert aggregate.build("multi-krum", 1, m=1)(rows).tolist() == [0.5, 0.5]
    with pytest.raises(ValueError, match="m=9 exceeds"):
        aggregate.build("multi-krum", 1, m=9)(rows)


def test_geometric_median_symmetric_and_fermat_point():
    gm = aggregate.build("geometric-median", num_byzantine=1)
    # Equilateral triangle: by symmetry the centroid (1, sqrt(3)/3).
    out = gm(t([[0, 0], [2, 0], [1, math.sqrt(3)]]))
    torch.testing.assert_close(out, t([1.0, math.sqrt(3) / 3]), atol=1e-5, rtol=0)
    # Right isosceles triangle: the Fermat point (t, t) with 6t^2 - 6t + 1 = 0,
    # t = (3 - sqrt 3) / 6. The coordinate-wise median start is the vertex (0, 0),
    # where plain smoothed Weiszfeld would stall.
    out = gm(t([[0, 0], [1, 0], [0, 1]]))
    fermat = (3 - math.sqrt(3)) / 6
    torch.testing.assert_close(out, t([fermat, fermat]), atol=1e-5, rtol=0)
    weights = torch.tensor(gm.last_report.weights, dtype=torch.float64)
    assert weights.sum().item() == pytest.approx(1.0)
    torch.testing.assert_close((weights @ t([[0, 0], [1, 0], [0, 1]]).double()).float(), out, atol=1e-6, rtol=0)
    # 1-D: the geometric median is the median.
    assert gm(t([[0], [1], [5]])).tolist() == [1.0]


def test_centered_clip_fully_clips_outlier():
    cc = aggregate.build("centered-clip", num_byzantine=1, tau=1.5, iterations=1)
    rows = t([[0, 0], [2, 0], [0, 2], [100, 100]])
    out = cc(rows)
    # Start: coordinate-wise median (1, 1). Deviations (-1,-1), (1,-1), (-1,1) have
    # norm sqrt 2 < 1.5 (kept); (99, 99) is clipped to norm 1.5: 1.5/sqrt 2 per coordinate.
    # v = 1 + ((-1 + 1 - 1) + 1.5/sqrt 2) / 4 per coordinate.
    expected = 1 + (-1 + 1.5 / math.sqrt(2)) / 4
    torch.testing.assert_close(out, t([expected, expected]), atol=1e-6, rtol=0)
    report = cc.last_report
    assert report.clip_scale[:3] == [1.0, 1.0, 1.0]
    assert report.clip_scale[3] == pytest.approx(1.5 / (99 * math.sqrt(2)))
    assert report.selected == [True, True, True, False]
    assert sum(report.weights) == pytest.approx(1.0)
    assert report.weights[3] == pytest.approx(report.clip_scale[3] / 4)


def test_centered_clip_keeps_previous_aggregate_as_centre():
    cc = aggregate.build("centered-clip", num_byzantine=1, tau=1.0, iterations=1)
    cc(t([[0.0], [0.0], [0.0]]))  # previous aggregate 0
    # Centre 0 (not the median 10): each deviation of 10 is clipped to 1 -> v = 1.
    assert cc(t([[10.0], [10.0], [10.0]])).tolist() == [1.0]
    # Shares: each row 1/3 of its clipped deviation; the rest is the previous aggregate's.
    assert cc.last_report.weights == pytest.approx([0.1 / 3] * 3)
    cc.reset()
    assert cc(t([[10.0], [10.0], [10.0]])).tolist() == [10.0]
    with pytest.raises(ValueError, match="reset"):
        cc(t([[1.0, 2.0], [1.0, 2.0], [1.0, 2.0]]))


def test_geometric_median_at_an_exact_fixed_point_off_the_rows():
    # Start (the median) is 0, on no row, and the unit vectors to the rows cancel exactly:
    # 0 is the optimum. Its shares are the plain Weiszfeld ones, 1/6 each (they used to vanish).
    gm = aggregate.build("geometric-median", num_byzantine=1)
    assert gm(t([[1], [1], [1], [-1], [-1], [-1]])).tolist() == pytest.approx([0.0], abs=1e-12)
    assert gm.last_report.weights == pytest.approx([1 / 6] * 6)


def test_mean_near_float32_limit_does_not_overflow():
    # 3e38 + 3e38 overflows float32; the mean (3e38) does not, so the sum is redone in float64.
    big = t([3e38]).item()
    assert aggregate.build("mean")(t([[big, 1.0], [big, 2.0]])).tolist() == [big, 1.5]


def test_mean_report_fields():
    agg = aggregate.build("mean")
    assert agg(t([[0, 0], [3, 4]])).tolist() == [1.5, 2.0]
    report = agg.last_report
    assert report.weights == [0.5, 0.5]
    assert report.selected == [True, True]
    assert report.distance_to_aggregate == [2.5, 2.5]
    assert report.clip_scale == [1.0, 1.0]


# ------------------------------------------------------- pre-aggregation mixing


def test_nnm_replaces_each_row_by_mean_of_nearest():
    rows = t([[0.0], [1.0], [3.0], [100.0]])
    mixed, mixing = nearest_neighbour_mixing(rows, num_byzantine=1)
    # n - f = 3 nearest, self included: 0 -> {0,1,3}; 1 -> {1,0,3}; 3 -> {3,1,0}; 100 -> {100,3,1}.
    assert mixed.flatten().tolist() == pytest.approx([4 / 3, 4 / 3, 4 / 3, 104 / 3])
    assert mixing.matrix.sum(dim=1).tolist() == pytest.approx([1.0] * 4)
    # Through the public interface: NNM then median of the mixed rows (4/3 twice in the middle).
    agg = aggregate.build("median", 1, nnm=True)
    assert agg(rows).tolist() == pytest.approx([4 / 3])
    # Shares map back to the original rows: the median averages mixed rows 1 and 2,
    # each (0 + 1 + 3) / 3, so rows 0, 1, 2 get 1/3 and the outlier 0.
    assert agg.last_report.weights == pytest.approx([1 / 3, 1 / 3, 1 / 3, 0.0])


def test_bucketing_averages_buckets_and_is_seeded():
    rows = t([[float(i)] for i in range(6)])
    means, mixing = bucketing(rows, bucket_size=2, seed=7)
    assert means.shape == (3, 1)
    # Every row lands in exactly one bucket, with share 1/2 of it.
    assert sorted(mixing.home.tolist()) == [0, 0, 1, 1, 2, 2]
    assert mixing.matrix.sum(dim=0).tolist() == [0.5] * 6
    torch.testing.assert_close(means, (mixing.matrix @ rows.double()).float())
    # The buckets depend on the seed and the row contents, not the row order.
    again, _ = bucketing(rows.flip(0), bucket_size=2, seed=7)
    assert again.flatten().tolist() == means.flatten().tolist()
    buckets = {tuple(sorted(seed_buckets)) for seed_buckets in _bucket_sets(rows, range(10))}
    assert len(buckets) > 1
    # The last bucket may be smaller.
    odd, _ = bucketing(t([[1.0], [2.0], [3.0]]), bucket_size=2, seed=0)
    assert sorted(odd.flatten().tolist()) in ([1.5, 3.0], [2.0, 2.0], [2.5, 1.0], [1.0, 2.5])


def _bucket_sets(rows, seeds):
    for seed in seeds:
        means, _ = bucketing(rows, bucket_size=2, seed=seed)
        yield means.flatten().tolist()


def test_bucketing_with_rule_and_report():
    rows = t([[0.0], [2.0], [4.0], [6.0]])
    agg = aggregate.build("mean", bucket_size=2, seed=3)
    assert agg(rows).tolist() == [3.0]
    assert agg.last_report.weights == pytest.approx([0.25] * 4)
    # Krum on 3 bucket means cannot tolerate f=1 (needs 2f+3 = 5).
    with pytest.raises(ValueError, match="needs at least 2f\\+3 = 5 updates, got 3 after bucketing 6 rows by bucket_size=2.*smaller"):
        aggregate.build("krum", 1, bucket_size=2)(torch.zeros(6, 1))
    # Per-call seed overrides the built one, deterministically.
    first = aggregate.build("median", 0, bucket_size=2)(rows, seed=11)
    assert aggregate.build("median", 0, bucket_size=2)(rows, seed=11).tolist() == first.tolist()


# ------------------------------------------------------------- row order


def test_krum_after_nnm_regression_tie_between_mixed_rows():
    # Found by hypothesis. With f = 1 each row is mixed with its 4 nearest; mixed rows
    # 0, 2 = (2, 1, -1)/5 and 1, 5 = (0, 1, -3)/5 then tie on Krum score (0.64). The tie is
    # broken by the mixed rows' content, but the mixed rows were summed in input order
    # (M @ rows), so one order gave 0.0 and the other 5.6e-17 for (1 - 1 + 1 - 2 + 1)/5:
    # different bits, a different content order, the other winner (0.4 apart).
    rows = t([[1, 0, 0], [-1, 0, -1], [1, 0, 0], [-2, 0, 0], [0, 0, 2], [1, 1, -2]])
    perm = torch.tensor([0, 5, 2, 3, 4, 1])
    mixed, _ = nearest_neighbour_mixing(rows, 1)
    mixed_permuted, _ = nearest_neighbour_mixing(rows[perm], 1)
    assert torch.equal(mixed_permuted, mixed[perm])
    assert krum_scores(mixed, 1).tolist() == pytest.approx([0.64, 0.64, 0.64, 1.12, 1.12, 0.64])
    expected = t([0.0, 0.2, -0.6])  # (0, 1, -3)/5: first of the two tied contents
    agg = aggregate.build("krum", 1, nnm=True)
    assert torch.equal(agg(rows), expected)
    assert agg.last_report.weights == pytest.approx([0.2, 0.2, 0.2, 0.2, 0.0, 0.2])
    assert torch.equal(agg(rows[perm]), expected)
    assert agg.last_report.weights == pytest.approx([0.2, 0.2, 0.2, 0.2, 0.0, 0.2])


def test_canonical_order_reads_past_long_equal_prefixes():
    rows = torch.zeros(4, 5000)
    rows[0, 4999] = 2.0  # rows differ only in their last entry, past several chunks
    rows[1, 4999] = 1.0
    rows[3, 3000] = -1.0  # negative floats: sign bit set, a negative int32 pattern
    order = canonical_order(rows)
    assert order.tolist() == [3, 2, 1, 0]
    for perm in ([1, 0, 3, 2], [3, 2, 1, 0]):
        permuted = rows[torch.tensor(perm)]
        assert torch.equal(permuted[canonical_order(permuted)], rows[order])
    # Identical rows keep their input order among themselves.
    assert canonical_order(torch.ones(3, 2000)).tolist() == [0, 1, 2]


def test_canonical_order_by_first_values_matches_the_full_comparison():
    """The shortcut (distinct first values decide the order) gives the comparator's order, and rows
    that tie on their first value (+0.0 vs -0.0 are distinct bit patterns) still compare further."""
    from functools import cmp_to_key

    from optim.aggregate_mixing import _compare_bits

    g = torch.Generator().manual_seed(3)
    for trial in range(40):
        rows = torch.randn(7, 50, generator=g)
        if trial % 2:
            rows[:, 0] = torch.tensor([0.0, -0.0, 1.0, 0.0, -1.0, 1.0, 2.0])[torch.randperm(7, generator=g)]
        bits = rows.view(torch.int32)
        expected = sorted(range(7), key=cmp_to_key(lambda i, j: _compare_bits(bits[i], bits[j])))
        assert canonical_order(rows).tolist() == expected


# ------------------------------------------------------------------- validation


def test_validation_messages():
    with pytest.raises(ValueError, match="valid names: mean, median, trimmed-mean, krum"):
        aggregate.build("average")
    with pytest.raises(ValueError, match="unknown option.*tau.*accepted"):
        aggregate.build("median", tau=1.0)
    with pytest.raises(ValueError, match="num_byzantine must be an integer >= 0"):
        aggregate.build("median", -1)
    with pytest.raises(ValueError, match="bucket_size must be an integer >= 1"):
        aggregate.build("median", bucket_size=0)
    with pytest.raises(ValueError, match="tau must be a number > 0"):
        aggregate.build("centered-clip", tau=-1)
    rows5 = torch.zeros(5, 3)
    with pytest.raises(ValueError, match=r"krum with num_byzantine=2 needs at least 2f\+3 = 7 updates, got 5"):
        aggregate.build("krum", 2)(rows5)
    with pytest.raises(ValueError, match=r"multi-krum .* 2f\+3 = 7"):
        aggregate.build("multi-krum", 2)(rows5)
    for name in ("median", "trimmed-mean", "geometric-median", "centered-clip"):
        with pytest.raises(ValueError, match=rf"{name} with num_byzantine=3 needs at least 2f\+1 = 7"):
            aggregate.build(name, 3)(rows5)
        aggregate.build(name, 2)(rows5)  # n = 2f + 1 is enough
    aggregate.build("krum", 1)(rows5)  # n = 2f + 3 is enough


def test_non_finite_rows_are_refused():
    rows = torch.zeros(4, 3)
    rows[2, 1] = float("nan")
    rows[3, 0] = float("inf")
    with pytest.raises(ValueError, match=r"row\(s\) \[2, 3\] contain NaN or Inf"):
        aggregate.build("mean")(rows)
    with pytest.raises(ValueError, match=r"\(n, d\)"):
        aggregate.build("mean")(torch.zeros(3))
    # float64 input beyond the float32 range would become Inf: refused too.
    with pytest.raises(ValueError, match="NaN or Inf"):
        aggregate.build("mean")(torch.tensor([[1e300], [0.0]], dtype=torch.float64))


def test_centered_clip_centre_can_be_handed_over():
    # A late joiner given the swarm's previous aggregate computes what the others compute.
    rows = t([[0.0, 1.0], [2.0, 5.0], [9.0, -3.0]])
    veteran = aggregate.build("centered-clip", 1, tau=1.0)
    veteran(t([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]]))
    newcomer = aggregate.build("centered-clip", 1, tau=1.0)
    newcomer.previous = veteran.previous
    assert newcomer(rows).tolist() == veteran(rows).tolist()
    assert aggregate.build("centered-clip", 1, tau=1.0)(rows).tolist() != veteran.previous.tolist()
