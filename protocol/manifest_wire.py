"""Round manifests as they travel to peers that ask for the compact form: the coordinator's
signed body, zlib-compressed.

Every peer fetches the whole manifest every round, so the coordinator sends n manifests of n
entries: O(n^2) bytes, ~29 KB a peer at 64 peers, most of it hex and base64 of random digests and
signatures, which zlib halves. The signature and key travel unchanged; the body travels as

    COMPRESSED  zlib(the signed canonical body)

and the receiver inflates it (bounded by signing.MAX_BODY_BYTES) back into the exact bytes the
coordinator signed before anything else reads, hashes or keeps it, so open_manifest checks the
signature over the canonical body as before and nothing verifiable is lost. A full body (it starts
with its tag, "swarmloco/...") passes through `expand` unchanged: a peer that does not ask
(ManifestRequest.compact unset: an older peer, a standby) gets the full form.
"""

from __future__ import annotations

import threading
import zlib

from protocol._generated import swarm_pb2
from protocol.envelope_error import EnvelopeError
from protocol.signing import MAX_BODY_BYTES

COMPRESSED = b"\x02"  # a full body starts with its tag ("swarmloco/..."), never with this byte
LEVEL = 6  # level 9 saves < 1% more on a manifest, at twice the CPU


def compress(signed: swarm_pb2.Signed) -> swarm_pb2.Signed:
    """The compact form of a full signed manifest (the full one when compressing would not help)."""
    body = COMPRESSED + zlib.compress(signed.body, LEVEL)
    if len(body) >= len(signed.body):
        return signed
    return swarm_pb2.Signed(body=body, signature=signed.signature, public_key=signed.public_key)


def expand(signed: swarm_pb2.Signed) -> swarm_pb2.Signed:
    """A manifest as it travelled -> the full signed manifest (EnvelopeError "malformed" or
    "oversized" when a compact body does not inflate to one whole body of at most MAX_BODY_BYTES)."""
    if not signed.body.startswith(COMPRESSED):
        return signed
    inflater = zlib.decompressobj()
    try:
        body = inflater.decompress(signed.body[len(COMPRESSED):], MAX_BODY_BYTES + 1)
    except zlib.error as exc:
        raise EnvelopeError("malformed", f"a compressed manifest does not inflate ({exc}): the coordinator sent a "
                                         "damaged body; ask again, or without ManifestRequest.compact") from None
    if len(body) > MAX_BODY_BYTES:
        raise EnvelopeError("oversized", f"a compressed manifest inflates past {MAX_BODY_BYTES} bytes: refused")
    if not inflater.eof or inflater.unused_data:
        raise EnvelopeError("malformed", "a compressed manifest is truncated or has bytes after its end: the coordinator "
                                         "sent a damaged body; ask again, or without ManifestRequest.compact")
    return swarm_pb2.Signed(body=body, signature=signed.signature, public_key=signed.public_key)


class CompactManifests:
    """The compact form of the manifests a coordinator serves, compressed once each (every peer
    asks for the same one). Keyed by the signed message itself: a manifest signed again (a
    continuation) is a new message and is compressed afresh."""

    KEEP = 4

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._made: list[tuple[swarm_pb2.Signed, swarm_pb2.Signed]] = []

    def of(self, signed: swarm_pb2.Signed) -> swarm_pb2.Signed:
        with self._lock:
            for full, compact in self._made:
                if full is signed:
                    return compact
        compact = compress(signed)
        with self._lock:
            self._made = [*self._made[-(self.KEEP - 1):], (signed, compact)]
        return compact
