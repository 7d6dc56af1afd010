"""Client side of the data plane: fetch a payload by sha256 from any holder, resuming on failure."""

from __future__ import annotations

import random
import threading
from datetime import timedelta
from typing import Sequence

import grpc

from protocol._generated import swarm_pb2, swarm_pb2_grpc
from protocol.accounting import ByteCounter
from protocol.channels import TRANSFER_DEADLINE, TlsConfig, create_channel
from protocol.envelope import UpdateHeader
from protocol.streaming import TransferError, receive_chunks


class ChannelPool:
    """One channel per remote endpoint, reused across calls (HTTP/2 multiplexes them).

    `tls`: None = the process-wide setting (protocol/channels.py, configure_tls)."""

    def __init__(self, counter: ByteCounter | None = None, tls: TlsConfig | None = None) -> None:
        self.counter = counter
        self.tls = tls
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[str, swarm_pb2_grpc.PeerStub] = {}  # building a stub costs ms: one per channel

    def get(self, target: str) -> grpc.Channel:
        with self._lock:
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

    def drop(self, target: str) -> None:
        with self._lock:
            self._stubs.pop(target, None)
            channel = self._channels.pop(target, None)
        if channel is not None:
            channel.close()

    def close(self) -> None:
        with self._lock:
            channels, self._channels, self._stubs = list(self._channels.values()), {}, {}
        for channel in channels:
            channel.close()


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
    shuffle: bool = False,
) -> bytes:
    """Fetch the object with this sha256 and exact size (a payload, one slice of it, an
    aggregated slice) from the first holder that has it, resuming a broken stream at the byte
    it broke on (from the same or the next holder). Never reads past `size`. exact=False: `size`
    only bounds the object (a slice of a payload whose codec has a variable length); its sha256
    pins the bytes, and so their length, either way."""
    order = list(dict.fromkeys(h for h in holders if h))
    if shuffle:
        random.shuffle(order)
    if not order:
        raise FetchError("no holder endpoint to fetch from")
    received = b""
    errors = []
    for holder in order:
        stub = pool.peer_stub(holder)
        try:
            stream = stub.FetchPayload(
                swarm_pb2.FetchRequest(sha256=sha256, offset=len(received)),
                timeout=deadline.total_seconds(),
            )
            data, _ = receive_chunks(
                stream,
                max_size=size,
                expected_size=size if exact else None,
                expected_sha256=sha256,
                prefix=received,
            )
            return data  # receive_chunks checked the size and the sha256
        except TransferError as exc:
            received = exc.received if len(exc.received) < size else b""
            errors.append(f"{holder}: {exc}")
        except Exception as exc:  # any other failure of this holder: try the next one
            errors.append(f"{holder}: {exc}")
    raise FetchError("; ".join(errors))
