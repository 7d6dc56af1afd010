"""slice_plan.cover: whom a gather asks for what it wants, one stream per holder asked (issue 24)."""

from __future__ import annotations

import random

from peer.run import slice_plan
from peer.run.slice_plan import assign_owners, cover


def test_the_owner_pairs_of_r_2_are_covered_by_one_owner_each():
    """8 serving peers, S = 32, r = 2: the draw gives 4 pairs that own the same 8 slices; a peer
    wanting the 24 slices it does not own asks one member of each other pair (3 holders), and
    each slice goes to a holder that has it."""
    peers = [f"p{i}" for i in range(8)]
    owners = assign_owners(peers, 32, 2, b"seed")
    assert len({frozenset(o) for o in owners}) == 4
    me = peers[0]
    wanted = {j: o for j, o in enumerate(owners) if me not in o}
    chosen = cover(wanted, random.Random(1))
    assert set(chosen) == set(wanted) and all(chosen[j] in wanted[j] for j in wanted)
    assert len(set(chosen.values())) == 3
    # the old per-slice draw asked up to 6 owners for the same slices
    per_slice = {j: random.Random(j).choice(o) for j, o in wanted.items()}
    assert len(set(per_slice.values())) == 6


def test_ties_are_drawn_so_askers_spread_over_a_slices_owners():
    wanted = {0: ["a", "b"], 1: ["a", "b"], 2: ["c", "d"]}
    picks = [cover(wanted, random.Random(seed)) for seed in range(200)]
    for p in picks:
        assert p[0] == p[1] and len(set(p.values())) == 2  # one holder for both slices it holds
    share_a = sum(p[0] == "a" for p in picks) / len(picks)
    assert 0.35 < share_a < 0.65


def test_the_holder_with_most_of_what_is_wanted_is_asked_first():
    wanted = {0: ["a", "x"], 1: ["b", "x"], 2: ["c", "x"], 3: ["d"]}
    chosen = cover(wanted, random.Random(0))
    assert chosen == {0: "x", 1: "x", 2: "x", 3: "d"}


def test_a_slice_nobody_holds_is_left_out():
    assert cover({0: [], 1: ["a"]}, random.Random(0)) == {1: "a"}
    assert cover({}, random.Random(0)) == {}


def test_every_two_owners_trade_in_one_stream_opened_by_one_of_them():
    """swap_partners: for every pair of owners exactly one opens the trade, each owner opens
    ⌊(m−1)/2⌋ or ⌈(m−1)/2⌉ of them, and an author that owns nothing trades with nobody."""
    for m in range(1, 10):
        peers = [f"p{i}" for i in range(m)] + ["serves-nothing"]
        owners = [[peers[j % m], peers[(j + 1) % m]] for j in range(2 * m)]
        plans = {p: slice_plan.swap_partners(owners, peers, p) for p in peers}
        assert plans["serves-nothing"] == ([], [])
        for p in peers[:m]:
            opens, awaits = plans[p]
            assert sorted(opens + awaits) == sorted(set(peers[:m]) - {p})  # every other owner, once
            assert len(opens) in ((m - 1) // 2, m // 2)
            assert all(p in plans[q][1] for q in opens) and all(p in plans[q][0] for q in awaits)  # both ends agree
