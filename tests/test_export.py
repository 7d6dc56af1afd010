"""`swarmloco export`: a trained llama checkpoint loads in transformers as LlamaForCausalLM with
logits within 1e-4 of ours (tied and untied, BPE tokenizer included); every preset's config.json
builds a transformers model with our exact parameter names and shapes (on the meta device);
`swarmloco sample` continues a prompt."""

from __future__ import annotations

import json

import pytest
import torch

from peer.cli.main import main
from peer.learn.hf_checkpoint import ExportError, export_model, hf_config
from peer.learn.llama import LlamaLM
from peer.learn.model import build_model, flat_params, param_hash
from peer.run.presets import PRESETS
from peer.learn.training import InnerTrainer
from peer.run import checkpoint
from peer.run.config import RunConfig
from tests.helpers import FixedSampler, bpe_config, text_folder, token_batch

import transformers  # noqa: E402  (the test extra: pip install -e .[dev])


pytestmark = pytest.mark.usefixtures("one_torch_thread", "own_cache")


def trained_checkpoint(tmp_path, cfg: RunConfig):
    """A few AdamW steps on a llama, saved as a swarmloco checkpoint with run.json beside it."""
    model = build_model(cfg.model, cfg.seed)
    x, y = token_batch(rows=4, T=cfg.model.seq_len)
    InnerTrainer(model, cfg.inner, FixedSampler(x % cfg.model.vocab_size, y % cfg.model.vocab_size)).run(3)
    params = flat_params(model)
    path = tmp_path / "run.ckpt"
    checkpoint.save(path, checkpoint.Checkpoint(round=3, params=params, param_hash=param_hash(params), config_hash=cfg.config_hash()))
    (tmp_path / "run.json").write_text(cfg.to_json())
    return path, model


@pytest.mark.parametrize("tied", [False, True])
def test_export_round_trip_logits_match_transformers(tmp_path, tied):
    from peer.learn.data import with_tokenizer_hash

    cfg = with_tokenizer_hash(bpe_config(text_folder(tmp_path / "text", 0), model={
        "arch": "llama", "d_model": 48, "n_layer": 2, "n_head": 4, "seq_len": 32, "vocab_size": 0, "tie_embeddings": tied}))
    path, model = trained_checkpoint(tmp_path, cfg)
    assert main(["export", "--checkpoint", str(path), "--out", str(tmp_path / "hf")]) == 0
    hf = transformers.LlamaForCausalLM.from_pretrained(str(tmp_path / "hf"))
    tokens = torch.randint(0, cfg.model.vocab_size, (2, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = model(tokens)[0], hf(tokens).logits
    assert (ours - theirs).abs().max().item() < 1e-4
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["tie_word_embeddings"] is tied
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "hf" / "tokenizer.json"))
    from peer.cli.checkpoint_model import tokenizer_of

    text = "def export(self):\n    return 1\n"
    assert tokenizer(text)["input_ids"] == tokenizer_of(cfg).encode(text)


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_exports_to_a_transformers_model_of_the_same_shapes(name):
    cfg = RunConfig.from_dict({"model": {"preset": name}, "data": {"tokenizer": "bpe"}})
    config = transformers.LlamaConfig(**{k: v for k, v in hf_config(cfg).items() if k != "architectures"})
    with torch.device("meta"):
        theirs = transformers.LlamaForCausalLM(config)
        ours = LlamaLM(cfg.model)
    assert {n: p.shape for n, p in ours.named_parameters()} == {n: p.shape for n, p in theirs.named_parameters()}


def test_byte_gpt_is_refused_with_what_to_do(tmp_path):
    with pytest.raises(ExportError, match="preset"):
        export_model(build_model(RunConfig().model, 0), RunConfig(), tmp_path)


def test_sample_continues_the_prompt_and_a_wrong_config_is_refused(tmp_path, capsys):
    cfg = RunConfig.from_dict({"model": {"arch": "llama", "d_model": 32, "n_layer": 1, "n_head": 2, "seq_len": 32}})
    path, _ = trained_checkpoint(tmp_path, cfg)
    argv = ["sample", "--checkpoint", str(path), "--prompt", "def ", "--max-tokens", "12", "--temperature", "0"]
    assert main(argv) == 0 and main(argv) == 0
    out = capsys.readouterr().out
    first, second = out[: len(out) // 2], out[len(out) // 2 :]
    assert first == second and first.startswith("def ") and len(first) > len("def \n")  # greedy: the same text twice
    other = tmp_path / "other.json"
    other.write_text(RunConfig.from_dict({**cfg.to_dict(), "model": {**cfg.to_dict()["model"], "n_layer": 2}}).to_json())
    assert main(["sample", "--checkpoint", str(path), "--config", str(other)]) == 2
    assert "parameters" in capsys.readouterr().err
