"""Our llama model as Hugging Face files: model.safetensors + config.json (+ the tokenizer).

peer/learn/llama.py names its modules as transformers' LlamaForCausalLM does, so the state_dict
goes out unchanged (a tied head is written once, as the embedding, and config.json says so).
A byte-level run has no tokenizer file: its token ids are the bytes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
import torch.nn as nn

from peer.learn.llama import RMS_EPS, vocab_of
from peer.run.presets import ffn_width
from peer.run.config import RunConfig


class ExportError(ValueError):
    """The checkpoint cannot be exported as asked; the message says what to change."""


def hf_config(cfg: RunConfig) -> dict:
    m = cfg.model
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_of(m),
        "hidden_size": m.d_model,
        "intermediate_size": ffn_width(m.d_model, m.ffn_hidden),
        "num_hidden_layers": m.n_layer,
        "num_attention_heads": m.n_head,
        "num_key_value_heads": m.n_head,
        "head_dim": m.d_model // m.n_head,
        "max_position_embeddings": m.seq_len,
        "rms_norm_eps": RMS_EPS,
        "rope_theta": m.rope_theta,
        "rope_scaling": None,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": m.tie_embeddings,
        "initializer_range": 0.02,
        "torch_dtype": "float32",
        "bos_token_id": None,
        "eos_token_id": None,
    }


def export_model(model: nn.Module, cfg: RunConfig, out: str | Path, tokenizer_file: str | Path | None = None) -> Path:
    """Write `out`/model.safetensors and config.json (and tokenizer.json when given)."""
    from safetensors.torch import save_file

    if cfg.model.arch != "llama":
        raise ExportError("only llama models export to transformers (set model.preset, e.g. llama-20m); "
                          "the byte-level gpt has no transformers class")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {name: p.detach().to(torch.float32).contiguous().cpu() for name, p in model.named_parameters()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(hf_config(cfg), indent=2) + "\n")
    if tokenizer_file is not None:
        shutil.copyfile(tokenizer_file, out / "tokenizer.json")
        (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}) + "\n")
    return out
