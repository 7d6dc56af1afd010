"""A peer's own state for `--resume`: θ_r, the outer state, and what never leaves the peer (inner
AdamW state, error feedback), written every round beside its identity."""

from __future__ import annotations

import copy
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from peer.run import checkpoint

log = logging.getLogger("swarmloco.peer")


def save_local_state(path: Path, *, round_: int, params, param_hash: str, config_hash: str, trainer, math,
                     writer: ThreadPoolExecutor | None = None) -> None:
    """Write the state; with `writer` (overlapped rounds) beside the next inner phase, from a copy."""
    ckpt = checkpoint.Checkpoint(
        round=round_, params=params, param_hash=param_hash, config_hash=config_hash,
        outer_state=math.global_state_dict(),
        local_state={"trainer": trainer.state_dict(), "math": math.local_state_dict()},
    )
    if writer is not None:
        writer.submit(checkpoint.save, path, copy.deepcopy(ckpt))
    else:
        checkpoint.save(path, ckpt)


def load_local_state(path: Path, *, config_hash: str, trainer, math) -> checkpoint.Checkpoint | None:
    """Restore the trainer's and the round math's state; the checkpoint (for θ_r and its round),
    or None when it was written under another run config."""
    ckpt = checkpoint.load(path)
    if ckpt.config_hash != config_hash:
        log.warning("resume state %s is for another run config; starting fresh", path)
        return None
    trainer.load_state_dict(ckpt.local_state["trainer"])
    math.load_local_state_dict(ckpt.local_state.get("math") or {})
    math.load_global_state_dict(ckpt.outer_state)
    return ckpt
