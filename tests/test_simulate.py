"""swarmloco simulate: virtual peers running the real round math, DDP baseline, byte accounting."""

from __future__ import annotations

import json
import math

import pytest

from optim import codecs
from peer.run.config import RunConfig
from peer.cli.main import main
from peer.cli.simulate import SimulationOptions
from tests.helpers import simulate, tiny_simulation_config


def all_to_all_config() -> RunConfig:
    return tiny_simulation_config(exchange={"mode": "all-to-all"})


def test_sliced_byte_accounting_follows_the_owner_draw():
    from peer.run.round_math import RoundMath
    from peer.run.slice_plan import expected_traffic

    peers = 6
    sliced = simulate(peers=peers, rounds=1, codec="fp16", outer="nesterov")
    d = sliced["numel"]
    math = RoundMath(tiny_simulation_config(), d)
    payload = math.codec.max_encoded_size(d)
    assert payload == 4 * math.layout.num_slices + 2 * d  # fp16, slice by slice: a 4-byte codec header each
    x = sliced["config"]["exchange"]
    expected = expected_traffic(peers, payload, 2 * d, 2, spot_checks=x["spot_checks"], coverage=x["spot_check_coverage"],
                                num_slices=math.layout.num_slices)
    assert expected["received"] > expected_traffic(peers, payload, 2 * d, 2)["received"]  # the spot check is counted
    assert sliced["upload_bytes_per_peer_per_round"] == pytest.approx(expected["sent"], abs=1)
    assert sliced["bytes_per_peer_per_round"] == pytest.approx(expected["sent"] + expected["received"], abs=2)
    # bounded in n: about r payloads + one aggregate, where all-to-all downloads n - 1 payloads
    a2a = simulate(peers=peers, rounds=1, codec="fp16", outer="nesterov", config=all_to_all_config())
    assert sliced["bytes_per_peer_per_round"] < 0.85 * a2a["bytes_per_peer_per_round"]  # 4.8 vs 6 payloads at n = 6


def test_json_fields_and_byte_accounting_are_consistent():
    peers, rounds = 3, 2
    fp32 = simulate(peers=peers, rounds=rounds, codec="fp32", outer="nesterov", config=all_to_all_config())
    for key in (
        "initial_val_loss", "final_val_loss", "val_loss_per_round", "rounds", "bytes_per_peer_per_round",
        "upload_bytes_per_peer_per_round", "total_bytes", "ddp_equivalent_bytes", "wall_s", "config",
        "codec", "outer", "aggregator", "attack", "byzantine",
    ):
        assert key in fp32, key
    d = fp32["numel"]
    assert fp32["rounds"] == rounds and len(fp32["val_loss_per_round"]) == rounds
    assert fp32["final_val_loss"] == fp32["val_loss_per_round"][-1]
    assert fp32["config"]["compression"]["codec"] == "fp32" and fp32["config"]["inner"]["steps"] == 8
    # fp32 payload: 4-byte header + 4 bytes per value; each peer uploads 1 and downloads n-1 payloads.
    payload = 4 + 4 * d
    assert fp32["upload_bytes_per_peer_per_round"] == payload
    assert fp32["bytes_per_peer_per_round"] == peers * payload
    assert fp32["total_bytes"] == sum(fp32["bytes_per_round"]) == rounds * peers * peers * payload
    assert fp32["cumulative_bytes_per_round"][-1] == fp32["total_bytes"]
    # Ring all-reduce: per peer per step 2 * 2(n-1)/n * 4d bytes, for H steps, rounds, peers.
    assert fp32["ddp_equivalent_bytes"] == round(2 * 2 * (peers - 1) / peers * 4 * d) * 8 * rounds * peers

    fp16 = simulate(peers=peers, rounds=1, codec="fp16", outer="nesterov", config=all_to_all_config())
    assert fp16["upload_bytes_per_peer_per_round"] == 4 + 2 * d == (payload - 4) / 2 + 4
    int8 = simulate(peers=peers, rounds=1, codec="topk:0.05+int8", outer="nesterov", config=all_to_all_config())
    assert int8["upload_bytes_per_peer_per_round"] == codecs.build("topk:0.05+int8").max_encoded_size(d)


def test_diloco_and_ddp_val_loss_falls():
    diloco = simulate(peers=2, rounds=3, codec="fp16", outer="nesterov")
    ddp = simulate(peers=2, rounds=3, baseline="ddp")
    for result in (diloco, ddp):
        losses = [result["initial_val_loss"], *result["val_loss_per_round"]]
        assert all(math.isfinite(x) for x in losses)
        assert losses[-1] < losses[0] - 0.5, losses  # from ~ln 256 = 5.5 nats per byte
        assert losses[-1] < losses[1], losses
    assert ddp["codec"] == "fp32-allreduce" and ddp["total_bytes"] == ddp["ddp_equivalent_bytes"]
    assert ddp["ratio_vs_ddp"] == pytest.approx(1.0)
    assert diloco["ratio_vs_ddp"] > 1.0


def test_one_peer_fedavg_diloco_is_plain_training_like_ddp():
    """With one peer, FedAvg's outer step θ_{r+1} = θ_r − Δ = θ_local, lossless fp32: the same
    trajectory as one-peer data-parallel training (same batches, AdamW kept across rounds)."""
    diloco = simulate(peers=1, rounds=2, codec="fp32", outer="fedavg")
    ddp = simulate(peers=1, rounds=2, baseline="ddp")
    assert diloco["val_loss_per_round"] == pytest.approx(ddp["val_loss_per_round"], abs=1e-5)


def test_sign_flip_with_mean_hurts_versus_clean():
    clean = simulate(peers=3, rounds=2, codec="fp16", outer="nesterov", aggregator="mean")
    attacked = simulate(
        peers=3, rounds=2, codec="fp16", outer="nesterov", aggregator="mean",
        byzantine=1, attack="sign-flip", attack_options={"scale": 3.0},
    )
    assert attacked["attack"] == "sign-flip" and attacked["byzantine"] == 1
    # Mean of (2 honest Δ − 3 Δ_own) / 3 points backwards: the attacked run ends far above the clean one.
    assert attacked["final_val_loss"] > clean["final_val_loss"] + 0.3


def test_nan_attacker_is_excluded_and_training_stays_finite():
    result = simulate(peers=3, rounds=2, codec="fp16", outer="nesterov", byzantine=1, attack="nan", config=all_to_all_config())
    assert result["excluded_per_round"] == [{"0": "non-finite"}, {"0": "non-finite"}]
    assert all(math.isfinite(x) for x in result["val_loss_per_round"])
    assert result["final_val_loss"] < result["initial_val_loss"] - 0.5
    # The attacker's payload still crossed the wire: it is counted.
    assert result["upload_bytes_per_peer_per_round"] == 4 + 2 * result["numel"]


def spot_check_config(spot_checks: int) -> RunConfig:
    return tiny_simulation_config(exchange={"spot_checks": spot_checks})


def test_a_lone_lying_owner_is_caught_every_time_and_changes_no_honest_parameter():
    clean = simulate(peers=4, rounds=2, codec="fp16", outer="nesterov")
    lied = simulate(peers=4, rounds=2, codec="fp16", outer="nesterov", byzantine=1, attack="lying-owner")
    lies = lied["lying_owner"]
    # Peer 0 owns about S·r/n = 16 of the 32 slices each round and lies on every one; its co-owner is
    # honest on each, so the gatherer recomputes them all and names peer 0 every round.
    assert [x["told"] for x in lies["rounds"]] == [16, 16] and lies["caught"] == lies["told"] == 32
    assert lies["slices_with_only_liars"] == 0 and [x["named"] for x in lies["rounds"]] == [[0], [0]]
    assert lied["final_params_sha256"] == clean["final_params_sha256"]  # bit for bit
    assert lied["val_loss_per_round"] == clean["val_loss_per_round"]
    assert clean["lying_owner"] is None


def test_colluding_owners_agree_on_a_lie_that_only_spot_checks_catch():
    """3 peers, 2 liars, r = 2: every round a third of the slices are owned by the two liars only
    (the owner draw pairs slots 2j, 2j+1 of a permutation of 3). Without spot checks their agreed
    lie is taken (shifting θ); checking every slice the honest gatherer does not own catches all."""
    clean = simulate(peers=3, rounds=2, codec="fp16", outer="nesterov")
    blind = simulate(peers=3, rounds=2, codec="fp16", outer="nesterov", byzantine=2, attack="lying-owner",
                     config=spot_check_config(0))
    lies = blind["lying_owner"]
    assert all(x["slices_with_only_liars"] >= 8 for x in lies["rounds"]), lies["rounds"]  # ~32/3
    # Lies beside an honest co-owner are caught; both lies on a liar-only slice pass.
    assert lies["uncaught"] == lies["told"] - lies["caught"] == 2 * lies["slices_with_only_liars"]
    assert all(x["named"] == [0, 1] for x in lies["rounds"])
    assert blind["val_loss_per_round"] != clean["val_loss_per_round"]
    assert blind["final_params_sha256"] != clean["final_params_sha256"]

    checked = simulate(peers=3, rounds=2, codec="fp16", outer="nesterov", byzantine=2, attack="lying-owner",
                       config=spot_check_config(32))
    lies = checked["lying_owner"]
    # the owner draw hashes the payloads: round 0 matches the blind run's, later rounds follow their own θ
    assert lies["rounds"][0]["told"] == blind["lying_owner"]["rounds"][0]["told"]
    assert lies["caught"] == lies["told"] and lies["uncaught"] == 0
    assert [x["spot_checked"] for x in lies["rounds"]] == [x["slices_with_only_liars"] for x in lies["rounds"]]
    assert checked["final_params_sha256"] == clean["final_params_sha256"]


def test_lying_owner_needs_the_sliced_exchange_and_takes_no_options():
    with pytest.raises(ValueError, match="only the sliced exchange has"):
        SimulationOptions(config=all_to_all_config(), byzantine=1, attack="lying-owner").run_config()
    with pytest.raises(ValueError, match="takes no options"):
        SimulationOptions(config=tiny_simulation_config(), byzantine=1, attack="lying-owner", attack_options={"scale": 2})
    # Lying owners send honest updates: the rule is not asked to tolerate them.
    cfg = SimulationOptions(config=tiny_simulation_config(), peers=3, byzantine=2, attack="lying-owner").run_config()
    assert cfg.aggregation.num_byzantine == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"peers": 0}, "--peers 0"),
        ({"byzantine": 4, "attack": "nan"}, "at least one honest peer"),
        ({"byzantine": 1}, "need --attack"),
        ({"attack": "nan"}, "needs --num-byzantine"),
        ({"byzantine": 1, "attack": "sign-flop"}, "unknown attack"),
        ({"baseline": "ddp", "byzantine": 1, "attack": "nan"}, "no aggregation"),
    ],
)
def test_bad_options_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SimulationOptions(config=tiny_simulation_config(), **kwargs).run_config()


def run_cli(argv: list[str]) -> int:
    return main(["simulate", *argv])


def test_cli_bad_flags_print_advice_and_return_2(capsys):
    assert run_cli(["--codec", "topk:2"]) == 2
    assert "FRACTION must be in (0, 1]" in capsys.readouterr().err
    assert run_cli(["--aggregator", "krum", "--peers", "3", "--num-byzantine", "1", "--attack", "nan"]) == 2
    assert "needs at least 5 peers" in capsys.readouterr().err
    assert run_cli(["--attack-option", "scale"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err


def test_cli_writes_json(tmp_path, capsys):
    config = tmp_path / "run.toml"
    config.write_text(
        'seed = 3\n[model]\nseq_len = 32\nd_model = 32\nn_layer = 1\nn_head = 2\n'
        "[data]\nbatch_size = 4\nval_batches = 2\nmax_corpus_bytes = 300000\n"
    )
    out = tmp_path / "result.json"
    argv = ["--config", str(config), "--peers", "3", "--rounds", "1", "--inner-steps", "2", "--codec", "int8",
            "--outer", "nesterov", "--aggregator", "mean", "--run-seed", "5", "--num-byzantine", "1", "--attack", "nan",
            "--threads", "1", "--json", str(out)]
    assert run_cli(argv) == 0
    printed = capsys.readouterr().out
    assert "round   1/1 | val" in printed and "done in" in printed
    result = json.loads(out.read_text())
    assert result["codec"] == "int8" and result["inner_steps"] == 2 and result["peers"] == 3 and result["seed"] == 5
    assert result["config"]["model"]["d_model"] == 32
    # --num-byzantine with --attack: the first F peers attack, and the aggregator tolerates F.
    assert result["byzantine"] == 1 and result["config"]["aggregation"]["num_byzantine"] == 1
    assert [list(excluded) for excluded in result["excluded_per_round"]] == [["0"]]  # int8 cannot encode NaN
