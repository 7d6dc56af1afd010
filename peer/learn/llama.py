"""A Llama-style decoder: RMSNorm, rotary position embeddings (RoPE), SwiGLU, no biases.

Module names follow Hugging Face's LlamaForCausalLM (model.embed_tokens, model.layers.{i}.self_attn.q_proj,
..., model.norm, lm_head), and the math follows it too (RMSNorm in float32, RoPE with rotate_half,
SDPA attention, grouped-query attention when model.n_kv_head < n_head), so `swarmloco export`
writes our state_dict as it is, transformers computes the same logits (tests/test_export.py), and
`[model] init_from` loads a transformers Llama checkpoint into it (peer/learn/hf_checkpoint.py,
tests/test_init_from.py). forward(idx, targets) has GPT's contract: (logits, loss).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from typing import Protocol

from peer.run.presets import ffn_width


class LlamaShape(Protocol):
    """What the model reads of the run's model config (peer/run/config_sections.ModelConfig). A
    protocol, not an import: that config reads Hugging Face checkpoints through
    peer/learn/hf_checkpoint.py, which builds this model to check their tensors."""

    seq_len: int
    d_model: int
    n_layer: int
    n_head: int
    n_kv_head: int
    vocab_size: int
    ffn_hidden: int
    tie_embeddings: bool
    rope_theta: float
    rms_eps: float

INIT_STD = 0.02


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_tables(T: int, head_dim: int, theta: float, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (T, head_dim): angle pos * theta^(-2i/head_dim), each half repeated."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim))
    freqs = torch.arange(T, device=device).float()[:, None] * inv_freq[None, :]  # (T, head_dim / 2)
    angles = torch.cat((freqs, freqs), dim=-1)  # (T, head_dim)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    """Multi-head attention; with n_kv_head < n_head, grouped-query: query head i reads key/value
    head i // (n_head / n_kv_head), as transformers' repeat_kv does."""

    def __init__(self, cfg: LlamaShape) -> None:
        super().__init__()
        d = cfg.d_model
        self.n_head, self.n_kv_head = cfg.n_head, kv_heads_of(cfg)
        self.head_dim, self.theta = d // cfg.n_head, cfg.rope_theta
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, self.n_kv_head * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, self.n_kv_head * self.head_dim, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q = self.q_proj(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, H, T, hd)
        k, v = (proj(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2) for proj in (self.k_proj, self.v_proj))
        cos, sin = rope_tables(T, self.head_dim, self.theta, x.device, q.dtype)  # (T, hd), broadcast over (B, H)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        if self.n_kv_head != self.n_head:  # (B, H_kv, T, hd) -> (B, H, T, hd)
            group = self.n_head // self.n_kv_head
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, hd)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, C))


class SwiGLU(nn.Module):
    def __init__(self, cfg: LlamaShape) -> None:
        super().__init__()
        f = ffn_width(cfg.d_model, cfg.ffn_hidden)
        self.gate_proj = nn.Linear(cfg.d_model, f, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, f, bias=False)
        self.down_proj = nn.Linear(f, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaShape) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.d_model, cfg.rms_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.d_model, cfg.rms_eps)
        self.mlp = SwiGLU(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaBody(nn.Module):
    def __init__(self, cfg: LlamaShape) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab_of(cfg), cfg.d_model)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.d_model, cfg.rms_eps)


class LlamaLM(nn.Module):
    """forward(idx (B, T) long, targets (B, T) | None) -> (logits (B, T, V), loss | None)."""

    def __init__(self, cfg: LlamaShape) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = LlamaBody(cfg)
        self.lm_head = nn.Linear(cfg.d_model, vocab_of(cfg), bias=False)
        self.tie()

    def tie(self) -> None:
        """With tie_embeddings the head is the embedding matrix (parameters() yields it once)."""
        if self.cfg.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """N(0, 0.02) matrices, unit RMSNorm gains; o_proj and down_proj (which write into the
        residual stream) get 0.02 / sqrt(2 n_layer). Fixed order: one seed, one model."""
        residual_std = INIT_STD / math.sqrt(2 * self.cfg.n_layer)
        for name, p in self.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                std = residual_std if name.endswith(("o_proj.weight", "down_proj.weight")) else INIT_STD
                nn.init.normal_(p, mean=0.0, std=std, generator=generator)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, T = idx.shape
        if T > self.cfg.seq_len:
            raise ValueError(f"sequence length {T} exceeds model.seq_len={self.cfg.seq_len}; crop the input")
        x = self.model.embed_tokens(idx)
        for layer in self.model.layers:
            x = layer(x)
        logits = self.lm_head(self.model.norm(x))  # (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(B * T, -1), targets.reshape(B * T))
        return logits, loss


def vocab_of(cfg: LlamaShape) -> int:
    return cfg.vocab_size or 256


def kv_heads_of(cfg: LlamaShape) -> int:
    """Key/value heads: model.n_kv_head, or n_head (0: plain multi-head attention)."""
    return cfg.n_kv_head or cfg.n_head


def build_llama(cfg: LlamaShape, seed: int, device: str | torch.device = "cpu") -> LlamaLM:
    """Built on the meta device (no throw-away init of up to 1B parameters), then materialized
    on `device` and initialized from its own generator: same (cfg, seed) -> same parameters."""
    with torch.device("meta"):
        model = LlamaLM(cfg)
    model.to_empty(device=device)
    model.tie()  # to_empty gives each parameter new storage: tie again
    generator = torch.Generator(device=device).manual_seed(seed)
    model.reset_parameters(generator)
    return model
