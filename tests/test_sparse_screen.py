"""Row screening (optim/sparse_screen.py) and sparse-trimmed-mean's `screen` option."""

from __future__ import annotations

import pytest
import torch

from optim import sparse_mean, sparse_screen
from optim.sparse_robust import sparse_trimmed_mean


def honest_and_colluders() -> torch.Tensor:
    """(6, 8): rows 0-3 honest (they share coordinates 0-3, all positive, each also one of its own),
    rows 4-5 two colluders on coordinates 6-7 that nobody else sends (index poisoning)."""
    return torch.tensor([
        [1.0, 2.0, 0.0, 0.0, 0.5, 0.0, 0.0, 0.0],
        [1.0, 0.0, 3.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        [0.0, 2.0, 3.0, 1.0, 0.0, 0.0, 0.0, 0.0],
        [1.0, 0.0, 0.0, 1.0, 0.0, 0.25, 0.0, 0.0],
        [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -9.0, 9.0],
        [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -9.0, 9.0],
    ])


def test_agreement_and_support_by_hand():
    rows = honest_and_colluders()
    net = sparse_screen.agreement(rows)
    # rows 0 and 1 share coordinate 0 (same sign): +1; rows 0 and 2 share coordinate 1: +1;
    # rows 2 and 3 share coordinates 3: +1; the colluders share 6 and 7: +2, nobody else.
    assert net[0].tolist() == [3.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    assert net[4].tolist() == [0.0, 0.0, 0.0, 0.0, 2.0, 2.0]
    assert sparse_screen.support(rows).tolist() == [3, 3, 3, 3, 1, 1]
    # a row of the opposite sign where it meets the others: net -1 with each, vouched for by nobody
    flipped = torch.cat([rows[:4], -rows[:1]])
    assert sparse_screen.agreement(flipped)[4, :4].tolist() == [-3.0, -1.0, -1.0, -1.0]
    assert sparse_screen.support(flipped)[4] == 0


def test_screen_sets_aside_at_most_f_rows():
    rows = honest_and_colluders()
    assert sparse_screen.screen(rows, 2).tolist() == [True] * 4 + [False, False]
    assert sparse_screen.screen(rows, 0).all()  # nothing declared, nothing screened
    # f = 1: a row needs 1 voucher; each colluder has the other, so both stay
    assert sparse_screen.screen(rows, 1).all()
    # f = 3 asks for 3 vouchers: rows 4 and 5 fall short, the honest ones have 3: still 2 set aside
    assert sparse_screen.screen(rows, 3).tolist() == [True] * 4 + [False, False]
    # more rows short than f: the evidence is thin, every row is kept
    lonely = torch.eye(5)
    assert sparse_screen.screen(lonely, 2).all()


def test_rule_with_screen_runs_on_the_rest_with_f_lowered():
    rows = honest_and_colluders()
    screened = sparse_trimmed_mean(rows, 2, clip_ratio=None, value_clip=None, screen=True)
    # the 4 honest rows alone with f = 2 - 2 = 0: the mean over the senders (sparse-mean), 1 vote
    expected = sparse_trimmed_mean(rows[:4], 0, clip_ratio=None, value_clip=None)
    assert screened.output.tolist() == expected.output.tolist() == [1.0, 2.0, 3.0, 1.0, 0.5, 0.25, 0.0, 0.0]
    assert screened.weights[4:].tolist() == [0.0, 0.0] and screened.selected.tolist() == [True] * 4 + [False, False]
    assert screened.clip_scale.tolist() == [1.0] * 4 + [0.0, 0.0]
    # without the screen the colluders' two votes create coordinates 6 and 7 (sign agreement, f = 2)
    plain = sparse_trimmed_mean(rows, 2, clip_ratio=None, value_clip=None, min_votes=2, screen=False)
    assert plain.output[6:].tolist() == [-9.0, 9.0]


def test_screen_changes_nothing_when_every_row_is_vouched_for():
    gen = torch.Generator().manual_seed(3)
    base = torch.randn(4096, generator=gen)
    rows = torch.stack([base + 0.3 * torch.randn(4096, generator=gen) for _ in range(8)])
    rows.masked_fill_(rows.abs() < 1.5, 0.0)  # overlapping sparse supports of one signal
    for f in (1, 2, 3):
        a = sparse_trimmed_mean(rows, f, screen=True)
        b = sparse_trimmed_mean(rows, f, screen=False)
        assert torch.equal(a.output, b.output) and torch.equal(a.weights, b.weights)


def test_screened_rule_is_order_independent_and_bit_exact():
    gen = torch.Generator().manual_seed(7)
    base = torch.randn(3000, generator=gen)
    honest = torch.stack([base + 0.5 * torch.randn(3000, generator=gen) for _ in range(6)])
    honest.masked_fill_(honest.abs() < 1.2, 0.0)
    attackers = torch.zeros(2, 3000)
    attackers[:, :50] = 4.0  # colluders on coordinates of their own
    attackers[:, 2950:] = -4.0 * torch.sign(base[2950:])
    rows = torch.cat([attackers, honest])
    first = sparse_trimmed_mean(rows, 2, screen=True)
    assert first.selected[:2].tolist() == [False, False]
    for seed in range(3):
        perm = torch.randperm(8, generator=torch.Generator().manual_seed(seed))
        again = sparse_trimmed_mean(rows[perm], 2, screen=True)
        assert torch.equal(again.output, first.output)
        assert torch.equal(again.weights, first.weights[perm])


def test_screen_option_is_checked():
    with pytest.raises(ValueError, match="screen must be true or false"):
        sparse_mean.build("sparse-trimmed-mean", 1, screen="yes")
    rule = sparse_mean.build("sparse-trimmed-mean", 2, clip_ratio=None, value_clip=None)
    assert rule.options["screen"] is True  # on by default
    out = rule._rule(honest_and_colluders(), 2, None, 0).output
    assert out[6:].tolist() == [0.0, 0.0]
