"""A peer's own state for `--resume`: θ_r, the outer state, and what never leaves the peer (inner
AdamW state, error feedback), written every round beside its identity; and the hold this
process has on that identity (one process per key: `hold_identity`)."""

from __future__ import annotations

import logging
import secrets
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from peer.run import checkpoint
from protocol.identity import Identity, IdentityLock, lock_identity

log = logging.getLogger("swarmloco.peer")


def save_local_state(path: Path, *, round_: int, params, param_hash: str, config_hash: str, trainer, math,
                     writer: ThreadPoolExecutor | None = None) -> None:
    """Write the state; with `writer` (overlapped rounds) beside the next inner phase, from a copy
    taken now (checkpoint.snapshot; the trainer's state is one already)."""
    copied = checkpoint.snapshot if writer is not None else (lambda state: state)
    ckpt = checkpoint.Checkpoint(
        round=round_, params=copied(params), param_hash=param_hash, config_hash=config_hash,
        outer_state=copied(math.global_state_dict()),
        local_state={"trainer": trainer.state_dict(), "math": copied(math.local_state_dict())},
    )
    if writer is not None:
        writer.submit(checkpoint.save, path, ckpt)
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


@dataclass(frozen=True, slots=True)
class HeldIdentity:
    """The key this process speaks with, and its session with the run.

    `session` is fresh per process: it goes into every Join and heartbeat, so the coordinator
    tells a second live process of one key (refused) from this one. `succeeds` is the session of
    the process that held the key's lock before us (read from the lock file): we hold the lock,
    so that process is dead, and the coordinator lets us take its place at once, without waiting
    for its heartbeats to time out (peer/coordinator/registry.py, PeerRegistry.session_conflict)."""

    identity: Identity
    session: str
    succeeds: str = ""
    lock: IdentityLock | None = None  # None: an ephemeral identity (nothing to share, nothing to lock)

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()


def hold_identity(path: str | None) -> HeldIdentity:
    """Load (or create) the key at `path` and lock it for this process; raises IdentityInUse
    (protocol.identity) when another live process holds it. No path: a fresh ephemeral key."""
    session = secrets.token_hex(16)
    if not path:
        return HeldIdentity(Identity.generate(), session)
    Identity.load_or_create(path)  # creates the key (and its folder) on first use, with its own clear errors
    lock = lock_identity(path, {"session": session})
    # Read again under the lock: had two processes created the key at once, the file holds the
    # key this lock guards.
    previous = lock.previous.get("session")
    return HeldIdentity(Identity.load_or_create(path), session, previous if isinstance(previous, str) else "", lock)
