"""Slices pushed to their owner: a client-mode author's (PushSlices), or a serving owner's in a trade
with another owner (SwapSlices: each sends the other the slices of its update the other owns, in
ONE stream a pair, issue 24). Both sides of the wire format (proto/swarm.proto, SlicePush) live here.

  sender    the signed header first (with SwapSlices: and the FetchRequest it wants answered), then
            each slice: a piece with `start`, its index and whole Merkle proof, then its bytes; the
            pieces packed as `parts`, several to a message
  receiver  message by message, at most the header's payload_size in all; each slice is kept only
            when its proof puts sha256(its bytes) under the signed root at its index
"""

from __future__ import annotations

import hashlib
from typing import Iterator, Protocol, Sequence

import grpc

from protocol import merkle
from protocol._generated import swarm_pb2
from protocol.channels import CHUNK_BYTES, PART_OVERHEAD
from protocol.envelope import UpdateHeader
from protocol.rpc_errors import RpcAbort


class HeldSlice(Protocol):
    """What a sender holds of each slice it pushes (payload_store.StoredSlice)."""

    payload: bytes
    proof: tuple[bytes, ...]


def push_slices(signed_header: swarm_pb2.Signed, slices: Sequence[tuple[int, HeldSlice]],
                want: swarm_pb2.FetchRequest | None = None, takes_results: bool = False,
                inputs_done: bool = False, ticket: swarm_pb2.Signed | None = None) -> Iterator[swarm_pb2.SlicePush]:
    """The sender's messages: the header (and `want`, SwapSlices' request) first, then each slice
    (index, whole proof, bytes in pieces of at most CHUNK_BYTES), the pieces packed as `parts`,
    as many in one message as fit in CHUNK_BYTES with their proofs and framing (8 slices of 62 KB:
    one message, not 8; each message costs the receiver's loop a read). `takes_results`: SwapSlices'
    caller reads the callee's aggregated slices after the answer (protocol/result_relay.py);
    `inputs_done`: the last message says our slices end there (our results follow); `ticket`: the
    caller's SwapSlices ticket (protocol/swap_ticket.py), in the first message."""
    message = swarm_pb2.SlicePush(header=signed_header, want=want, takes_results=takes_results)
    if ticket is not None:
        message.ticket.CopyFrom(ticket)
    used = message.ByteSize()
    for index, item in slices:
        data = item.payload
        for start in range(0, max(len(data), 1), CHUNK_BYTES):
            proof = item.proof if start == 0 else ()
            piece = data if len(data) <= CHUNK_BYTES else data[start : start + CHUNK_BYTES]  # (a slice of bytes copies)
            size = len(piece) + sum(len(h) + 2 for h in proof) + PART_OVERHEAD
            if message.parts and used + size > CHUNK_BYTES:
                yield message
                message, used = swarm_pb2.SlicePush(), 0
            message.parts.append(swarm_pb2.SlicePush(slice=index, start=start == 0, proof=proof, data=piece))
            used += size
    message.inputs_done = inputs_done
    yield message


class PushedSlices:
    """The receiver's side of one push stream, for the update under `header`: take() each message
    (RpcAbort on one that breaks the rules: the caller ends the stream with it), then proven()."""

    def __init__(self, header: UpdateHeader) -> None:
        self.header = header
        self.total = 0
        self.max_proof = max(1, header.num_slices - 1).bit_length()  # siblings on a leaf's path in a tree of num_slices leaves
        self.started: set[int] = set()
        # (index, proof, its pieces so far): a slice that came in one piece is kept as the bytes
        # read, not copied into a buffer and out again (each copy of a 62 KB slice costs)
        self.parts: list[tuple[int, tuple[bytes, ...], list[bytes]]] = []

    def take(self, message: swarm_pb2.SlicePush) -> None:
        if not message.parts:  # a sender that packs nothing: one piece a message
            self._piece(message)
            return
        if message.data or message.start:
            raise RpcAbort(grpc.StatusCode.INVALID_ARGUMENT, "a packed message carries a slice of its own besides its parts",
                           swarm_pb2.MALFORMED)
        for part in message.parts:
            if part.parts or part.HasField("header") or part.HasField("want"):
                raise RpcAbort(grpc.StatusCode.INVALID_ARGUMENT, "a packed part carries parts, a header or a request",
                               swarm_pb2.MALFORMED)
            self._piece(part)

    def _piece(self, message: swarm_pb2.SlicePush) -> None:
        """One piece. What a pusher may make us hold is bounded by what it could honestly send: at
        most payload_size bytes of data, each slice started once with at most a tree's depth of
        32-byte siblings, and a slice continued only after a full CHUNK_BYTES piece (no stream of
        empty or tiny pieces)."""
        data = message.data  # read once: each read of a bytes field makes a new copy
        self.total += len(data)
        if self.total > self.header.payload_size:
            raise RpcAbort(grpc.StatusCode.INVALID_ARGUMENT, f"pushed slices exceed the signed payload size {self.header.payload_size}",
                           swarm_pb2.INVALID_UPDATE)
        if message.start:
            proof = tuple(message.proof)
            if not 0 <= message.slice < self.header.num_slices or message.slice in self.started:
                raise RpcAbort(grpc.StatusCode.INVALID_ARGUMENT, f"slice {message.slice} pushed twice or not one of the update's "
                                                                 f"{self.header.num_slices}", swarm_pb2.MALFORMED)
            if len(proof) > self.max_proof or any(len(h) != 32 for h in proof):
                raise RpcAbort(grpc.StatusCode.INVALID_ARGUMENT, f"slice {message.slice}: a proof of {len(proof)} siblings, "
                                                                 f"at most {self.max_proof} of 32 bytes", swarm_pb2.MALFORMED)
            self.started.add(message.slice)
            self.parts.append((message.slice, proof, [data]))
            return
        if not self.parts:
            if data:
                raise RpcAbort(grpc.StatusCode.INVALID_ARGUMENT, "slice data before any slice started", swarm_pb2.MALFORMED)
            return  # the first message's header (and request), no piece
        if not data or len(self.parts[-1][2][-1]) != CHUNK_BYTES:
            raise RpcAbort(grpc.StatusCode.INVALID_ARGUMENT, "a slice continued after a piece short of CHUNK_BYTES, or an empty piece",
                           swarm_pb2.MALFORMED)
        self.parts[-1][2].append(data)

    def proven(self) -> tuple[list[tuple[int, str, tuple[bytes, ...], bytes]], list[int]]:
        """-> (each slice whose proof puts it under the header's root: (index, sha256 hex, proof,
        bytes); the indices of those whose proof fails)."""
        header, root = self.header, self.header.root_bytes()
        kept, refused = [], []
        for index, proof, pieces in self.parts:
            data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            digest = hashlib.sha256(data).digest()
            if merkle.verify(digest, index, header.num_slices, proof, root):
                kept.append((index, digest.hex(), proof, data))
            else:
                refused.append(index)
        return kept, refused
