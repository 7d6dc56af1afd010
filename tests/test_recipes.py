"""Recipes by name (peer/run/recipes.py): what each sets, that flags still override, and that each
one runs in a real swarm (coordinator + peers as processes) ending every round on the coordinator's hash."""

from __future__ import annotations


import pytest
import torch

from optim.sparse_mean import SparseMean, sparse_mean
from peer.cli.main import build_parser
from peer.cli.run_flags import load_run_config
from peer.run.config import ConfigError
from peer.run.recipes import NAMES, RECIPES, recipe_overrides
from tests.helpers import read_summary, write_run_config


def loaded(argv: list[str], verb: str = "simulate"):
    return load_run_config(build_parser().parse_args([verb, *argv]))


def test_sparseloco_recipe_sets_the_tuned_settings_and_flags_override_it():
    cfg = loaded(["--recipe", "sparseloco"])
    assert cfg.compression.codec == "chunk-topk:4096:64+stat2"
    assert cfg.compression.error_feedback and cfg.compression.error_feedback_decay == 0.9
    assert (cfg.aggregation.name, cfg.aggregation.num_byzantine, cfg.outer.name, cfg.outer.lr, cfg.inner.steps) == (
        "sparse-trimmed-mean", 1, "fedavg", 2.0, 15)
    assert cfg.exchange.mode == "sliced" and cfg.exchange.result_codec == "chunk-topk:4096:192+stat2"
    cfg = loaded(["--recipe", "sparseloco", "--inner-steps", "30", "--aggregator", "centered-clip"])
    assert (cfg.inner.steps, cfg.aggregation.name, cfg.compression.codec) == (30, "centered-clip", "chunk-topk:4096:64+stat2")


def test_demo_recipe_and_plain_outer_demo_send_dct_signs_unless_a_codec_is_named(tmp_path):
    cfg = loaded(["--recipe", "demo"])
    assert (cfg.outer.name, cfg.compression.codec, cfg.compression.error_feedback) == ("demo", "dct-topk:64:4+sign", False)
    assert (cfg.outer.lr, cfg.inner.steps) == (2.5e-3, 5)
    assert loaded(["--outer", "demo"]).compression.codec == "dct-topk:64:4+sign"  # no longer dense fp16
    assert loaded(["--outer", "demo", "--codec", "dct-topk:64:8+int8"]).compression.codec == "dct-topk:64:8+int8"
    config = write_run_config(tmp_path / "run.json", outer={"name": "demo"})  # the file names the codec (fp16)
    assert loaded(["--config", str(config)]).compression.codec == "fp16"


@pytest.mark.parametrize("verb", ["coordinator", "demo", "simulate"])
def test_every_run_verb_takes_every_recipe(verb):
    for name in NAMES:
        cfg = loaded(["--recipe", name], verb)
        for path, value in RECIPES[name].overrides.items():
            section, field = path.split(".")
            assert getattr(getattr(cfg, section), field) == value, (name, path)
    with pytest.raises(SystemExit):
        build_parser().parse_args([verb, "--recipe", "nope"])
    with pytest.raises(ValueError, match="unknown recipe 'nope': choose one of diloco, sparseloco, demo"):
        recipe_overrides("nope")


def test_sparse_mean_averages_each_coordinate_over_the_peers_that_sent_it():
    rows = torch.tensor([[2.0, 0.0, 0.0, 1.0], [4.0, 3.0, 0.0, -1.0], [0.0, 0.0, 0.0, 3.0]])
    assert sparse_mean(rows).output.tolist() == [3.0, 3.0, 0.0, 1.0]  # the plain mean: [2, 1, 0, 1]
    rule = SparseMean()
    assert torch.equal(rule(rows[[2, 0, 1]]), rule(rows))  # row order changes no bit
    with pytest.raises(ValueError, match="not Byzantine-robust"):
        SparseMean(num_byzantine=1)
    with pytest.raises(ConfigError, match="not Byzantine-robust"):
        loaded(["--recipe", "sparseloco", "--aggregator", "sparse-mean", "--num-byzantine", "1"])
    assert loaded(["--recipe", "sparseloco", "--num-byzantine", "3"]).aggregation.num_byzantine == 3  # robust: f is taken


@pytest.mark.integration
@pytest.mark.parametrize("recipe", NAMES)
def test_each_recipe_runs_a_real_swarm_in_step_with_the_coordinator(swarm, tmp_path, recipe):
    config = write_run_config(tmp_path / "run.json", rounds={"rounds": 2, "expected_peers": 2})
    overrides = recipe_overrides(recipe)
    # the tiny config's inner steps, not the recipe's H (the flags come after the recipe)
    coordinator = swarm.start_coordinator(["--config", str(config), "--recipe", recipe, "--inner-steps", "4"])
    peers = [swarm.start_peer(f"peer{i}", ["--shard", f"{i}/2"]) for i in range(2)]
    assert swarm.wait(coordinator, 240) == 0
    for peer in peers:
        assert swarm.wait(peer, 60) == 0, "".join(peer.lines)[-2000:]
    status = read_summary(swarm, "coordinator")
    assert (status["codec"], status["outer"]) == (overrides["compression.codec"], overrides["outer.name"])
    history = status["history"]
    assert len(history) == 2 and all(h["updates"] == 2 for h in history), history
    for i in range(2):
        summary = read_summary(swarm, f"peer{i}")
        assert [h["in_sync"] for h in summary["history"]] == [True, True]
        assert summary["param_hash"] == history[-1]["param_hash"]
