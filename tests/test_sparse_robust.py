"""sparse-trimmed-mean (optim/sparse_robust.py): vote-gated, clipped, trimmed over the senders."""

from __future__ import annotations

import pytest
import torch

from optim import sparse_mean, sparse_robust
from optim.sparse_robust import clip_values, sparse_trimmed_mean


def sparse_rows(n: int, d: int, density: float, seed: int) -> torch.Tensor:
    """(n, d) float32 rows, each keeping its own random `density` of coordinates."""
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randn(n, d, generator=gen)
    return rows.masked_fill_(torch.rand(n, d, generator=gen) >= density, 0.0)


def test_each_branch_by_hand():
    rows = torch.tensor([
        [1.0, 0.0, 9.0, 1.0],
        [2.0, 5.0, 0.0, 2.0],
        [3.0, 0.0, 0.0, 0.0],
        [4.0, 7.0, 0.0, 6.0],
        [100.0, 0.0, 0.0, 0.0],
    ])
    result = sparse_trimmed_mean(rows, 1, clip_ratio=None, value_clip=None, min_votes=2)
    # col 0: 5 senders >= 2f+1: drop 1 and 100, mean(2, 3, 4) = 3
    # col 1: 2 senders (f+1..2f): both positive, so the smaller of {5, 7} = 5 (sign agreement)
    # col 2: 1 sender < f+1: not created
    # col 3: 3 senders: drop 1 and 6, keep 2
    assert result.output.tolist() == [3.0, 5.0, 0.0, 2.0]
    # shares over the 3 aggregated coordinates: row 1 holds 1/3 + 1 + 1, rows 2 and 3 1/3 each
    torch.testing.assert_close(result.weights, torch.tensor([0.0, 7 / 9, 1 / 9, 1 / 9, 0.0], dtype=torch.float64))
    # senders that disagree on the sign, too few to trim: the coordinate is erased, not flipped
    split = torch.tensor([[2.0], [-3.0], [0.0]])
    assert sparse_trimmed_mean(split, 1, clip_ratio=None, value_clip=None).output.tolist() == [0.0]
    assert sparse_trimmed_mean(-rows, 1, clip_ratio=None, value_clip=None, min_votes=2).output.tolist() == [-3.0, -5.0, 0.0, -2.0]
    assert result.selected.tolist() == [False, True, True, True, False]
    assert result.clip_scale.tolist() == [1.0] * 5


def test_min_votes_overrides_f_plus_one():
    rows = torch.tensor([[1.0, 4.0], [3.0, 0.0], [5.0, 0.0]])
    assert sparse_trimmed_mean(rows, 1, clip_ratio=None, value_clip=None).output.tolist() == [3.0, 4.0]  # 3 rows: 1 vote
    assert sparse_trimmed_mean(rows, 1, clip_ratio=None, value_clip=None, min_votes=2).output.tolist() == [3.0, 0.0]
    assert sparse_trimmed_mean(rows, 1, clip_ratio=None, value_clip=None, min_votes=1).output.tolist() == [3.0, 4.0]
    assert sparse_trimmed_mean(rows, 1, clip_ratio=None, value_clip=None, min_votes=4).output.tolist() == [0.0, 0.0]


def test_rows_are_clipped_to_twice_the_lower_median_norm():
    rows = torch.tensor([[3.0, 0.0], [0.0, 4.0], [3.0, 4.0], [60.0, 80.0]])  # norms 3, 4, 5, 100
    result = sparse_trimmed_mean(rows, 1, value_clip=None)
    # lower median of 4 norms = 4, limit 8: the last row becomes [4.8, 6.4]; others unchanged
    torch.testing.assert_close(result.clip_scale, torch.tensor([1.0, 1.0, 1.0, 0.08], dtype=torch.float64))
    assert result.output.tolist() == [3.0, 4.0]  # col 0: trim {3, 3, 4.8}; col 1: trim {4, 4, 6.4}
    assert not bool(result.selected[3])
    # never scaled up: tiny rows keep their values
    small = torch.tensor([[1e-3, 0.0], [1.0, 1.0], [1.0, 1.0]])
    assert sparse_trimmed_mean(small, 0, value_clip=None).clip_scale.tolist() == [1.0, 1.0, 1.0]


def test_f0_is_sparse_mean():
    rows = sparse_rows(7, 20_000, 0.2, seed=3)
    result = sparse_trimmed_mean(rows, 0, value_clip=None)  # no clipping: exactly SparseLoCo's rule
    assert result.clip_scale.tolist() == [1.0] * 7  # similar norms: nobody clipped at 2x the median
    reference = sparse_mean.sparse_mean(rows).output
    assert torch.equal(result.output != 0, reference != 0)
    torch.testing.assert_close(result.output, reference, rtol=1e-6, atol=1e-7)  # float64 vs float32 sum order
    torch.testing.assert_close(result.weights.sum().item(), 1.0)


def test_a_lone_attacker_cannot_create_a_coordinate():
    honest = sparse_rows(7, 1000, 0.15, seed=5)  # 8 rows with the attacker: a coordinate needs 2 senders
    nobody = (honest == 0).all(dim=0).nonzero().view(-1)[:20]  # coordinates no honest peer sent
    assert nobody.numel() == 20
    attacker = torch.zeros(1, 1000)
    attacker[0, nobody] = 1e6
    agg = sparse_mean.build("sparse-trimmed-mean", num_byzantine=1, screen=False)  # the vote alone
    alone = sparse_mean.build("sparse-trimmed-mean", num_byzantine=1, min_votes=2, screen=False)(honest)  # the same 2-vote rule
    attacked = agg(torch.cat([honest, attacker]))
    # its coordinates have 1 vote < 2: not created. (Its row shifts the median RMS each chunk's value
    # clip is measured against, so honest outliers may be clipped a little differently.)
    # (two opposite values clipped to the same size may then cancel: a support can differ a little)
    assert ((attacked != 0) != (alone != 0)).sum().item() <= 2
    assert (attacked - alone).abs().max().item() < 0.5 * alone.abs().max().item()
    assert attacked[nobody].abs().max().item() == 0.0
    # with the screen no honest row shares a coordinate with it: set aside, and the 7 honest rows are
    # aggregated as with f = 0, exactly. (These honest rows have random signs, so a pair's net
    # agreement is 0 +- noise: the bar net >= 1, not the default 2, finds a voucher for each.)
    screened = sparse_mean.build("sparse-trimmed-mean", num_byzantine=1, screen_net=1)(torch.cat([honest, attacker]))
    assert torch.equal(screened, sparse_mean.build("sparse-trimmed-mean", num_byzantine=0)(honest))


def test_sent_values_are_clipped_to_twice_the_median_senders_rms_in_their_chunk():
    # chunk 4: rows' RMS over what they sent in chunk 0: 1, 1, 2 (lower median 1 -> limit 2); chunk 1: 3, 3, 3
    rows = torch.tensor([[1.0, -1.0, 0.0, 0.0, 3.0, 0.0, 0.0, 0.0],
                         [0.0, 1.0, 0.0, 0.0, 0.0, 3.0, 0.0, 0.0],
                         [2.0, 0.0, 0.0, 0.0, 0.0, 0.0, -3.0, 0.0],
                         [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    clipped = clip_values(rows, 2.0, 4)
    assert clipped[2, 0].item() == 2.0 and clipped[:2].tolist() == rows[:2].tolist()  # 2 <= 2: kept
    poisoned = rows.clone()
    poisoned[3, 2] = 1e6  # one value carrying a huge norm, on a coordinate nobody else sent
    out = clip_values(poisoned, 2.0, 4)
    assert out[3, 2].item() == 2.0  # median RMS over the 4 senders of chunk 0 is 1 (lower median of 1, 1, 2, 1e6)
    assert torch.equal(out[:, 4:], poisoned[:, 4:]) and torch.equal(out != 0, poisoned != 0)  # chunks apart; no vote lost
    assert clip_values(poisoned, None, 4) is poisoned


def test_two_huge_attackers_move_it_less_than_sparse_mean():
    gen = torch.Generator().manual_seed(7)
    d = 2000
    honest = sparse_rows(6, d, 0.05, seed=8)
    honest[:, :100] = 1.0 + 0.1 * torch.randn(6, 100, generator=gen)  # shared coordinates
    attackers = torch.zeros(2, d)
    attackers[:, :100] = 1e4
    rows = torch.cat([honest, attackers])
    truth = honest[:, :100].mean(dim=0)
    robust = sparse_mean.build("sparse-trimmed-mean", num_byzantine=2)(rows)[:100]
    plain = sparse_mean.build("sparse-mean")(rows)[:100]
    robust_error = (robust - truth).abs().max().item()
    plain_error = (plain - truth).abs().max().item()
    assert plain_error > 2000.0  # (6 * ~1 + 2 * 1e4) / 8 ~ 2500
    assert robust_error < 0.15  # clipped to ~2x the median norm, then trimmed away
    assert robust_error < plain_error / 10_000


def test_bit_identical_for_any_row_order_and_thread_count():
    rows = sparse_rows(9, 70_000, 0.1, seed=11)  # > COLUMN_BLOCK columns: two blocks
    rows[4] *= 50.0  # a clipped row
    rows[6, :500] = rows[2, :500]  # equal values on shared coordinates (ties in the sort)
    reference = sparse_trimmed_mean(rows, 2)
    assert reference.clip_scale[4] < 1.0
    threads = torch.get_num_threads()
    try:
        for seed, n_threads in ((0, 1), (1, 2), (2, 4)):
            torch.set_num_threads(n_threads)
            perm = torch.randperm(9, generator=torch.Generator().manual_seed(seed))
            result = sparse_trimmed_mean(rows[perm], 2)
            assert torch.equal(result.output, reference.output)
            assert torch.equal(result.clip_scale, reference.clip_scale[perm])
            assert torch.equal(result.weights, reference.weights[perm])
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("case", ["zeros", "mostly-empty", "huge", "tiny"])
def test_never_produces_nan(case):
    rows = sparse_rows(5, 300, 0.5, seed=13)
    if case == "zeros":
        rows.zero_()
    elif case == "mostly-empty":
        rows[:3] = 0.0  # median norm 0: the other rows are scaled to 0, votes still counted
    elif case == "huge":
        rows[3:] = torch.sign(rows[3:]) * 3e38
    else:
        rows *= 1e-40  # subnormal
    out = sparse_mean.build("sparse-trimmed-mean", num_byzantine=2)(rows)
    assert bool(torch.isfinite(out).all())
    assert not bool(torch.signbit(out[out == 0]).any())  # no -0.0


def test_options_and_row_count_are_checked():
    with pytest.raises(ValueError, match="accepted: clip_ratio, value_clip, chunk, min_votes, screen, screen_net, screen_floor, screen_copies, bucket_size, seed, nnm"):
        sparse_mean.build("sparse-trimmed-mean", num_byzantine=1, tau=1.0)
    for bad in ({"clip_ratio": 0}, {"clip_ratio": float("inf")}, {"min_votes": 0}, {"bucket_size": 0}):
        with pytest.raises(ValueError):
            sparse_mean.build("sparse-trimmed-mean", num_byzantine=1, **bad)
    agg = sparse_mean.build("sparse-trimmed-mean", num_byzantine=1, clip_ratio=None, bucket_size=2)
    assert isinstance(agg, sparse_robust.SparseTrimmedMean)
    with pytest.raises(ValueError, match="2f\\+1"):
        sparse_mean.build("sparse-trimmed-mean", num_byzantine=1)(torch.ones(2, 4))
    with pytest.raises(ValueError, match="NaN"):
        sparse_mean.build("sparse-trimmed-mean")(torch.tensor([[1.0, float("nan")]]))
    # bucketing first (6 rows -> 3 buckets of 2) still aggregates
    assert agg(sparse_rows(6, 100, 0.5, seed=1)).shape == (100,)


def test_by_default_two_senders_make_a_coordinate_from_8_rows():
    assert [sparse_robust.default_min_votes(n, f) for n, f in ((4, 1), (7, 3), (8, 0), (8, 1), (12, 3))] == [1, 1, 1, 2, 2]
    # 8 rows, f = 2: coordinate 0 has 2 senders (created: they agree, the smaller), coordinate 1 one (not)
    rows = torch.zeros(8, 2)
    rows[0, 0], rows[1, 0], rows[2, 1] = 1.0, 3.0, 9.0
    assert sparse_trimmed_mean(rows, 2, clip_ratio=None, value_clip=None).output.tolist() == [1.0, 0.0]
    assert sparse_trimmed_mean(rows, 0, clip_ratio=None, value_clip=None).output.tolist() == [2.0, 9.0]  # f = 0: the mean, one sender enough
    assert sparse_trimmed_mean(rows[:4], 2, clip_ratio=None, value_clip=None).output.tolist() == [1.0, 9.0]  # 4 rows: one sender too
