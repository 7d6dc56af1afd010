"""Ed25519 identity of a peer or coordinator.

peer_id = first 32 hex characters of sha256(raw public key): anyone holding the public key can
check that a peer_id belongs to it, so nobody can speak in another's name without its key.
The private key lives in a PEM file created with mode 0600 on first use (`--identity-path`).
"""

from __future__ import annotations

import functools
import hashlib
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from nacl.exceptions import CryptoError
from nacl.signing import VerifyKey

PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64


class IdentityError(ValueError):
    """An identity file or key that cannot be used; the message says what to do."""


def peer_id_of(public_key: bytes) -> str:
    if len(public_key) != PUBLIC_KEY_BYTES:
        raise IdentityError(f"an Ed25519 public key has {PUBLIC_KEY_BYTES} bytes, got {len(public_key)}")
    return hashlib.sha256(public_key).hexdigest()[:32]


# A peer checks the same small signed bodies more than once a round (an update header in the
# manifest and again on its author's trade stream): ~80 us of Ed25519 each here. Verification is a
# pure function of the three byte strings, so its answers for small bodies are kept, keyed by the
# exact bytes: at most CACHED_VERIFICATIONS x (CACHED_MESSAGE_BYTES + 96) bytes held.
CACHED_VERIFICATIONS = 1024
CACHED_MESSAGE_BYTES = 4096
_BYTES_LIKE = (bytes, bytearray, memoryview)


def verify_signature(public_key: bytes, signature: bytes, message: bytes) -> bool:
    """True when `signature` is `public_key`'s Ed25519 signature of `message`; never raises."""
    if not (isinstance(public_key, _BYTES_LIKE) and isinstance(signature, _BYTES_LIKE) and isinstance(message, _BYTES_LIKE)):
        return False
    if len(public_key) != PUBLIC_KEY_BYTES or len(signature) != SIGNATURE_BYTES:
        return False
    if len(message) <= CACHED_MESSAGE_BYTES:
        return _verified(bytes(public_key), bytes(signature), bytes(message))
    return _verify(public_key, signature, message)


@functools.lru_cache(maxsize=CACHED_VERIFICATIONS)
def _verified(public_key: bytes, signature: bytes, message: bytes) -> bool:
    return _verify(public_key, signature, message)


def _verify(public_key: bytes, signature: bytes, message: bytes) -> bool:
    """libsodium's Ed25519 check (PyNaCl): ~80 us here against OpenSSL's ~140 us (cryptography),
    and a node checks ~20 signatures a round (headers, result batches, trade tickets), the
    coordinator every header and batch. Stricter than OpenSSL's where it differs: it also refuses
    small-order public keys and signature points, which no honest key makes."""
    try:
        VerifyKey(bytes(public_key)).verify(bytes(message), bytes(signature))
        return True
    except (CryptoError, ValueError, TypeError):
        return False


def _write_key(path: Path, pem: bytes) -> bool:
    """Create `path` with mode 0600 from the start (no window where the key is world-readable),
    written beside it under a name of this process's own and linked into place, so a crash never
    leaves a half-written key and two processes creating one key at once agree on it: the first
    link wins, the other returns False and loads the winner's key."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        try:
            os.write(fd, pem)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.link(tmp, path)  # fails when the key exists: never overwrites another process's key
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


@dataclass(frozen=True, slots=True)
class Identity:
    private_key: Ed25519PrivateKey
    # Derived once: the node reads them for every header, slice result and stream it signs or serves.
    public_key: bytes = field(init=False, repr=False)
    peer_id: str = field(init=False)

    def __post_init__(self) -> None:
        public = self.private_key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        object.__setattr__(self, "public_key", public)
        object.__setattr__(self, "peer_id", peer_id_of(public))

    @classmethod
    def generate(cls) -> "Identity":
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def load_or_create(cls, path: str | Path) -> "Identity":
        """Load the key at `path`, or create it there (mode 0600) when the file does not exist."""
        path = Path(path).expanduser()
        if path.exists():
            return cls._load(path)
        identity = cls.generate()
        pem = identity.private_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        try:
            created = _write_key(path, pem)
        except OSError as exc:  # a read-only or foreign folder: say which flag moves the key
            reason = (exc.strerror or str(exc)).lower()
            raise IdentityError(f"cannot write the identity key to {path.parent} ({reason}): "
                                "pass --identity-path PATH in a writable folder") from None
        return identity if created else cls._load(path)

    @classmethod
    def _load(cls, path: Path) -> "Identity":
        try:
            key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        except (ValueError, TypeError) as exc:
            raise IdentityError(
                f"{path} is not an unencrypted PEM Ed25519 private key ({exc}); "
                "point --identity-path at another file to create a fresh identity"
            ) from None
        if not isinstance(key, Ed25519PrivateKey):
            raise IdentityError(f"{path} holds a {type(key).__name__}, not an Ed25519 key")
        return cls(key)

    def sign(self, message: bytes) -> bytes:
        return self.private_key.sign(message)


class IdentityInUse(OSError):
    """Another live process holds this identity (lock_identity): two processes with one key would
    sign different updates in one round and get the key banned for equivocation."""

    def __init__(self, message: str, *, path: Path, pid: int | None) -> None:
        super().__init__(message)
        self.path = path
        self.pid = pid


@dataclass(slots=True)
class IdentityLock:
    """This process's hold on an identity: an exclusive flock the kernel drops when the process
    dies (also on SIGKILL), so no stale lock is ever left behind. `previous` is what the last
    holder wrote into the lock file (its pid, its session), {} when nobody did."""

    path: Path  # the file locked: KEY.lock beside the key, or the key itself in a read-only folder
    previous: dict
    fd: int | None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the last descriptor drops the flock
            self.fd = None


def lock_identity(path: str | Path, note: dict | None = None) -> IdentityLock:
    """Hold the identity at `path` for this process, or raise IdentityInUse naming the holder.

    The lock is flock(2) on KEY.lock beside the key (created 0600), into which this process
    writes its pid and `note` (e.g. its session), so the next holder knows whom it succeeds. In a
    folder where nothing can be created it locks the key file itself (no note then). Forked
    children (the DHT process) share the lock; they die with their parent."""
    import fcntl
    import json

    key = Path(path).expanduser()
    lock_path = key.with_name(key.name + ".lock")
    try:
        fd, writable = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600), True
    except OSError:  # a read-only folder: the key is all there is to lock
        lock_path, writable = key, False
        fd = os.open(key, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_note(fd) if writable else {}
        os.close(fd)
        pid = holder.get("pid") if isinstance(holder.get("pid"), int) else None
        who = "this process" if pid == os.getpid() else f"pid {pid}" if pid is not None else "pid unknown"
        raise IdentityInUse(f"another swarmloco process ({who}) already runs with identity {key}: stop it, "
                            "or pass --identity-path NEW.pem for a second peer", path=key, pid=pid) from None
    previous = _read_note(fd) if writable else {}
    if writable:
        body = json.dumps({**(note or {}), "pid": os.getpid()}, sort_keys=True).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, body, 0)
    return IdentityLock(path=lock_path, previous=previous, fd=fd)


def _read_note(fd: int) -> dict:
    """What a holder wrote into a lock file ({} when nothing readable)."""
    import json

    try:
        note = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return note if isinstance(note, dict) else {}
