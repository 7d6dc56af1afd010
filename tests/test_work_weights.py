"""Work-weighted aggregation (optim/aggregate_weighted.py) and the caps on claimed work
(optim/work_weights.py): hand-computed values, equivalence with row replication, order
independence, and an inflated claim that buys no more than the caps allow."""

from __future__ import annotations

import math

import pytest
import torch

from optim import aggregate
from optim import aggregate_rules as rules
from optim import aggregate_weighted as weighted
from optim.work_weights import WorkCaps, capped_work, minority_level, per_work_scales


def _rows(seed: int, n: int = 7, d: int = 33) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed))


def test_the_weighted_median_sits_at_the_middle_of_the_mass() -> None:
    rows = torch.tensor([[0.0], [1.0], [10.0]])
    # mass intervals [0,1], [1,2], [2,5]: the middle (2.5) lies in 10's
    assert weighted.weighted_median(rows, torch.tensor([1.0, 1.0, 3.0])).output.item() == 10.0
    # [0,1], [1,2], [2,4]: the middle (2) is the boundary between 1 and 10
    assert weighted.weighted_median(rows, torch.tensor([1.0, 1.0, 2.0])).output.item() == 5.5
    # a row of weight 0 is not there at all
    assert weighted.weighted_median(rows, torch.tensor([1.0, 0.0, 1.0])).output.item() == 5.0


def test_the_weighted_trimmed_mean_drops_the_heaviest_f_rows_mass_from_each_end() -> None:
    rows = torch.tensor([[0.0], [1.0], [2.0], [3.0], [100.0]])
    # f = 1: the heaviest row holds 2, so 2 of the mass goes from each end: 0 and 1 below,
    # 100 (all of its 2) above; 2 and 3 remain
    result = weighted.weighted_trimmed_mean(rows, torch.tensor([1.0, 1.0, 1.0, 1.0, 2.0]), 1)
    assert result.output.item() == pytest.approx(2.5)
    assert result.weights.tolist() == pytest.approx([0.0, 0.0, 0.5, 0.5, 0.0])
    # a partial value: weights 2,1,1,1,1 -> drop 2 at each end: 0 (2) below, 100 and 3 above; keep 1, 2
    result = weighted.weighted_trimmed_mean(rows, torch.tensor([2.0, 1.0, 1.0, 1.0, 1.0]), 1)
    assert result.output.item() == pytest.approx(1.5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_equal_weights_give_the_unweighted_rules(seed: int) -> None:
    rows = _rows(seed, n=6)
    ones = torch.ones(6, dtype=torch.float64)
    assert torch.allclose(weighted.weighted_median(rows, ones).output, rules.median(rows).output, atol=1e-6)
    assert torch.allclose(
        weighted.weighted_trimmed_mean(rows, ones, 2).output, rules.trimmed_mean(rows, 2).output, atol=1e-6
    )
    assert torch.allclose(weighted.weighted_mean(rows, ones).output, rules.mean(rows).output, atol=1e-6)
    assert torch.allclose(
        weighted.weighted_centered_clip(rows, ones, num_byzantine=1, tau=None, iterations=3, center=None).output,
        rules.centered_clip(rows, tau=None, iterations=3, center=None).output,
        atol=1e-6,
    )
    gm = rules.geometric_median(rows, iterations=100, eps=1e-6, nu=1e-6).output
    assert torch.allclose(
        weighted.weighted_geometric_median(rows, ones, iterations=100, eps=1e-6, nu=1e-6).output, gm, atol=1e-5
    )


@pytest.mark.parametrize("seed", [0, 1])
def test_an_integer_weight_is_that_many_copies_of_the_row(seed: int) -> None:
    rows = _rows(seed, n=5)
    counts = [3, 1, 2, 1, 1]
    copies = torch.cat([rows[i : i + 1].repeat(c, 1) for i, c in enumerate(counts)])
    w = torch.tensor(counts, dtype=torch.float64)
    assert torch.allclose(weighted.weighted_mean(rows, w).output, rules.mean(copies).output, atol=1e-6)
    assert torch.allclose(weighted.weighted_median(rows, w).output, rules.median(copies).output, atol=1e-6)
    gm = rules.geometric_median(copies, iterations=200, eps=1e-9, nu=1e-7).output
    assert torch.allclose(
        weighted.weighted_geometric_median(rows, w, iterations=200, eps=1e-9, nu=1e-7).output, gm, atol=1e-4
    )


@pytest.mark.parametrize("name", ["mean", "median", "trimmed-mean", "centered-clip", "geometric-median", "multi-krum"])
def test_the_same_rows_and_weights_in_any_order_give_the_same_bits(name: str) -> None:
    rows = _rows(5, n=8)
    rows[3] = rows[6]  # identical rows with different weights
    w = torch.tensor([1.0, 2.0, 0.5, 1.5, 1.0, 3.0, 0.25, 1.0], dtype=torch.float64)
    agg = aggregate.build(name, num_byzantine=1)
    first = agg.aggregate_part(rows, weights=w)
    perm = torch.randperm(8, generator=torch.Generator().manual_seed(3))
    again = agg.aggregate_part(rows[perm], weights=w[perm])
    assert torch.equal(first, again)


def test_the_aggregator_routes_unequal_weights_and_keeps_equal_ones_bit_exact() -> None:
    rows = _rows(9, n=7)
    agg = aggregate.build("median", num_byzantine=2)
    assert torch.equal(agg(rows, weights=[2.0] * 7), agg(rows))
    w = torch.tensor([3.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    assert torch.equal(agg(rows, weights=w), weighted.weighted_median(rows, w, 2).output)
    assert agg.last_report is not None and len(agg.last_report.weights) == 7
    assert sum(agg.last_report.weights) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda r: aggregate.build("krum", num_byzantine=1)(r, weights=[1, 2, 1, 1, 1, 1, 1]), "does not take work weights"),
        (lambda r: aggregate.build("median", bucket_size=2)(r, weights=[1, 2, 1, 1, 1, 1, 1]), "nnm or bucketing"),
        (lambda r: aggregate.build("median")(r, weights=[1, 2, 1]), "got 3 weights for 7"),
        (lambda r: aggregate.build("median")(r, weights=[1, -2, 1, 1, 1, 1, 1]), "finite and >= 0"),
        (lambda r: aggregate.build("median")(r, weights=[0] * 7), "every weight is 0"),
        (lambda r: aggregate.build("median", num_byzantine=2)(r, weights=[9, 9, 1, 1, 1, 1, 1]), "heaviest rows hold"),
    ],
)
def test_bad_weights_are_refused_with_what_to_do(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call(_rows(1))


def test_claims_are_capped_by_the_median_the_history_and_the_minority_rule() -> None:
    # the median claim is 100: 1000 is cut to 2x the median; 0.5x history caps the jump of peer 2
    result = capped_work([100, 100, 180, 1000, 90, "lots", float("nan")], num_byzantine=0, previous=[None, None, 60, None, None, None, None])
    assert result.weights == (100.0, 100.0, 120.0, 200.0, 90.0, 0.0, 0.0)
    assert result.capped_by == ("", "", "history", "median", "", "invalid", "invalid")
    # f = 2 of 6: two claims at the 2x-median cap would hold 400 of 800 (50%) > a third: both are
    # cut together until they hold exactly a third (to 100 each: all equal)
    result = capped_work([100, 100, 100, 100, 400, 400], num_byzantine=2)
    heavy = sum(sorted(result.weights)[-2:])
    assert heavy / sum(result.weights) == pytest.approx(1 / 3)
    assert result.capped_by[4:] == ("minority", "minority") and result.weights[:4] == (100.0,) * 4


def test_rows_are_put_on_one_scale_by_their_claims_and_a_liar_moves_the_scale_only_within_the_caps() -> None:
    # claims 100, 100, 50, 25 (mass 275, half 137.5): the middle of the mass is in the 100s: tau = 100
    shares = capped_work([100, 100, 50, 25], num_byzantine=0)
    assert per_work_scales(shares) == pytest.approx((1.0, 1.0, 2.0, 4.0))
    # a liar claiming 1000 is divided by its whole claim; it counts at the 2x-median cap (200) and
    # does not move tau: mass 25 | 50 | 100 100 | 200, the middle (225) falls in the 100s
    shares = capped_work([25, 50, 100, 100, 1000], num_byzantine=0)
    assert per_work_scales(shares) == pytest.approx((4.0, 2.0, 1.0, 1.0, 0.1))
    # f = 1 liar claiming 1000 among 20, 20, 40: capped (median 30, cap 60) and cut by the minority
    # rule, it still cannot carry the middle of the mass: tau is an honest claim
    shares = capped_work([20, 20, 40, 1000], num_byzantine=1)
    assert 20 * per_work_scales(shares)[0] in (20.0, 30.0, 40.0)
    # the middle exactly on a boundary: the mean of the two claims around it
    assert per_work_scales(capped_work([10, 30], num_byzantine=0)) == pytest.approx((3.0, 1.0))  # mass 10 | 30: in 30
    assert per_work_scales(capped_work([20, 20, 40], num_byzantine=0)) == pytest.approx((1.5, 1.5, 0.75))  # 40 | 40
    # equal claims: nothing to rescale (the rule's bits stay those of the rows); a row claiming
    # nothing keeps its values (its weight is 0)
    assert per_work_scales(capped_work([64, 64, 64], num_byzantine=0)) is None
    assert per_work_scales(capped_work([64, 64, 0], num_byzantine=0)) is None
    assert per_work_scales(capped_work([64, 32, "x"], num_byzantine=0)) == pytest.approx((1.0, 2.0, 1.0))


def test_the_minority_cut_lowers_only_what_it_must() -> None:
    # f = 2, at most 40%: cutting the one heavy claim to 5 is enough (5 + 3 of 20), not all to 2
    assert minority_level([9.88, 3, 3, 3, 2, 2, 2], 2, 0.4) == pytest.approx(5.0)
    # two heavy rows cut together: [c, c, 1, 1, 1, 1] with 2c = 0.4 (2c + 4) -> c = 4/3
    assert minority_level([10, 9, 1, 1, 1, 1], 2, 0.4) == pytest.approx(4 / 3)
    g = torch.Generator().manual_seed(4)
    for _ in range(200):
        weights = (torch.rand(9, generator=g) * 10).tolist()
        level = minority_level(weights, 3, 0.4)
        cut = sorted((min(w, level) for w in weights), reverse=True)
        assert sum(cut[:3]) <= 0.4 * sum(cut) + 1e-9
        if math.isfinite(level) and level > cut[-1]:  # not flattened: the cut is tight at 40%
            assert sum(cut[:3]) == pytest.approx(0.4 * sum(cut))


def test_a_sliver_of_weight_at_the_middle_does_not_move_the_median() -> None:
    rows = torch.tensor([[1.0], [1.0], [1.1], [1.1], [1.1]])
    w = torch.tensor([1000, 1000, 1e-9, 1000, 1000], dtype=torch.float64)
    assert weighted.weighted_median(rows, w, 1).output.item() == pytest.approx(1.05)


def test_too_few_peers_to_weigh_fall_back_to_equal_weights() -> None:
    # f = 2 of 4: even equal weights give 2 rows half the mass; every row is cut to the lightest
    assert minority_level([5.0, 4.0, 3.0, 1.0], 2, 0.4) == 1.0
    with pytest.raises(ValueError, match="only 2 rows carry work"):
        minority_level([5.0, 4.0, 0.0, 0.0], 2, 0.4)
    assert math.isinf(minority_level([1.0, 1.0, 1.0, 1.0, 1.0, 1.0], 2, 0.4))
    with pytest.raises(ValueError, match="max_heavy_share"):
        WorkCaps(max_heavy_share=0.5)


def test_an_inflated_claim_buys_at_most_the_cap_and_the_median_holds() -> None:
    """Six honest peers (updates near +1) and two attackers (at -50) claiming 4x the median work:
    weighted by their claims as given, the attackers hold 57% of the mass and own the median;
    with the caps they hold at most a third and the weighted median stays on the honest side."""
    g = torch.Generator().manual_seed(0)
    honest = 1.0 + 0.1 * torch.randn(6, 64, generator=g)
    attackers = torch.full((2, 64), -50.0)
    rows = torch.cat([honest, attackers])
    claims = [100.0] * 6 + [400.0, 400.0]
    raw = torch.tensor(claims, dtype=torch.float64)
    assert float(raw[6:].sum() / raw.sum()) > 0.5
    with pytest.raises(ValueError, match="heaviest rows hold 57%"):
        aggregate.build("median", num_byzantine=2)(rows, weights=raw)
    taken_at_their_word = weighted._band(rows, raw, None).output  # the middle of the mass, unchecked
    assert float(taken_at_their_word.max()) == -50.0
    capped = torch.tensor(capped_work(claims, num_byzantine=2).weights, dtype=torch.float64)
    assert float(capped[6:].sum() / capped.sum()) <= 1 / 3 + 1e-12
    out = aggregate.build("median", num_byzantine=2)(rows, weights=capped)
    assert float(out.min()) > 0.5 and float(out.max()) < 1.5
    out = aggregate.build("trimmed-mean", num_byzantine=2)(rows, weights=capped)
    assert float(out.min()) > 0.5 and float(out.max()) < 1.5
