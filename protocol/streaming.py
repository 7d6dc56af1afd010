"""Chunked transfer of large byte strings (payloads, checkpoints) over gRPC streams.

The receiver knows the exact size to expect before it reads (from a signed header, or the first
chunk's declared total checked against an upper bound) and refuses the moment a stream goes past
it, so an attacker cannot make it buffer more than it agreed to.
"""

from __future__ import annotations

import hashlib
from typing import Callable, Iterable, Iterator, Sequence

from protocol._generated import swarm_pb2
from protocol.channels import CHUNK_BYTES


class TransferError(IOError):
    """A stream that broke or broke the rules; `received` holds the valid prefix for resuming."""

    def __init__(self, message: str, received: bytes = b""):
        super().__init__(message)
        self.received = received


def iter_chunks(data: bytes, *, offset: int = 0, round_: int = 0, sha256: str | None = "",
                proof: Sequence[bytes] = (), chunk_bytes: int = CHUNK_BYTES) -> Iterator[swarm_pb2.Chunk]:
    """Yield `data[offset:]` in messages of at most chunk_bytes; `proof` (a slice's Merkle proof)
    rides on the first one. sha256=None: declare no digest (a slice: the receiver hashes the bytes
    into the leaf its proof must put under the signed root, so 64 characters a slice are saved)."""
    digest = "" if sha256 is None else sha256 or hashlib.sha256(data).hexdigest()
    total = len(data)
    if offset >= total:
        yield swarm_pb2.Chunk(data=b"", offset=total, total_size=total, sha256=digest, round=round_, proof=proof)
        return
    for start in range(offset, total, chunk_bytes):
        yield swarm_pb2.Chunk(
            data=data[start : start + chunk_bytes], offset=start, total_size=total, sha256=digest, round=round_,
            proof=proof if start == offset else (),
        )


def receive_chunks(
    chunks: Iterable[swarm_pb2.Chunk],
    *,
    max_size: int,
    expected_size: int | None = None,
    expected_sha256: str | None = None,
    prefix: bytes = b"",
    verify: Callable[[bytes, swarm_pb2.Chunk], None] | None = None,
) -> tuple[bytes, swarm_pb2.Chunk | None]:
    """Assemble a stream; returns (data, first chunk). `prefix` resumes an earlier broken transfer.
    `verify(data, first chunk)` replaces the check against the declared sha256 (a slice: its
    Merkle proof) and raises TransferError to refuse what arrived.

    Raises TransferError (carrying the valid prefix) on any violation or a broken stream.
    """
    buffer = bytearray(prefix)
    first: swarm_pb2.Chunk | None = None
    try:
        for chunk in chunks:
            if first is None:
                first = chunk
                total = chunk.total_size
                if expected_size is not None and total != expected_size:
                    raise TransferError(f"sender declares {total} bytes, expected {expected_size}")
                if not 0 <= total <= max_size:
                    raise TransferError(f"sender declares {total} bytes, more than the limit of {max_size}")
                if expected_sha256 is not None and chunk.sha256 not in ("", expected_sha256):
                    raise TransferError("sender offers a different object than the one requested")
            elif chunk.total_size != first.total_size or chunk.sha256 != first.sha256:
                raise TransferError("stream changed its declared size or hash midway")
            if chunk.offset != len(buffer):
                raise TransferError(f"chunk at offset {chunk.offset}, expected {len(buffer)}")
            if len(buffer) + len(chunk.data) > first.total_size:
                raise TransferError("sender sent more bytes than it declared")
            buffer.extend(chunk.data)
    except TransferError as exc:
        raise TransferError(str(exc), bytes(buffer)) from None
    except Exception as exc:  # grpc.RpcError and friends: keep what arrived for a resume
        raise TransferError(f"transfer broke after {len(buffer)} bytes: {exc}", bytes(buffer)) from None
    if first is None:
        raise TransferError("stream ended before any data")
    if len(buffer) != first.total_size:
        raise TransferError(f"stream ended at {len(buffer)} of {first.total_size} bytes", bytes(buffer))
    if verify is not None:
        verify(bytes(buffer), first)
    elif hashlib.sha256(buffer).hexdigest() != (first.sha256 or expected_sha256):  # a chunk may leave out the sha256 asked for
        raise TransferError("received bytes do not match the declared sha256")
    return bytes(buffer), first
