"""Checkpoints that lose nothing: written to a temporary file, fsynced, then renamed.

A checkpoint holds the global parameters (flat float32), the outer optimizer's global state,
the round they start, and the run-config hash. `save_bytes`/`load_bytes` are the same format on
the wire (the coordinator streams it to late joiners) and on disk.
"""

from __future__ import annotations

import copy
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


def snapshot(state: Any) -> Any:
    """A copy of a state tree (dicts, lists, tuples of tensors and plain values) that training on
    cannot change: every tensor cloned, the containers rebuilt, other leaves deep-copied.

    What copy.deepcopy gives for such trees at a quarter of its cost (no memo, no pickling
    protocol per tensor): it runs on the training thread between inner phases, where every
    millisecond is one the GPU or CPU does not train (x10 on a machine whose cores are all busy)."""
    if isinstance(state, torch.Tensor):
        return state.detach().clone()
    if isinstance(state, dict):
        return {key: snapshot(value) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(snapshot(value) for value in state)
    return copy.deepcopy(state)


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


def config_changes(stored: dict[str, Any], current: dict[str, Any], prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted field, stored value, current value) for every run-config field that differs
    between two `RunConfig.to_dict()`s, in field order (a field only one side has: None on the other)."""
    changes = []
    for key in [*stored, *(k for k in current if k not in stored)]:
        old, new = stored.get(key), current.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            changes += config_changes(old, new, f"{prefix}{key}.")
        elif old != new:
            changes.append((f"{prefix}{key}", old, new))
    return changes


def config_mismatch(path: str | Path, stored: dict[str, Any] | None, current: dict[str, Any], *, own_key: str) -> str:
    """Why the checkpoint at `path` (whose run config is `stored`, None in a checkpoint that does not
    keep it) cannot continue the run `current` of the coordinator whose key is `own_key`: the
    fields that differ, and what to pass to get the same config (the key: the same --identity-path)."""
    changes = config_changes(stored, current) if stored else []
    if not changes:  # an older checkpoint without its config (or one whose hash alone differs)
        return f"{path} was written by a different run config; use the same --config and flags as before, or another --checkpoint path"
    reasons = []
    old_keys, new_keys = next(((old or [], new or []) for field_, old, new in changes if field_ == "control.coordinators"), ([], []))
    if new_keys and own_key not in old_keys:  # without --identity-path, every start makes a new key
        reasons.append(f"the coordinator key differs (this one is {own_key[:8]}, the checkpoint's run has "
                       f"{', '.join(k[:8] for k in old_keys) or 'none'}): pass the same --identity-path as before "
                       "(without one, every start makes a new key)")
        if not set(new_keys) - set(old_keys) - {own_key}:  # no other key listed anew: the key was the whole change
            changes = [c for c in changes if c[0] != "control.coordinators"]
    if changes:
        shown = "; ".join(f"{field_} {_short(old)} -> {_short(new)}" for field_, old, new in changes[:6])
        more = f" and {len(changes) - 6} more" if len(changes) > 6 else ""
        reasons.append(f"these fields differ: {shown}{more}: use the same --config and flags as before")
    return f"{path} was written by a different run config: {'; '.join(reasons)}; or give another --checkpoint path to start a new run"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
