"""Client side of the data plane: fetch one object (a payload or a piece of one by sha256, a slice
with its proof) from any holder, resuming on failure. Many objects from one holder in one stream,
every holder at once: protocol/batched_fetch.py."""

from __future__ import annotations

import hashlib
import logging
import random
import threading
from datetime import timedelta
from dataclasses import dataclass
from typing import Callable, Sequence

import grpc

from protocol import merkle
from protocol._generated import swarm_pb2, swarm_pb2_grpc
from protocol.accounting import ByteCounter
from protocol.aio_channels import AioChannels, PoolClosed
from protocol.channels import STALL_TIMEOUT, TRANSFER_DEADLINE, TlsConfig, create_channel
from protocol.envelope import UpdateHeader
from protocol.stall_watch import STALLS
from protocol.streaming import TransferError, receive_chunks

log = logging.getLogger("swarmloco.fetch")


class ChannelPool:
    """One channel per remote endpoint, reused across calls (HTTP/2 multiplexes them).

    `tls`: None = the process-wide setting (protocol/channels.py, configure_tls)."""

    def __init__(self, counter: ByteCounter | None = None, tls: TlsConfig | None = None) -> None:
        self.counter = counter
        self.tls = tls
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[str, swarm_pb2_grpc.PeerStub] = {}  # building a stub costs ms: one per channel
        # The batched fetches' channels (protocol/batched_fetch.py): every stream of a phase on one
        # event loop; its thread starts on the first batched fetch.
        self.aio = AioChannels(tls)
        self._closed = False

    def get(self, target: str) -> grpc.Channel:
        """The channel to `target`; PoolClosed once the pool is closed (no channel is made anew)."""
        with self._lock:
            if self._closed:
                raise PoolClosed()
            channel = self._channels.get(target)
            if channel is None:
                channel = create_channel(target, self.counter, tls=self.tls)
                self._channels[target] = channel
            return channel

    def peer_stub(self, target: str) -> swarm_pb2_grpc.PeerStub:
        channel = self.get(target)
        with self._lock:
            stub = self._stubs.get(target)
            if stub is None:
                stub = self._stubs[target] = swarm_pb2_grpc.PeerStub(channel)
            return stub

    def close(self) -> None:
        with self._lock:
            self._closed = True
            channels, self._channels, self._stubs = list(self._channels.values()), {}, {}
        for channel in channels:
            channel.close()
        self.aio.close()


class FetchError(IOError):
    pass


def fetch_payload(
    pool: ChannelPool,
    holders: Sequence[str],
    header: UpdateHeader,
    *,
    deadline: timedelta = TRANSFER_DEADLINE,
    shuffle: bool = False,
) -> bytes:
    """Fetch header's whole payload from any holder, verified against the signed header."""
    return fetch_blob(pool, holders, header.payload_sha256, header.payload_size, deadline=deadline, shuffle=shuffle)


def fetch_blob(
    pool: ChannelPool,
    holders: Sequence[str],
    sha256: str,
    size: int,
    *,
    exact: bool = True,
    deadline: timedelta = TRANSFER_DEADLINE,
    stall: timedelta = STALL_TIMEOUT,
    shuffle: bool = False,
) -> bytes:
    """Fetch the object with this sha256 and exact size (a payload, an aggregated slice, a part
    of the checkpoint) from the first holder that has it, resuming a broken stream at the byte
    it broke on (from the same or the next holder). Never reads past `size`. exact=False: `size`
    only bounds the object; its sha256 pins the bytes, and so their length, either way."""
    # asked for by its raw digest, and the holder need not repeat it in its chunks: we check the bytes against it
    try:
        digest = bytes.fromhex(sha256)
    except ValueError:
        raise FetchError(f"not a sha256 to fetch: {sha256[:70]!r}") from None
    request = lambda offset: swarm_pb2.FetchRequest(digest=digest, offset=offset, omit_sha256=True)  # noqa: E731
    data, _ = _fetch(pool, holders, request, size, exact=exact, sha256=sha256, deadline=deadline, shuffle=shuffle, stall=stall)
    return data


@dataclass(frozen=True, slots=True)
class FetchedSlice:
    data: bytes
    digest: str  # sha256 hex of `data`: the leaf the proof put under the signed root
    proof: tuple[bytes, ...]  # its whole proof (rebuilt from the proven nodes when a short one came): to serve it on


def fetch_slice(
    pool: ChannelPool,
    holders: Sequence[str],
    header: UpdateHeader,
    index: int,
    *,
    max_size: int,
    proven: merkle.ProvenNodes | None = None,
    deadline: timedelta = TRANSFER_DEADLINE,
    shuffle: bool = False,
) -> FetchedSlice:
    """Slice `index` of the update `header` signed, from the first holder that serves it with a
    Merkle proof that puts sha256(its bytes) under the header's `slices_root` at that index; a
    holder whose proof does not hold is refused and the next one tried. `max_size` bounds the
    slice (its codec's longest) before anything is read. A slice is small: a broken stream is
    fetched again whole from the next holder rather than resumed (nothing declares its digest).
    `proven`: what earlier slices of this root proved (one per root, shared by its fetches): only
    the siblings below it are asked for."""
    root = header.root_bytes()
    if not 0 <= index < header.num_slices:
        raise FetchError(f"slice {index} outside the header's 0..{header.num_slices - 1}")
    if proven is None or (proven.root, proven.count) != (root, header.num_slices):
        proven = merkle.ProvenNodes(root, header.num_slices)
    levels = proven.levels_for(index)
    leaf: list[bytes] = []  # the accepted bytes' sha256, hashed once

    def check_proof(data: bytes, first: swarm_pb2.Chunk) -> None:
        leaf[:] = [hashlib.sha256(data).digest()]
        if not proven.accept(leaf[0], index, list(first.proof)):
            raise TransferError(f"the holder's Merkle proof of slice {index} does not verify against the root "
                                f"{header.peer_id[:8]} signed (a wrong or tampered slice)")

    request = lambda offset: swarm_pb2.FetchRequest(slice=index, slices_root=root, proof_levels=levels,  # noqa: E731
                                                    offset=offset)
    data, first = _fetch(pool, holders, request, max_size, exact=False, sha256=None, deadline=deadline, shuffle=shuffle,
                         verify=check_proof)
    return FetchedSlice(data=data, digest=leaf[0].hex(), proof=tuple(proven.proof_of(index) or ()))


def _fetch(pool: ChannelPool, holders: Sequence[str], request: Callable[[int], swarm_pb2.FetchRequest], size: int, *,
           exact: bool, sha256: str | None, deadline: timedelta, shuffle: bool, stall: timedelta = STALL_TIMEOUT,
           verify: Callable[[bytes, swarm_pb2.Chunk], None] | None = None) -> tuple[bytes, swarm_pb2.Chunk]:
    """The holder loop both fetches share: each holder in turn; an object whose sha256 is known
    resumes at the byte a broken stream broke on (from the same or the next holder). A holder that
    sends nothing for `stall` is cut off, and one cut off so within its stall bound (a batched fetch
    just was) is not asked: the next holder is (protocol/stall_watch.py)."""
    order = list(dict.fromkeys(h for h in holders if h))
    if shuffle:
        random.shuffle(order)
    if not order:
        raise FetchError("no holder endpoint to fetch from")
    received = b""
    errors = []
    for holder in order:
        if STALLS.stalled(holder):
            errors.append(f"{holder}: sent nothing for a while just now: not asked again yet")
            continue
        stub = pool.peer_stub(holder)
        watched = None
        try:
            stream = stub.FetchPayload(request(len(received)), timeout=deadline.total_seconds())
            watched = STALLS.watch(stream, holder, stall.total_seconds())
            data, first = receive_chunks(watched.messages(), max_size=size, expected_size=size if exact else None,
                                         expected_sha256=sha256, prefix=received, verify=verify)
            return data, first  # receive_chunks checked the size, and the sha256 or the proof
        except TransferError as exc:
            received = exc.received if sha256 is not None and len(exc.received) < size else b""
            errors.append(f"{holder}: {watched.why() if watched is not None and watched.stalled else exc}")
        except Exception as exc:  # any other failure of this holder: try the next one
            errors.append(f"{holder}: {exc}")
        finally:
            if watched is not None:
                STALLS.done(watched)
    raise FetchError("; ".join(errors))
