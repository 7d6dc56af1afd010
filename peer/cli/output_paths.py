"""The files and folders a verb will write, checked before it starts: a read-only or missing
place is refused at once, naming the flag to change, instead of an `[Errno 30] Read-only file
system: '…/peer.pem.tmp'` when the write comes (the --summary-json at the end of a whole run).

A check, not a lock: a folder that turns read-only later still fails at the write itself
(protocol/identity.py says the same for the key). Imports nothing heavy: it runs before the verb.
"""

from __future__ import annotations

import argparse
import errno
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal


class UnwritablePath(ValueError):
    """A path a verb must write to cannot be written (a bad flag value: exit 2); the message names the flag to change."""


@dataclass(frozen=True, slots=True)
class OutputPath:
    flag: str  # the flag that chooses it, e.g. "--summary-json"
    what: str  # what goes there, e.g. "the summary"
    path: Path
    # "file": opened and written in place; "atomic": written beside it, then renamed over it (its
    # folder must be writable even when the file exists); "folder": a folder files are created in
    kind: Literal["file", "atomic", "folder"] = "file"

    @property
    def folder(self) -> bool:
        return self.kind == "folder"

    @property
    def place(self) -> Path:
        """The folder the write happens in."""
        return self.path if self.folder else self.path.parent


def unwritable_message(what: str, place: Path | str, reason: str, flag: str, folder: bool = False) -> str:
    """The one sentence for every write this CLI cannot make."""
    return (f"cannot write {what} to {place} ({reason}): "
            + (f"pass {flag} DIR with a writable folder" if folder else f"pass {flag} PATH in a writable folder"))


def why_unwritable(place: Path) -> str | None:
    """Why files cannot be created in folder `place` (made on demand: its nearest existing
    ancestor counts), or None when they can."""
    existing = place
    while not existing.exists():
        if existing.parent == existing:
            return "no such folder"
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a folder"
    if os.access(existing, os.W_OK | os.X_OK):
        return None
    try:
        read_only = bool(os.statvfs(existing).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    return os.strerror(errno.EROFS if read_only else errno.EACCES).lower()


def outputs_of(args: argparse.Namespace) -> list[OutputPath]:
    """What `args.verb` will write, from its flags (only the flags given; defaults write nowhere
    a user chose, except the --resume state and a standby's checkpoint beside --identity-path)."""
    verb, found = args.verb, []

    def add(flag: str, what: str, value: str | None, kind: Literal["file", "atomic", "folder"] = "file") -> None:
        if isinstance(value, str) and value:
            found.append(OutputPath(flag, what, Path(value).expanduser(), kind))

    identity = getattr(args, "identity_path", None)
    if identity and not Path(identity).expanduser().exists():  # an existing key is only read
        add("--identity-path", "the identity key", identity, "atomic")
    if verb == "coordinator":
        add("--checkpoint", "the checkpoint", args.checkpoint, "atomic")
        if args.standby and not args.checkpoint and identity:  # standby-<id>.ckpt beside the key
            add("--checkpoint", "the standby's checkpoint", str(Path(identity).expanduser().parent / "standby.ckpt"), "atomic")
        add("--summary-json", "the summary", args.summary_json)
        add("--run-log", "the run log", args.run_log)
    elif verb == "peer":
        if identity:  # the --resume state is written every round beside the key, or in --state-dir
            add("--state-dir", "the --resume state", args.state_dir or str(Path(identity).expanduser().parent), "folder")
        add("--summary-json", "the summary", args.summary_json)
    elif verb == "demo":
        add("--workdir", "the demo's identities, checkpoints and logs", args.workdir, "folder")
        add("--json", "the results", args.json)
    elif verb in ("simulate", "preflight"):
        add("--json", "the results", args.json)
    elif verb in ("export", "prepare-data"):
        add("--out", "the exported model" if verb == "export" else "the token shards", args.out, "folder")
    return found


def check_outputs(args: argparse.Namespace) -> None:
    """Raise UnwritablePath for the first place `args.verb` would fail to write."""
    for out in outputs_of(args):
        if out.path.is_dir() and not out.folder:
            raise UnwritablePath(f"{out.flag} {out.path} is a folder; pass the file to write {out.what} to")
        if out.kind == "file" and out.path.exists() and os.access(out.path, os.W_OK):
            continue  # rewritten in place: the file's own permission is what counts
        reason = why_unwritable(out.place)
        if reason is not None:
            raise UnwritablePath(unwritable_message(out.what, out.place, reason, out.flag, out.folder))
