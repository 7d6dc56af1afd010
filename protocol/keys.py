"""The run's coordinator keys: whose signature a peer accepts on manifests, run states and checkpoints.

A run's identity is its coordinator keys (`[control] coordinators` in the run config), held as
fingerprints (peer ids: sha256 of the Ed25519 public key, hex). A user may type a prefix of one
(at least MIN_FINGERPRINT hex characters); check_fingerprint validates what they typed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from protocol.wire import swarm_pb2
from protocol.envelope_error import EnvelopeError
from protocol.identity import peer_id_of

MIN_FINGERPRINT = 16  # hex characters of a fingerprint a user may type (64 bits: no second preimage)


class ImpersonationError(EnvelopeError):
    """Signed by a key that is not the run's: refuse, whatever the endpoint says."""

    def __init__(self, message: str) -> None:
        super().__init__("not-coordinator", message)


@dataclass(frozen=True, slots=True)
class CoordinatorKeys:
    """Fingerprints (peer ids: sha256 of the Ed25519 public key, hex) a peer accepts signatures from."""

    fingerprints: frozenset[str]

    @classmethod
    def of(cls, fingerprints: Iterable[str]) -> "CoordinatorKeys":
        return cls(frozenset(f.lower() for f in fingerprints))

    @classmethod
    def of_key(cls, public_key: bytes) -> "CoordinatorKeys":
        return cls.of([peer_id_of(public_key)])

    def allows(self, public_key: bytes) -> bool:
        return self.matches(peer_id_of(bytes(public_key)))

    def matches(self, peer_id: str) -> bool:
        """Full fingerprints match exactly; a typed prefix (>= 16 hex) matches the key it starts."""
        return any(peer_id == f or (len(f) < 32 and peer_id.startswith(f)) for f in self.fingerprints)

    def check(self, signed: swarm_pb2.Signed, what: str) -> str:
        """The signer's peer id, or ImpersonationError."""
        signer = peer_id_of(bytes(signed.public_key))
        if not self.matches(signer):
            raise ImpersonationError(
                f"{what} is signed by key {signer[:16]}…, which is not one of this run's coordinator keys "
                f"({', '.join(sorted(f[:16] + '…' for f in self.fingerprints))}): refusing it"
            )
        return signer


def check_fingerprint(text: str) -> str:
    """A `--coordinator-key` value: hex, at least 16 characters (the coordinator prints all 32)."""
    value = text.strip().lower()
    if not MIN_FINGERPRINT <= len(value) <= 32 or any(c not in "0123456789abcdef" for c in value):
        raise ValueError(f"--coordinator-key {text!r}: use the fingerprint the coordinator prints (32 hex characters; at least 16)")
    return value
