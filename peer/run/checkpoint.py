"""Checkpoints that lose nothing: written to a temporary file, fsynced, then renamed.

A checkpoint holds the global parameters (flat float32), the outer optimizer's global state,
the round they start, and the run-config hash. `save_bytes`/`load_bytes` are the same format on
the wire (the coordinator streams it to late joiners) and on disk.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

FORMAT = "swarmloco-checkpoint-v1"


class CheckpointError(ValueError):
    pass


@dataclass(slots=True)
class Checkpoint:
    round: int
    params: torch.Tensor  # (d,) float32
    param_hash: str
    config_hash: str
    outer_state: dict[str, Any] = field(default_factory=dict)
    local_state: dict[str, Any] = field(default_factory=dict)  # peer-only: inner AdamW, sampler, error feedback
    extra: dict[str, Any] = field(default_factory=dict)


def to_bytes(ckpt: Checkpoint) -> bytes:
    buffer = io.BytesIO()
    torch.save(
        {
            "format": FORMAT,
            "round": ckpt.round,
            "params": ckpt.params.detach().cpu().float().contiguous(),
            "param_hash": ckpt.param_hash,
            "config_hash": ckpt.config_hash,
            "outer_state": ckpt.outer_state,
            "local_state": ckpt.local_state,
            "extra": ckpt.extra,
        },
        buffer,
    )
    return buffer.getvalue()


def from_bytes(data: bytes) -> Checkpoint:
    try:
        raw = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"not a swarmloco checkpoint ({type(exc).__name__}: {exc})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise CheckpointError("not a swarmloco checkpoint (format tag missing)")
    return Checkpoint(
        round=int(raw["round"]),
        params=raw["params"],
        param_hash=str(raw["param_hash"]),
        config_hash=str(raw["config_hash"]),
        outer_state=raw.get("outer_state", {}),
        local_state=raw.get("local_state", {}),
        extra=raw.get("extra", {}),
    )


def write_atomic(path: str | Path, data: bytes) -> None:
    """Replace `path` with `data` so that a crash leaves either the old or the new file, whole."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


def save(path: str | Path, ckpt: Checkpoint) -> None:
    write_atomic(path, to_bytes(ckpt))


def load(path: str | Path) -> Checkpoint:
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"no checkpoint at {path}")
    return from_bytes(path.read_bytes())
