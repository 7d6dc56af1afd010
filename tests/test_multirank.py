"""A peer of 2 gloo ranks (torchrun): its pseudo-gradient equals one process's on the same global
batch, and in a real swarm it ends every round on the coordinator's hash."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from peer.learn.data import ShardSampler, load_corpus
from peer.learn.model import build_model, flat_params
from peer.learn.training import InnerTrainer
from peer.node.ranks import _without_nproc
from tests.helpers import ROOT, read_summary, tiny_run_config

RANKED = {"inner": {"steps": 6, "warmup_steps": 2}, "data": {"batch_size": 4}}


def test_two_ranks_send_the_pseudo_gradient_of_one_process(tmp_path):
    cfg = tiny_run_config(**RANKED)
    (tmp_path / "run.json").write_text(cfg.to_json())
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(ROOT / "tests" / "multirank_worker.py"), str(tmp_path / "run.json"), str(tmp_path / "ranked.pt")],
                          timeout=240, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    torch.set_num_threads(1)
    model = build_model(cfg.model, cfg.seed)
    theta = flat_params(model)
    corpus = load_corpus(cfg.data, seq_len=cfg.model.seq_len)
    sampler = ShardSampler(corpus.train, shard=0, num_shards=2, batch_size=4, seq_len=cfg.model.seq_len, seed=cfg.seed)
    InnerTrainer(model, cfg.inner, sampler).run(cfg.inner.steps)
    one, ranked = theta - flat_params(model), theta - torch.load(tmp_path / "ranked.pt")  # pseudo-gradients
    assert one.norm() > 1e-3  # they trained
    assert torch.allclose(ranked, one, atol=2e-6, rtol=1e-4), (ranked - one).abs().max()


def test_nproc_flag_is_stripped_for_torchrun():
    assert _without_nproc(["peer", "--nproc", "2", "--threads", "1", "--nproc=3"]) == ["peer", "--threads", "1"]


@pytest.mark.integration
def test_a_two_rank_peer_ends_every_round_on_the_coordinators_hash(swarm, tmp_path):
    config = tmp_path / "run.json"
    # min_peers 2: a round waits for both (a two-rank peer on a loaded machine trains slower than the deadline)
    config.write_text(tiny_run_config(**RANKED, rounds={"rounds": 2, "expected_peers": 2, "min_peers": 2}).to_json())
    coordinator = swarm.start_coordinator(["--config", str(config)])
    ranked = swarm.start_peer("ranked", ["--nproc", "2", "--shard", "0/2"])
    single = swarm.start_peer("single", ["--shard", "1/2"])
    assert swarm.wait(coordinator, 300) == 0
    for peer in (ranked, single):
        assert swarm.wait(peer, 60) == 0, "".join(peer.lines)[-3000:]
    final = read_summary(swarm, "coordinator")
    for name in ("ranked", "single"):
        summary = read_summary(swarm, name)
        assert len(summary["history"]) == 2 and all(h["in_sync"] for h in summary["history"])
        assert summary["param_hash"] == final["param_hash"]
