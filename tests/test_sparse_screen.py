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
    assert sparse_screen.support(rows, min_net=1).tolist() == [3, 3, 3, 3, 1, 1]
    # the default bar, net >= 2: one shared coordinate is not enough; the colluders' two are
    assert sparse_screen.support(rows).tolist() == [0, 0, 0, 0, 1, 1]
    # a row of the opposite sign where it meets the others: net -1 with each, vouched for by nobody
    flipped = torch.cat([rows[:4], -rows[:1]])
    assert sparse_screen.agreement(flipped)[4, :4].tolist() == [-3.0, -1.0, -1.0, -1.0]
    assert sparse_screen.support(flipped, min_net=1)[4] == 0


def net_only(rows: torch.Tensor, f: int) -> list[bool]:
    """The screen with the vouching test alone, at the bar net >= 1."""
    return sparse_screen.screen(rows, f, min_net=1, floor=None, copy_check=False).tolist()


def test_screen_sets_aside_at_most_f_rows():
    rows = honest_and_colluders()
    assert net_only(rows, 2) == [True] * 4 + [False, False]
    assert sparse_screen.screen(rows, 0).all()  # nothing declared, nothing screened
    # f = 1: a row needs 1 voucher; each colluder has the other, so both stay
    assert all(net_only(rows, 1))
    # f = 3 asks for 3 vouchers: rows 4 and 5 fall short, the honest ones have 3: still 2 set aside
    assert net_only(rows, 3) == [True] * 4 + [False, False]
    # more rows short than f: the evidence is thin, every row is kept
    lonely = torch.eye(5)
    assert all(net_only(lonely, 2))
    assert sparse_screen.screen(lonely, 2).all()


def test_rule_with_screen_runs_on_the_rest_with_f_lowered():
    rows = honest_and_colluders()
    screened = sparse_trimmed_mean(rows, 2, clip_ratio=None, value_clip=None, screen=True, screen_net=1, screen_floor=None,
                                   screen_copies=False)
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
    for key, bad in (("screen_net", 0), ("screen_net", 1.5), ("screen_floor", 0.5), ("screen_floor", "2"), ("screen_copies", 1)):
        with pytest.raises(ValueError, match=key):
            sparse_mean.build("sparse-trimmed-mean", 1, **{key: bad})
    rule = sparse_mean.build("sparse-trimmed-mean", 2, clip_ratio=None, value_clip=None)
    assert rule.options["screen"] is True  # on by default
    assert (rule.options["screen_net"], rule.options["screen_floor"], rule.options["screen_copies"]) == (2, 2.0, True)
    rows = honest_and_colluders()
    rows[:4, :4] = torch.tensor([[1.0, 2.0, 1.5, 1.0], [1.5, 1.0, 1.0, 2.0], [2.0, 1.5, 1.0, 1.0], [1.0, 1.0, 2.0, 1.5]])
    rows[:4, 4:6] = 0.0  # four honest rows on coordinates 0-3, each pair vouching with net 4
    rows[5, 6:] = torch.tensor([-8.0, 8.0])  # the colluders: net 2 between them, 0 with the honest rows
    rows[:4] *= torch.tensor([1.0, 1.1, 1.2, 1.3])[:, None]  # honest rows never bit-identical
    out = rule._rule(rows, 2, None, 0).output
    assert out[6:].tolist() == [0.0, 0.0]


def five_honest() -> torch.Tensor:
    """(5, 12): five honest rows, positive on coordinates 0-5 (each sends 4 of them, every pair
    shares 2 or more: net >= 2) and one coordinate of their own each (6-10)."""
    rows = torch.zeros(5, 12)
    for i, cols in enumerate(([0, 1, 2, 3], [0, 1, 4, 5], [2, 3, 4, 5], [0, 2, 4, 1], [1, 3, 5, 0])):
        rows[i, cols] = torch.tensor([1.0, 2.0, 3.0, 4.0]) * (1 + i / 10)
        rows[i, 6 + i] = 2.0
    return rows


def test_copies_by_hand():
    honest = five_honest()
    assert not sparse_screen.copies(honest).any()
    # mimicry: two attackers send honest row 1 again: of the three equal rows two are copies
    mimic = torch.cat([honest[1:2], honest[1:2], honest])
    assert sparse_screen.copies(mimic).tolist() == [False, True, False, True, False, False, False]
    # the same signs on the same coordinates are not a copy (honest rows may share a short chunk's
    # whole pattern), nor is a copy with one bit changed (the documented limit)
    same_signs = torch.stack([honest[1], honest[1] * 1.25])
    assert not sparse_screen.copies(same_signs).any()
    nudged = honest[1].clone()
    nudged[0] = torch.nextafter(nudged[0], torch.tensor(10.0))
    assert not sparse_screen.copies(torch.stack([honest[1], nudged])).any()
    assert sparse_screen.copies(torch.stack([honest[0], honest[0].clone()])).tolist() == [False, True]


def test_copies_are_set_aside_and_f_lowered():
    honest = five_honest()
    mimic = torch.cat([honest[1:2], honest[1:2], honest])  # f = 2 attackers copying honest row 1
    screened = sparse_trimmed_mean(mimic, 2)
    assert screened.selected.sum() == 5 and screened.clip_scale.tolist().count(0.0) == 2
    # the round as the five honest rows alone with f = 0 (both copies counted as the f)
    assert torch.equal(screened.output, sparse_trimmed_mean(honest, 0).output)
    assert screened.output[7].item() == pytest.approx(2.0)  # row 1's own coordinate counted once, not three times
    # more copies than f: the screen does not trust itself, every row is kept
    assert sparse_screen.screen(torch.cat([honest[1:2]] * 3 + [honest]), 2).all()


def test_tiny_rows_by_hand():
    honest = five_honest()
    shrunk = 0.05 * honest.mean(dim=0)  # min-max's row on top-k updates: the honest mean scaled down, every sign right
    rows = torch.cat([shrunk[None], honest])
    norms = sparse_screen.row_norms(rows)
    lower_median = float(torch.sort(norms).values[2])
    assert sparse_screen.tiny(rows).tolist() == [True] + [False] * 5
    assert bool(norms[0] < lower_median / 2)
    assert not sparse_screen.tiny(rows, floor=None).any()
    assert not sparse_screen.tiny(torch.zeros(4, 3)).any()  # a zero median: no row is tiny
    # the shrunken row agrees with every honest row in sign: only the tiny test sets it aside
    assert sparse_screen.support(rows)[0] >= 1
    assert sparse_screen.screen(rows, 1).tolist() == [False] + [True] * 5
    assert sparse_screen.screen(rows, 1, floor=None).all()
    out = sparse_trimmed_mean(rows, 1).output
    assert torch.equal(out, sparse_trimmed_mean(honest, 0).output)


def test_bar_of_two_sets_aside_a_chance_meeting():
    """A row with its own coordinates that meets honest rows on one coordinate each, in sign by
    chance (label flipping, noise): vouched for at net >= 1, not at the default net >= 2."""
    honest = five_honest()
    stray = torch.zeros(2, 12)
    stray[:, 11] = torch.tensor([3.0, 2.5])
    stray[0, 6] = 1.0  # meets honest row 0 on its own coordinate, same sign: net 1
    rows = torch.cat([stray, honest])
    assert sparse_screen.support(rows, min_net=1)[0] == 2  # its accomplice and row 0
    assert sparse_screen.screen(rows, 2, min_net=1, floor=None, copy_check=False).all() == False  # noqa: E712
    assert sparse_screen.screen(rows, 2, min_net=1, floor=None, copy_check=False)[:2].tolist() == [True, False]
    assert sparse_screen.screen(rows, 2, floor=None, copy_check=False).tolist() == [False, False] + [True] * 5


def test_copies_and_tiny_rows_order_independent_and_bit_exact():
    gen = torch.Generator().manual_seed(11)
    base = torch.randn(3000, generator=gen)
    honest = torch.stack([base + 0.5 * torch.randn(3000, generator=gen) for _ in range(6)])
    honest.masked_fill_(honest.abs() < 1.2, 0.0)
    shrunk = 0.05 * honest.mean(dim=0)
    shrunk.masked_fill_(honest.mean(dim=0).abs() < 1.0, 0.0)  # a top-k of the shrunken mean: signs all right
    rows = torch.cat([honest[2:3], shrunk[None], honest])  # f = 2: a copy of honest row 2 and a tiny row
    first = sparse_trimmed_mean(rows, 2)
    assert first.clip_scale.tolist().count(0.0) == 2 and first.clip_scale[1] == 0.0  # the tiny row and one of the two equal rows
    assert torch.equal(first.output, sparse_trimmed_mean(honest, 0).output)  # as the 6 honest rows with f = 0
    for seed in range(3):
        perm = torch.randperm(8, generator=torch.Generator().manual_seed(seed))
        again = sparse_trimmed_mean(rows[perm], 2)
        assert torch.equal(again.output, first.output)
        assert torch.equal(again.weights.sort().values, first.weights.sort().values)
