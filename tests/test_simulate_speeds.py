"""simulate --peer-speeds: the steps a speed fits in a window, the simulated clock, and the swarm's
work weights (peer/cli/simulate_speeds.py over peer/run/work_math.py)."""

from __future__ import annotations

import pytest

from peer.cli.simulate_options import SimulationOptions
from peer.cli.simulate_speeds import parse_speeds, round_steps
from peer.run.config import RunConfig
from tests.helpers import simulate, tiny_simulation_config

H = 4


def config(**sections) -> RunConfig:
    data = tiny_simulation_config().to_dict()
    for section, values in sections.items():
        data[section].update(values)
    return RunConfig.from_dict(data)


def test_a_window_gives_each_peer_the_steps_its_speed_fits():
    fixed = config(inner={"steps": H})
    assert round_steps(fixed, (1.0, 0.5, 0.25)) == [H, H, H]
    window = config(rounds={"window_s": 10.0, "min_steps": 2, "max_steps": 8})
    # ceil(10 x s), at least 2, at most 8
    assert round_steps(window, (1.0, 0.5, 0.3, 0.1)) == [8, 5, 3, 2]


def test_bad_speeds_are_refused_with_what_to_give():
    with pytest.raises(ValueError, match="one number per peer"):
        parse_speeds("1,fast")
    with pytest.raises(ValueError, match="3 speeds for --peers 4"):
        SimulationOptions(peers=4, peer_speeds=(1.0, 1.0, 0.5))
    with pytest.raises(ValueError, match="positive number"):
        SimulationOptions(peers=2, peer_speeds=(1.0, 0.0))
    with pytest.raises(ValueError, match="do not take weights"):
        SimulationOptions(peers=2, baseline="ddp", config=config(rounds={"window_s": 2.0})).run_config()


def test_fixed_h_waits_for_the_slowest_and_the_window_counts_each_peers_work():
    speeds = (1.0, 1.0, 0.5)
    fixed = simulate(peers=3, rounds=2, peer_speeds=speeds, config=config(inner={"steps": H}))
    work = fixed["work"]
    assert work["simulated_seconds"] == 2 * H / 0.5 and work["utilization"] == [0.5, 0.5, 1.0]
    assert work["counted_share"] == pytest.approx([1 / 3] * 3)  # every update counts the same
    window = simulate(peers=3, rounds=2, peer_speeds=speeds, config=config(rounds={"window_s": float(H)}))
    work = window["work"]
    assert [r["steps"] for r in work["rounds"]] == [[H, H, H // 2]] * 2
    assert work["simulated_seconds"] == 2 * H and work["utilization"] == [1.0, 1.0, 1.0]
    assert work["counted_share"] == pytest.approx([0.4, 0.4, 0.2]) == work["compute_share"]
    assert window["final_params_sha256"] != fixed["final_params_sha256"]


def test_a_window_where_every_peer_does_the_same_work_is_the_fixed_h_run_bit_for_bit():
    fixed = simulate(peers=3, rounds=2, config=config(inner={"steps": H}))
    window = simulate(peers=3, rounds=2, config=config(inner={"steps": H}, rounds={"window_s": float(H)}))
    assert [r["steps"] for r in window["work"]["rounds"]] == [[H] * 3] * 2
    assert window["final_params_sha256"] == fixed["final_params_sha256"]  # equal weights: the unweighted rule


def test_an_attacker_claiming_4x_its_work_is_capped_at_twice_the_median_claim():
    window = config(rounds={"window_s": float(H)}, aggregation={"name": "median", "num_byzantine": 1})
    run = simulate(peers=4, rounds=2, byzantine=1, attack="gaussian", claim_work=4.0, config=window)
    work = run["work"]
    assert [r["steps"] for r in work["rounds"]] == [[H] * 4] * 2  # what was trained: the claim is not
    # claims 4H, H, H, H: the median claim is H, so the attacker counts 2H, then the minority cap
    # (f = 1 row holds at most 30%) cuts it to c with c = 0.3 (c + 3H): 9H/7 of 30H/7 in every round
    assert [r["weights"] for r in work["rounds"]] == [pytest.approx([0.3, 7 / 30, 7 / 30, 7 / 30], abs=1e-6)] * 2
    assert work["token_share"] == pytest.approx([0.25] * 4)
    with pytest.raises(ValueError, match="give --attack and --num-byzantine"):
        SimulationOptions(peers=4, claim_work=4.0)
    with pytest.raises(ValueError, match="a number > 0"):
        SimulationOptions(peers=4, byzantine=1, attack="gaussian", claim_work=float("nan"))


def test_an_attacker_crafts_its_row_where_a_per_work_rule_looks_and_scales_it_by_its_claim():
    # ipm: -eps x the honest mean. The median sees rows per unit of claimed work, so the attacker
    # takes the honest rows per step, and pre-multiplies its row by its claimed steps: once the
    # owners divide by that claim it is exactly the crafted row (the rescaling buys the defence nothing).
    import torch

    from optim import attacks
    from peer.cli.simulate import VirtualPeer, _craft_attacks

    opts = SimulationOptions(peers=3, byzantine=1, attack="ipm", claim_work=4.0)
    peers = [VirtualPeer(i, None, None, None) for i in range(3)]  # type: ignore[arg-type]
    deltas = [torch.full((5,), 9.0), torch.full((5,), 8.0), torch.full((5,), 2.0)]  # real steps 8, 4, 1
    sent = _craft_attacks(opts, attacks.build("ipm"), peers, deltas, 0, 0, ([8, 4, 1], [32, 4, 1]))
    eps = attacks.build("ipm").options["eps"]
    assert torch.allclose(sent[0], torch.full((5,), -eps * (8 / 4 + 2 / 1) / 2 * 32))
    assert sent[1] is deltas[1] and sent[2] is deltas[2]
    raw = _craft_attacks(opts, attacks.build("ipm"), peers, deltas, 0, 0)  # a rule on raw rows
    assert torch.allclose(raw[0], torch.full((5,), -eps * 5.0))
