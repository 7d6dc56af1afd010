"""A peer's --resume state written beside the next inner phase: what is written is the state at the
moment of the call, whatever training does to the live tensors before the writer gets to it."""

import threading
from concurrent.futures import ThreadPoolExecutor

import torch

from peer.learn.data import ShardSampler
from peer.learn.model import build_model, flat_params
from peer.learn.training import InnerTrainer
from peer.node.local_state import load_local_state, save_local_state
from peer.run import checkpoint
from peer.run.config import InnerConfig, ModelConfig, RunConfig
from peer.run.round_math import RoundMath

TINY = ModelConfig(seq_len=16, d_model=32, n_layer=1, n_head=2)
TEXT = torch.frombuffer(bytearray(b"the quick brown fox jumps over the lazy dog. " * 60), dtype=torch.uint8)


def _trainer(seed: int = 0) -> InnerTrainer:
    return InnerTrainer(build_model(TINY, seed=seed), InnerConfig(warmup_steps=2),
                        ShardSampler(TEXT, shard=0, num_shards=1, batch_size=8, seq_len=16, seed=0))


def test_snapshot_clones_tensors_and_keeps_the_tree():
    live = {"m": torch.arange(4.0), "groups": [{"betas": (0.9, 0.95), "params": [0, 1]}], "step": torch.tensor(3.0), "n": 7}
    copied = checkpoint.snapshot(live)
    live["m"].add_(10)
    live["step"].fill_(99)
    live["groups"][0]["params"].append(2)
    assert torch.equal(copied["m"], torch.arange(4.0)) and copied["step"].item() == 3.0
    assert copied["groups"] == [{"betas": (0.9, 0.95), "params": [0, 1]}]
    assert isinstance(copied["groups"][0]["betas"], tuple) and copied["n"] == 7


def test_a_write_beside_training_holds_the_state_of_the_call(tmp_path):
    cfg = RunConfig()
    trainer = _trainer()
    trainer.run(3)
    params = flat_params(trainer.model).clone()
    math = RoundMath(cfg, params.numel())
    math.encode(torch.randn(params.numel()), 0)  # error feedback now holds a residual
    expected_params = params.clone()
    expected_math = checkpoint.snapshot(math.local_state_dict())
    expected_trainer = checkpoint.snapshot(trainer.optimizer.state_dict()["state"])
    assert expected_math["error_feedback"] is not None

    gate = threading.Event()
    with ThreadPoolExecutor(max_workers=1) as writer:
        writer.submit(gate.wait)  # the writer is busy: the save runs only after training went on
        path = tmp_path / "state.ckpt"
        save_local_state(path, round_=1, params=params, param_hash="h", config_hash=cfg.config_hash(),
                         trainer=trainer, math=math, writer=writer)
        trainer.run(2)  # AdamW's moments and the step change in place
        params.add_(1.0)
        math.encode(torch.randn(params.numel()), 1)
        gate.set()
    saved = checkpoint.load(path)
    assert saved.round == 1 and torch.equal(saved.params, expected_params)
    for index, moments in expected_trainer.items():
        for name, value in moments.items():
            assert torch.equal(saved.local_state["trainer"]["optimizer"]["state"][index][name], value), (index, name)
    assert saved.local_state["trainer"]["step"] == 3

    resumed, resumed_math = _trainer(seed=5), RoundMath(cfg, params.numel())
    assert load_local_state(path, config_hash=cfg.config_hash(), trainer=resumed, math=resumed_math) is not None
    assert resumed.step == 3
    for key, value in expected_math["error_feedback"].items():
        got = resumed_math.local_state_dict()["error_feedback"][key]
        assert torch.equal(got, value) if isinstance(value, torch.Tensor) else got == value, key
