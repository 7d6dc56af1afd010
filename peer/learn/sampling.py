"""Text from a model: autoregressive sampling with temperature and top-k (no KV cache: the
models here are small and the window is model.seq_len)."""

from __future__ import annotations

import torch
import torch.nn as nn


@torch.no_grad()
def generate(model: nn.Module, idx: torch.Tensor, max_new: int, *, temperature: float = 0.8, top_k: int = 50,
             generator: torch.Generator | None = None) -> torch.Tensor:
    """idx (B, T0) long -> (B, T0 + max_new): each new token drawn from softmax(logits / temperature)
    over the top_k most likely (top_k 0: all); temperature 0 takes the most likely one."""
    if max_new < 0 or temperature < 0 or top_k < 0:
        raise ValueError("max tokens, temperature and top-k must be >= 0")
    seq_len = model.cfg.seq_len
    was_training = model.training
    model.eval()
    try:
        for _ in range(max_new):
            logits, _ = model(idx[:, -seq_len:])
            logits = logits[:, -1, :].float()  # (B, V)
            if temperature == 0:
                nxt = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k:
                    kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                nxt = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)
            idx = torch.cat([idx, nxt], dim=1)
    finally:
        model.train(was_training)
    return idx
