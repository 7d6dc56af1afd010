"""The default model: a small GPT over bytes, and the flat-parameter view the swarm exchanges.

Bytes (vocab 256) need no tokenizer and no download, so every peer builds the same model from
the run config alone. The architecture is the usual pre-LN decoder: token + learned position
embeddings, blocks of causal self-attention and a 4x GELU MLP, a final LayerNorm and an lm head
tied to the token embedding (the tie saves 256*d_model parameters and helps tiny models).
At the ModelConfig defaults (d_model 128, 2 layers, seq_len 128) it has 445,952 parameters.

The swarm never sends a state_dict: it sends (d,) float32 vectors in `parameters()` order.
`layout_hash` names that order (names, shapes, dtypes) so two peers can check they agree
before exchanging vectors; `param_hash` names one point in parameter space so peers can check
that they hold the same global model after an outer step.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from peer.run.config import ModelConfig

VOCAB_SIZE = 256  # bytes
INIT_STD = 0.02  # GPT-2's init scale


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.dropout = cfg.dropout
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.resid_drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)  # each (B, T, C)
        # (B, T, C) -> (B, H, T, C/H): attention runs per head.
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )  # (B, H, T, C/H)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_drop(self.proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.proj = nn.Linear(4 * cfg.d_model, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-LN residual block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Byte-level GPT. forward(idx (B, T) long, targets (B, T) | None) -> (logits (B, T, 256), loss | None)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(VOCAB_SIZE, cfg.d_model)
        self.wpe = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, VOCAB_SIZE, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: parameters() yields it once, as wte.weight
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """GPT-2 init: N(0, 0.02) weights, zero biases, unit LayerNorms; the projections that
        write into the residual stream get std / sqrt(2 * n_layer) so its variance does not
        grow with depth. Walks parameters in a fixed order, so one generator seed gives one model."""
        residual_std = INIT_STD / math.sqrt(2 * self.cfg.n_layer)
        for name, p in self.named_parameters():
            if name.endswith(".bias"):
                p.zero_()
            elif ".ln" in name or name.startswith("ln_"):
                p.fill_(1.0)
            else:
                std = residual_std if name.endswith("proj.weight") else INIT_STD
                nn.init.normal_(p, mean=0.0, std=std, generator=generator)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, T = idx.shape
        if T > self.cfg.seq_len:
            raise ValueError(f"sequence length {T} exceeds model.seq_len={self.cfg.seq_len}; crop the input")
        pos = torch.arange(T, device=idx.device)  # (T,)
        x = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, 256)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(B * T, VOCAB_SIZE), targets.reshape(B * T))
        return logits, loss


def build_model(cfg: ModelConfig, seed: int) -> nn.Module:
    """The run's initial model: same (cfg, seed) -> bit-identical parameters on every peer.
    model.arch "llama" (or a preset) builds peer/learn/llama.py's decoder, else the byte GPT.

    Uses its own generator and leaves the global torch RNG untouched, so building a model
    never shifts anyone else's random stream."""
    if cfg.arch == "llama":
        from peer.learn.llama import build_llama

        return build_llama(cfg, seed)
    with torch.random.fork_rng(devices=[]):
        model = GPT(cfg)  # the constructor's own init draws from the (forked) global RNG
    generator = torch.Generator().manual_seed(seed)
    model.reset_parameters(generator)
    return model


def initial_model(cfg: ModelConfig, seed: int) -> nn.Module:
    """θ_0 of a run, as a model: model.init_from's checkpoint when the run starts from one
    (peer/learn/hf_checkpoint.py), else build_model's seeded init. The coordinator starts from it;
    peers build_model (the same layout) and take θ_r from the coordinator at join."""
    model = build_model(cfg, seed)
    if cfg.init_from:
        from peer.learn.hf_checkpoint import load_init_weights

        load_init_weights(model, cfg)
    return model


def layout_of(model: nn.Module) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every parameter in `parameters()` order: the layout of flat_params."""
    return [(name, tuple(p.shape)) for name, p in model.named_parameters()]


def layout_hash(model: nn.Module) -> str:
    """sha256 hex over names, shapes and dtypes: equal hashes mean flat vectors line up."""
    text = "".join(f"{name}:{list(p.shape)}:{p.dtype}\n" for name, p in model.named_parameters())
    return hashlib.sha256(text.encode()).hexdigest()


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def flat_params(model: nn.Module) -> torch.Tensor:
    """(d,) float32 copy of all parameters, concatenated in `parameters()` order."""
    return torch.cat([p.detach().reshape(-1).to(torch.float32) for p in model.parameters()])


@torch.no_grad()
def load_flat_params(model: nn.Module, flat: torch.Tensor) -> None:
    """Copy a (d,) vector into the parameters IN PLACE, so optimizers holding them keep working."""
    expected = num_params(model)
    if flat.dim() != 1 or flat.numel() != expected:
        raise ValueError(
            f"flat parameter vector has shape {tuple(flat.shape)} but this model needs ({expected},); "
            "was it made by a model with a different model config (compare layout_hash)?"
        )
    offset = 0
    for p in model.parameters():
        n = p.numel()
        p.copy_(flat[offset : offset + n].view_as(p))
        offset += n


def param_hash(flat: torch.Tensor) -> str:
    """sha256 hex of the float32 little-endian bytes of a flat vector (the same on every host)."""
    array = flat.detach().to(torch.float32).contiguous().cpu().numpy().astype("<f4", copy=False)
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()
