"""Outer optimizers: turn the round's aggregated pseudo-gradient into a step on the global params.

Everything is a FLAT float32 (d,) vector. Sign convention: pseudo-gradient Δ = θ_global − θ_local,
pointing like a gradient, so every rule here SUBTRACTS.

Per round, on every peer:
    sent = opt.transmit(Δ)            # (d,) what this peer encodes with the codec and sends
    aggregate = robust_aggregate(decoded `sent` of all peers)
    opt.step(θ, aggregate)            # in place; identical on every honest peer

State that every peer holds identically (Nesterov's momentum buffer) is the *global* state and goes
into checkpoints, so a late joiner resumes the same trajectory; state that is this peer's own
(DeMo's momentum) is *local* and stays with the peer.

    nesterov   DiLoCo (Douillard et al. 2023): lr 0.7, momentum 0.9; transmit = identity;
               buf = m*buf + agg; θ -= lr*(agg + m*buf)   (== torch.optim.SGD(nesterov=True))
    fedavg     θ -= lr*agg (lr 1.0: plain averaging of the peers' models); transmit = identity
    demo       DeMo (Peng et al. 2024, "Decoupled Momentum Optimization"): local momentum
               m = decay*m + Δ; send the top-k DCT components per chunk of m (in parameter space,
               so codec dct-topk:CHUNK:K represents it exactly) and subtract them from m;
               θ -= lr*sign(agg). Defaults decay 0.999, chunk 64, topk 4, lr 1e-3.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch

from optim import dct

__all__ = ["OuterOptimizer", "Nesterov", "FedAvg", "DeMo", "build", "NAMES"]


@runtime_checkable
class OuterOptimizer(Protocol):
    def transmit(self, pseudo_gradient: torch.Tensor) -> torch.Tensor: ...

    def step(self, params: torch.Tensor, aggregate: torch.Tensor) -> None: ...

    def global_state_dict(self) -> dict: ...

    def load_global_state_dict(self, d: dict) -> None: ...

    def local_state_dict(self) -> dict: ...

    def load_local_state_dict(self, d: dict) -> None: ...


def _check_flat(what: str, x: torch.Tensor, numel: int | None = None) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 1 or x.dtype != torch.float32:
        shown = f"shape {tuple(x.shape)} {x.dtype}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{what} must be a flat (d,) float32 tensor, got {shown}")
    if numel is not None and x.numel() != numel:
        raise ValueError(f"{what} has {x.numel()} values, expected {numel} (same layout as the parameters)")


def _check_step(params: torch.Tensor, aggregate: torch.Tensor) -> None:
    _check_flat("params", params)
    _check_flat("aggregate", aggregate, params.numel())


def _check_name(d: dict, name: str) -> None:
    """A state dict must come from the same kind of optimizer: loading DeMo state into Nesterov
    would silently mean something else. An empty dict means "nothing saved": start fresh."""
    if isinstance(d, dict) and not d:
        return
    if not isinstance(d, dict) or d.get("name") != name:
        found = d.get("name") if isinstance(d, dict) else type(d).__name__
        raise ValueError(f"state was saved by outer optimizer {found!r}, this one is {name!r}")


def _load_tensor(d: dict, name: str, key: str) -> torch.Tensor | None:
    """Validate a state dict saved by optimizer `name` and return a copy of its (d,) tensor."""
    _check_name(d, name)
    value = d.get(key)
    if value is None:
        return None
    _check_flat(f"{name} state {key!r}", value)
    return value.detach().clone()


class _OuterBase:
    """Defaults shared by the rules: identity transmit, no state beyond the optimizer's name."""

    __slots__ = ()
    name: ClassVar[str]

    def transmit(self, pseudo_gradient: torch.Tensor) -> torch.Tensor:
        return pseudo_gradient

    def global_state_dict(self) -> dict:
        return {"name": self.name}

    def load_global_state_dict(self, d: dict) -> None:
        _check_name(d, self.name)

    def local_state_dict(self) -> dict:
        return {"name": self.name}

    def load_local_state_dict(self, d: dict) -> None:
        _check_name(d, self.name)


@dataclass(kw_only=True, slots=True)
class Nesterov(_OuterBase):
    name: ClassVar[str] = "nesterov"
    lr: float = 0.7
    momentum: float = 0.9
    momentum_buffer: torch.Tensor | None = field(default=None, repr=False)  # (d,), global state

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"nesterov lr={self.lr}: use a positive learning rate (DiLoCo: 0.7)")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"nesterov momentum={self.momentum}: use a value in [0, 1) (DiLoCo: 0.9)")

    def step(self, params: torch.Tensor, aggregate: torch.Tensor) -> None:
        _check_step(params, aggregate)
        if self.momentum_buffer is None:
            self.momentum_buffer = torch.zeros_like(aggregate)
        _check_flat("nesterov momentum buffer", self.momentum_buffer, params.numel())
        # the same operations, in the same order, as torch.optim.SGD(nesterov=True, dampening=0)
        self.momentum_buffer.mul_(self.momentum).add_(aggregate)
        params.add_(aggregate.add(self.momentum_buffer, alpha=self.momentum), alpha=-self.lr)

    def global_state_dict(self) -> dict:
        buffer = None if self.momentum_buffer is None else self.momentum_buffer.clone()
        return {"name": "nesterov", "momentum_buffer": buffer}

    def load_global_state_dict(self, d: dict) -> None:
        self.momentum_buffer = _load_tensor(d, "nesterov", "momentum_buffer")


@dataclass(kw_only=True, slots=True)
class FedAvg(_OuterBase):
    name: ClassVar[str] = "fedavg"
    lr: float = 1.0

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"fedavg lr={self.lr}: use a positive learning rate (1.0 = plain averaging)")

    def step(self, params: torch.Tensor, aggregate: torch.Tensor) -> None:
        _check_step(params, aggregate)
        params.add_(aggregate, alpha=-self.lr)


@dataclass(kw_only=True, slots=True)
class DeMo(_OuterBase):
    name: ClassVar[str] = "demo"
    lr: float = 1e-3
    decay: float = 0.999
    chunk: int = 64
    topk: int = 4
    local_momentum: torch.Tensor | None = field(default=None, repr=False)  # (d,), local state

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"demo lr={self.lr}: use a positive step size for the sign update (DeMo: 1e-3)")
        if not 0 < self.decay <= 1:
            raise ValueError(f"demo decay={self.decay}: use a value in (0, 1] (DeMo: 0.999)")
        if not 1 <= self.topk <= self.chunk <= dct.MAX_CHUNK:
            raise ValueError(f"demo chunk={self.chunk} topk={self.topk}: need 1 <= topk <= chunk <= {dct.MAX_CHUNK}")

    @property
    def codec_spec(self) -> str:
        """The codec that represents what `transmit` returns exactly (up to float rounding)."""
        return f"dct-topk:{self.chunk}:{self.topk}"

    def transmit(self, pseudo_gradient: torch.Tensor) -> torch.Tensor:
        _check_flat("pseudo_gradient", pseudo_gradient)
        if self.local_momentum is None:
            self.local_momentum = torch.zeros_like(pseudo_gradient)
        _check_flat("demo momentum", self.local_momentum, pseudo_gradient.numel())
        self.local_momentum.mul_(self.decay).add_(pseudo_gradient)
        # the fast-moving components: k largest DCT coefficients per chunk, back in parameter space
        offsets, values = dct.top_coefficients(self.local_momentum, self.chunk, self.topk)  # (num_chunks, k)
        sent = dct.from_coefficients(offsets, values, self.chunk, self.local_momentum.numel())  # (d,)
        self.local_momentum.sub_(sent)  # what is sent leaves the local momentum: decoupled
        return sent

    def step(self, params: torch.Tensor, aggregate: torch.Tensor) -> None:
        _check_step(params, aggregate)
        params.add_(torch.sign(aggregate), alpha=-self.lr)

    def local_state_dict(self) -> dict:
        return {"name": "demo", "momentum": None if self.local_momentum is None else self.local_momentum.clone()}

    def load_local_state_dict(self, d: dict) -> None:
        self.local_momentum = _load_tensor(d, "demo", "momentum")


_CLASSES: dict[str, type[_OuterBase]] = {cls.name: cls for cls in (Nesterov, FedAvg, DeMo)}
NAMES = tuple(_CLASSES)
_STATE_FIELDS = {"momentum_buffer", "local_momentum"}


def build(name: str, **options: Any) -> OuterOptimizer:
    """`build("nesterov", lr=0.7, momentum=0.9)`; ValueError for an unknown name or option."""
    cls = _CLASSES.get(name)
    if cls is None:
        raise ValueError(f"unknown outer optimizer {name!r}: choose one of {', '.join(NAMES)}")
    accepted = [f.name for f in dataclasses.fields(cls) if f.name not in _STATE_FIELDS]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(f"outer optimizer {name!r} has no option {', '.join(unknown)}; it accepts {', '.join(accepted)}")
    return cls(**options)
