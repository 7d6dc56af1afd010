"""The inner loop of a DiLoCo round: H local AdamW steps on this peer's shard, and val loss.

The AdamW optimizer is created once and kept for the whole run: DiLoCo keeps inner optimizer
state across rounds (its moments carry what the peer has learned about gradient scale). Between
rounds the peer overwrites the parameters in place (model.load_flat_params) with the new global
model, so the optimizer keeps pointing at the same tensors.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from peer.run.checkpoint import snapshot
from peer.run.config import InnerConfig
from peer.learn.data import ShardSampler
from peer.learn.throughput import flops_per_token, mfu, peak_flops

Batch = tuple[torch.Tensor, torch.Tensor]  # x, y: (B, T) long


@dataclass(frozen=True, slots=True)
class InnerStats:
    steps: int
    mean_loss: float  # mean training loss over the steps of this run() call
    last_loss: float
    tokens: int  # tokens trained on in this call: steps * B * T
    seconds: float

    def then(self, more: "InnerStats") -> "InnerStats":
        """These steps followed by `more` (one phase trained in two calls)."""
        steps = self.steps + more.steps
        return InnerStats(steps=steps, mean_loss=(self.mean_loss * self.steps + more.mean_loss * more.steps) / steps,
                          last_loss=more.last_loss, tokens=self.tokens + more.tokens, seconds=self.seconds + more.seconds)


class InnerTrainer:
    """AdamW on one model and one sampler, kept across rounds.

    The sampler is anything with next_batch() -> (x, y) and state_dict()/load_state_dict()
    (a ShardSampler, or a wrapper: DeviceSampler, the simulator's optim.attacks.PoisonedSampler).
    Weight decay goes to matrices and embeddings only (dim >= 2), not to biases and LayerNorm
    gains, as in GPT-2/nanoGPT: decaying a gain toward 0 only fights the normalization."""

    def __init__(self, model: nn.Module, cfg: InnerConfig, sampler: ShardSampler, *, train_model: nn.Module | None = None) -> None:
        """`train_model`: what the steps run through when it is not `model` itself (a
        DistributedDataParallel wrapper, peer/node/ranks.py); the optimizer holds `model`'s tensors."""
        self.model, self.cfg, self.sampler = model, cfg, sampler
        params = [p for p in model.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        self.optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))
        self.step = 0  # inner steps taken over the whole run (all rounds); drives the warm-up
        self.device = params[0].device
        self.train_model = train_model or model
        self.forward = torch.compile(self.train_model) if cfg.compile else self.train_model
        bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and self.device.type == "cuda")
        self.autocast_dtype = torch.bfloat16 if bf16 else None
        model_cfg = getattr(model, "cfg", None)
        self.flops_per_token = (
            flops_per_token(sum(p.numel() for p in params), model_cfg.n_layer, model_cfg.d_model, model_cfg.seq_len)
            if model_cfg is not None else 0.0
        )
        self.peak_flops = peak_flops(self.device)

    def lr_at(self, step: int) -> float:
        """Linear warm-up from lr/warmup to lr over the first warmup_steps steps, then constant."""
        if self.cfg.warmup_steps == 0:
            return self.cfg.lr
        return self.cfg.lr * min(1.0, (step + 1) / self.cfg.warmup_steps)

    def mfu(self, tokens_per_s: float) -> float | None:
        """Model FLOPs utilization at this throughput; None where the device's peak is unknown (CPU)."""
        return mfu(tokens_per_s, self.flops_per_token, self.peak_flops)

    def _gradients(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Backward over (B, T) in micro-batches of inner.micro_batch_size rows (gradient
        accumulation): each micro-batch's mean loss weighted by its share of the rows, so the
        gradient is the full batch's. Returns the batch's mean loss, detached (no host sync)."""
        rows = x.shape[0]
        micro = self.cfg.micro_batch_size or rows
        pieces = list(zip(x.split(micro), y.split(micro)))
        total = torch.zeros((), device=x.device)
        for i, (xm, ym) in enumerate(pieces):
            last = i == len(pieces) - 1
            # DDP all-reduces gradients on the last micro-batch only.
            sync = contextlib.nullcontext() if last or not hasattr(self.train_model, "no_sync") else self.train_model.no_sync()
            cast = (torch.autocast(self.device.type, dtype=self.autocast_dtype) if self.autocast_dtype is not None
                    else contextlib.nullcontext())
            with sync:
                with cast:
                    _, loss = self.forward(xm, ym)
                share = xm.shape[0] / rows
                (loss * share).backward()
            total = total + loss.detach().float() * share
        return total

    def run(self, steps: int, on_step: Callable[[int, float], None] | None = None, *, log_every: int = 1,
            stop: Callable[[], bool] | None = None) -> InnerStats:
        """Take `steps` inner steps, or fewer when `stop()` turns true after one (at least one is
        taken; InnerStats.steps says how many). on_step(total_step, loss) every `log_every` steps and
        after the last, total_step counting from 1 over the whole run (not this call).

        The loss is read on the host (a sync on CUDA) only at those steps; on CPU, where reading
        costs nothing, every step, so a non-finite loss stops training before it reaches the parameters."""
        if steps < 1:
            raise ValueError(f"steps={steps}: run at least 1 inner step")
        self.train_model.train()
        started = time.perf_counter()
        losses: list[torch.Tensor] = []
        tokens = 0
        for i in range(steps):
            x, y = self.sampler.next_batch()  # (B, T) each
            lr = self.lr_at(self.step)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.optimizer.zero_grad(set_to_none=True)
            loss = self._gradients(x, y)
            report = on_step is not None and ((i + 1) % log_every == 0 or i + 1 == steps)
            if report or self.device.type == "cpu":
                value = loss.item()
                if not math.isfinite(value):  # checked before the step, so the parameters stay usable
                    raise FloatingPointError(
                        f"inner loss became {value} at step {self.step + 1}; lower inner.lr or check the data"
                    )
            if self.cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
            self.optimizer.step()
            self.step += 1
            losses.append(loss)
            tokens += x.numel()
            if report:
                on_step(self.step, value)
            if stop is not None and i + 1 < steps and stop():
                break
        values = torch.stack(losses).tolist()  # one host sync per call
        if not all(math.isfinite(v) for v in values):
            raise FloatingPointError(f"inner loss became non-finite in the last {steps} steps; lower inner.lr or check the data")
        return InnerStats(
            steps=len(values),
            mean_loss=sum(values) / len(values),
            last_loss=values[-1],
            tokens=tokens,
            seconds=time.perf_counter() - started,
        )

    def state_dict(self) -> dict[str, Any]:
        """Everything --resume needs besides the parameters: optimizer, sampler, step counter.

        A snapshot (a copy, ~2x the parameters), unlike torch's optimizer.state_dict() which
        aliases live tensors: training on after taking it must not change a checkpoint being written."""
        return {
            "optimizer": snapshot(self.optimizer.state_dict()),
            "sampler": self.sampler.state_dict(),
            "step": self.step,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.sampler.load_state_dict(state["sampler"])
        self.step = int(state["step"])


@torch.no_grad()
def evaluate(model: nn.Module, batches: Sequence[Batch]) -> float:
    """Mean cross-entropy (nats per byte) over all tokens of `batches`, in eval mode
    (no dropout); the model's previous train/eval mode is restored afterwards."""
    if not batches:
        raise ValueError("evaluate() needs at least one batch")
    was_training = model.training
    model.eval()
    try:
        total, count = 0.0, 0
        for x, y in batches:
            _, loss = model(x, y)
            total += loss.item() * y.numel()
            count += y.numel()
    finally:
        model.train(was_training)
    return total / count


def set_cpu_threads(n: int) -> None:
    """Intra-op threads for this process: with several peers on a few cores, 1-2 each avoids
    oversubscription (threads of different processes fighting for the same cores)."""
    if n < 1:
        raise ValueError(f"threads={n}: use at least 1 CPU thread")
    torch.set_num_threads(n)
