"""Llama-style presets: exact parameter counts and shapes for every preset (built on the meta
device: no memory), a tiny llama that trains, tied embeddings, and the CUDA-minded inner loop
(gradient accumulation, bf16 autocast, loss read only when logging) exercised on CPU."""

from __future__ import annotations

import pytest
import torch

from peer.learn.llama import LlamaLM, build_llama
from peer.learn.model import build_model, flat_params, layout_hash, num_params
from peer.run.presets import PRESETS, count_params, describe
from peer.learn.training import InnerTrainer
from peer.run.config import ConfigError, InnerConfig, ModelConfig, RunConfig
from tests.helpers import FixedSampler, token_batch


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: threads only fight over the cores


def tiny_llama(**over) -> ModelConfig:
    values = dict(arch="llama", d_model=32, n_layer=2, n_head=4, seq_len=16, vocab_size=256)
    values.update(over)
    return ModelConfig(**values)


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_has_its_counted_parameters_and_shapes(name):
    cfg = RunConfig.from_dict({"model": {"preset": name, "seq_len": 64}, "data": {"tokenizer": "bpe"}})
    with torch.device("meta"):
        model = LlamaLM(cfg.model)
        logits, loss = model(torch.zeros(2, 64, dtype=torch.long), torch.zeros(2, 64, dtype=torch.long))
    p = PRESETS[name]
    expected = count_params(d_model=p.d_model, n_layer=p.n_layer, ffn_hidden=p.ffn_hidden, vocab_size=8192, tie_embeddings=False)
    assert num_params(model) == expected
    assert logits.shape == (2, 64, 8192) and loss.shape == ()
    nominal = float(name.split("-")[1].rstrip("mb")) * (1e9 if name.endswith("b") else 1e6)
    assert 0.7 * nominal <= expected <= 1.1 * nominal, (name, expected)  # the name tells the size
    assert f"{expected / 1e6:.1f}M" in describe(name)


def test_preset_overrides_dimensions_and_unknown_preset_is_refused():
    cfg = ModelConfig(preset="llama-20m", d_model=64)
    assert (cfg.arch, cfg.d_model, cfg.n_layer) == ("llama", 384, 8)
    with pytest.raises(ConfigError, match="llama-20m"):
        ModelConfig(preset="llama-7b")


def test_tokenizer_and_vocab_rules():
    assert RunConfig().model.vocab_size == 256
    assert RunConfig.from_dict({"model": {"preset": "llama-20m"}, "data": {"tokenizer": "bpe"}}).model.vocab_size == 8192
    with pytest.raises(ConfigError, match="llama"):
        RunConfig.from_dict({"data": {"tokenizer": "bpe"}})
    with pytest.raises(ConfigError, match="bpe"):
        RunConfig.from_dict({"model": {"arch": "llama", "vocab_size": 1000}})


def test_build_is_deterministic_per_seed_and_tied_head_is_one_matrix():
    a, b, c = build_model(tiny_llama(), 0), build_model(tiny_llama(), 0), build_model(tiny_llama(), 1)
    assert torch.equal(flat_params(a), flat_params(b)) and not torch.equal(flat_params(a), flat_params(c))
    tied = build_llama(tiny_llama(tie_embeddings=True), 0)
    assert num_params(a) - num_params(tied) == 256 * 32
    assert tied.lm_head.weight is tied.model.embed_tokens.weight
    assert layout_hash(a) != layout_hash(tied)
    assert num_params(a) == count_params(d_model=32, n_layer=2, ffn_hidden=0, vocab_size=256, tie_embeddings=False)


def test_tiny_llama_learns_a_repeated_batch():
    model = build_model(tiny_llama(), 0)
    trainer = InnerTrainer(model, InnerConfig(lr=3e-3, warmup_steps=0), FixedSampler(*token_batch()))
    stats = trainer.run(30)
    assert stats.last_loss < stats.mean_loss < 5.6  # ln 256 = 5.55 at the start


def test_gradient_accumulation_equals_the_full_batch():
    x, y = token_batch()
    runs = []
    for micro in (0, 2):
        model = build_model(tiny_llama(), 0)
        InnerTrainer(model, InnerConfig(micro_batch_size=micro, warmup_steps=0), FixedSampler(x, y)).run(3)
        runs.append(flat_params(model))
    assert torch.allclose(runs[0], runs[1], atol=1e-6), (runs[0] - runs[1]).abs().max()


def test_bf16_autocast_trains_on_cpu_and_loss_is_read_only_when_logging():
    model = build_model(tiny_llama(), 0)
    trainer = InnerTrainer(model, InnerConfig(precision="bf16", warmup_steps=0, lr=3e-3), FixedSampler(*token_batch()))
    assert trainer.autocast_dtype == torch.bfloat16 and trainer.mfu(1e6) is None  # no peak FLOP/s known for a CPU
    seen = []
    stats = trainer.run(7, lambda step, loss: seen.append((step, loss)), log_every=3)
    assert [s for s, _ in seen] == [3, 6, 7]
    assert seen[-1][1] == pytest.approx(stats.last_loss) and stats.last_loss < 5.6
    assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights stay fp32
