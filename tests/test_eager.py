"""Eager updates for overlapped rounds (optim/eager.py), in simulate and in the real node's schedule."""

from __future__ import annotations

import torch

from optim import eager, outer
from tests.helpers import simulate, tiny_simulation_config


def test_the_estimate_swaps_this_peers_stale_share_for_its_fresh_one():
    last, previous, own = torch.tensor([4.0, 0.0]), torch.tensor([8.0, 2.0]), torch.tensor([0.0, 6.0])
    # the others' shares of the last average of 4 peers, plus our fresh share
    assert eager.estimate(own, last_average=last, own_previous=previous, peers=4).tolist() == [2.0, 1.0]
    assert eager.estimate(own, last_average=None, own_previous=None, peers=0).tolist() == [0.0, 6.0]
    assert eager.estimate(own, last_average=last, own_previous=None, peers=4).tolist() == [3.0, 1.5]
    # the default estimate: this peer's fresh Δ stands in for the whole average
    assert eager.estimate(own, last_average=last, own_previous=previous, peers=4, mode="own").tolist() == [0.0, 6.0]


def test_the_start_point_is_a_step_on_a_copy_of_the_outer_state():
    opt = outer.build("nesterov", lr=0.7, momentum=0.9)
    opt.step(torch.zeros(3), torch.ones(3))  # momentum buffer = 1
    params, guess = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 0.0, -1.0])
    point = eager.start_point(opt, params, guess)
    buf = 0.9 * 1.0 + guess  # the step the real state would take
    assert torch.allclose(point, params - 0.7 * (guess + 0.9 * buf))
    assert opt.momentum_buffer.tolist() == [1.0, 1.0, 1.0] and params.tolist() == [1.0, 2.0, 3.0]  # untouched


def _overlapped(peers: int, eager_updates: bool, estimate: str = "own", **kw) -> dict:
    cfg = tiny_simulation_config(exchange={"mode": "all-to-all"}, rounds={"rounds": 3, "overlap_communication": True,
                                                                          "eager_updates": eager_updates, "eager_estimate": estimate})
    return simulate(peers=peers, codec="fp32", outer="nesterov", aggregator="mean", config=cfg, **kw)


def test_with_one_peer_eager_overlap_is_the_synchronous_run_bit_for_bit():
    # One peer: its own Δ IS the average, so the eager start point is exactly θ_{r+1}.
    sync = simulate(peers=1, rounds=3, codec="fp32", outer="nesterov", aggregator="mean",
                    config=tiny_simulation_config(exchange={"mode": "all-to-all"}))
    assert _overlapped(1, True)["final_params_sha256"] == sync["final_params_sha256"]
    assert _overlapped(1, True, "share")["final_params_sha256"] == sync["final_params_sha256"]
    delayed = _overlapped(1, False)  # starts from the local model: not the same trajectory
    assert delayed["final_params_sha256"] != sync["final_params_sha256"]


def test_with_several_peers_eager_and_delayed_starts_differ_and_both_learn():
    runs = [_overlapped(3, True), _overlapped(3, False)]
    assert runs[0]["final_params_sha256"] != runs[1]["final_params_sha256"]
    for run in runs:
        assert run["final_val_loss"] < run["initial_val_loss"] - 0.05


def test_the_fit_estimate_shrinks_the_own_delta_by_how_much_of_it_the_last_average_kept():
    own_previous, last = torch.tensor([2.0, 0.0]), torch.tensor([1.0, 3.0])  # <prev, last> / |prev|² = 2/4
    assert eager.shrinkage(last, own_previous) == 0.5
    own = torch.tensor([4.0, -2.0])
    assert eager.estimate(own, last_average=last, own_previous=own_previous, peers=4, mode="fit").tolist() == [2.0, -1.0]
    assert eager.shrinkage(None, None) == 1.0  # nothing known yet: the own Δ whole
    assert eager.shrinkage(-last, own_previous) == 0.0  # an average against us: clamped, no step back
    assert eager.shrinkage(10 * last, own_previous) == 1.0  # never more than the own Δ


def test_an_average_landing_at_the_phase_start_is_the_synchronous_run_and_later_ones_differ():
    # --overlap-arrival 0: the peer moves onto θ_{r+1} before its first inner step, which is what
    # the synchronous schedule does; the progress of a later arrival moves over mid-phase.
    sync = simulate(peers=3, rounds=3, codec="fp32", outer="nesterov", aggregator="mean",
                    config=tiny_simulation_config(exchange={"mode": "all-to-all"}))
    at_start = _overlapped(3, True, overlap_arrival=0.0)
    assert at_start["final_params_sha256"] == sync["final_params_sha256"]
    assert at_start["overlap_arrival"] == 0.0 and sync["overlap_arrival"] is None
    halfway, at_end = _overlapped(3, True, overlap_arrival=0.5), _overlapped(3, True)
    assert len({halfway["final_params_sha256"], at_end["final_params_sha256"], sync["final_params_sha256"]}) == 3
    assert halfway["final_val_loss"] < halfway["initial_val_loss"] - 0.05


def test_the_drift_estimates_of_all_peers_average_to_the_true_average():
    # Each peer's own Δ less its drift from the last average: the peers' estimates sum to n·mean,
    # so the start points' errors cancel in the average; each one errs by its change of drift only.
    torch.manual_seed(0)
    previous, fresh = torch.randn(4, 6), torch.randn(4, 6)  # (peers, d) last round's and this round's Δs
    last = previous.mean(dim=0)
    guesses = torch.stack([eager.estimate(fresh[i], last_average=last, own_previous=previous[i], peers=4, mode="drift")
                           for i in range(4)])
    assert torch.allclose(guesses.mean(dim=0), fresh.mean(dim=0), atol=1e-6)
    assert torch.allclose(guesses[1], fresh[1] - previous[1] + last)
    # a drift that persists (the same offset in both rounds) is removed exactly
    offset = torch.randn(4, 6)
    steady = torch.stack([eager.estimate(fresh.mean(0) + offset[i], last_average=last, own_previous=last + offset[i],
                                         peers=4, mode="drift") for i in range(4)])
    assert torch.allclose(steady, fresh.mean(0).expand(4, 6), atol=1e-6)
    assert eager.estimate(fresh[0], last_average=None, own_previous=None, peers=0, mode="drift").equal(fresh[0])
