"""Canonical signed bodies: the bytes that are signed are the bytes that travel.

A body is `TAG + b"\\n" + JSON(sorted keys, no spaces)`. The domain tag keeps a signature made
for one purpose (say, a heartbeat) from being replayed as another (an update header). The
receiver verifies the signature over the exact bytes it received, then parses them.
"""

from __future__ import annotations

import json
from typing import Any

from protocol._generated import swarm_pb2
from protocol.identity import Identity, IdentityError, peer_id_of, verify_signature

MAX_BODY_BYTES = 1 << 20  # fits in one gRPC message; a manifest of ~2000 peers


class SignatureError(ValueError):
    """A signed body that failed verification or parsing; the message names the reason."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason  # short machine-readable reason, counted in status


def canonical_body(tag: str, fields: dict[str, Any]) -> bytes:
    return tag.encode() + b"\n" + json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


def sign_body(identity: Identity, tag: str, fields: dict[str, Any]) -> swarm_pb2.Signed:
    body = canonical_body(tag, fields)
    return swarm_pb2.Signed(body=body, signature=identity.sign(body), public_key=identity.public_key)


def open_signed(signed: swarm_pb2.Signed, tag: str) -> tuple[dict[str, Any], str]:
    """Verify `signed` and return (fields, signer peer_id). Raises SignatureError."""
    if len(signed.body) > MAX_BODY_BYTES:
        raise SignatureError("oversized", f"signed body of {len(signed.body)} bytes exceeds {MAX_BODY_BYTES}")
    if not verify_signature(signed.public_key, signed.signature, signed.body):
        raise SignatureError("bad-signature", "Ed25519 signature does not verify over the body")
    prefix = tag.encode() + b"\n"
    if not signed.body.startswith(prefix):
        raise SignatureError("wrong-tag", f"signed body is not a {tag!r}")
    try:
        fields = json.loads(signed.body[len(prefix):])
    except (ValueError, RecursionError) as exc:  # bad UTF-8/JSON, ints over 4300 digits, deep nesting
        raise SignatureError("malformed", f"signed body is not valid JSON ({type(exc).__name__})") from None
    if not isinstance(fields, dict):
        raise SignatureError("malformed", "signed body is not a JSON object")
    try:
        signer = peer_id_of(signed.public_key)
    except IdentityError as exc:
        raise SignatureError("bad-key", str(exc)) from None
    return fields, signer
