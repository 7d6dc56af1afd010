"""Named Llama-style sizes for `[model] preset = "..."`: dimensions only, no torch.

Names give the parameter count at the BPE default vocabulary (8192 tokens, untied embeddings);
another vocab_size or tie_embeddings changes it by vocab_size * d_model. `count_params` is the
exact count of peer/learn/llama.py's model for a config (tests check it against the module).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from peer.run.config_errors import ConfigError


@dataclass(frozen=True, slots=True)
class Preset:
    d_model: int
    n_layer: int
    n_head: int
    ffn_hidden: int


PRESETS: dict[str, Preset] = {
    "llama-20m": Preset(d_model=384, n_layer=8, n_head=6, ffn_hidden=1024),
    "llama-60m": Preset(d_model=512, n_layer=16, n_head=8, ffn_hidden=1408),
    "llama-150m": Preset(d_model=768, n_layer=20, n_head=12, ffn_hidden=2048),
    "llama-400m": Preset(d_model=1024, n_layer=30, n_head=16, ffn_hidden=2816),
    "llama-1b": Preset(d_model=2048, n_layer=18, n_head=16, ffn_hidden=5632),
}


def apply_preset(model_cfg: Any) -> None:
    """Write a preset's dimensions into a ModelConfig (in place) and make it a llama."""
    preset = PRESETS.get(model_cfg.preset)
    if preset is None:
        raise ConfigError(f"model.preset={model_cfg.preset!r}: choose one of {', '.join(PRESETS)}")
    model_cfg.arch = "llama"
    model_cfg.d_model, model_cfg.n_layer = preset.d_model, preset.n_layer
    model_cfg.n_head, model_cfg.ffn_hidden = preset.n_head, preset.ffn_hidden


def ffn_width(d_model: int, ffn_hidden: int) -> int:
    """SwiGLU hidden width: ffn_hidden, or 8/3 d_model rounded up to a multiple of 64."""
    return ffn_hidden or 64 * -(-(8 * d_model) // (3 * 64))


def count_params(*, d_model: int, n_layer: int, ffn_hidden: int, vocab_size: int, tie_embeddings: bool,
                 n_head: int = 1, n_kv_head: int = 0) -> int:
    """Parameters of the llama model: embeddings (+ untied head), per layer 2 d^2 (q, o) + 2 d kv
    (k, v; kv = d with n_kv_head 0, else n_kv_head heads of d / n_head) attention + 3 d f SwiGLU
    + 2 RMSNorm gains, and the final norm."""
    f = ffn_width(d_model, ffn_hidden)
    kv = d_model // n_head * (n_kv_head or n_head)
    embeddings = vocab_size * d_model * (1 if tie_embeddings else 2)
    return embeddings + n_layer * (2 * d_model * d_model + 2 * d_model * kv + 3 * d_model * f + 2 * d_model) + d_model


def describe(name: str, vocab_size: int = 8192, tie_embeddings: bool = False) -> str:
    p = PRESETS[name]
    n = count_params(d_model=p.d_model, n_layer=p.n_layer, ffn_hidden=p.ffn_hidden, vocab_size=vocab_size, tie_embeddings=tie_embeddings)
    return (f"{name:<11} {n / 1e6:7.1f}M params  d_model {p.d_model:<5} layers {p.n_layer:<3} heads {p.n_head:<3} "
            f"ffn {p.ffn_hidden:<5} (vocab {vocab_size}{', tied' if tie_embeddings else ''})")
