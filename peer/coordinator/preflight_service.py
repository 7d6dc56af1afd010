"""The coordinator's side of `swarmloco preflight`: ping, bounded bulk transfers, dial-back.

Anyone may call these before joining (no identity yet), so every call is bounded: a transfer
carries at most MAX_PROBE_BYTES, at most MAX_CONCURRENT run at once, a caller's address gets a
small budget of transfers per minute, and a dial-back only ever connects to the caller's own
address (the coordinator cannot be pointed at a third machine's port).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any, Iterator

import grpc

from protocol.ratelimit import CallerLimits
from protocol.rpc_errors import RpcAbort, guarded, host_of
from protocol.wire import swarm_pb2, swarm_pb2_grpc

MAX_PROBE_BYTES = 64 << 20
MAX_CHUNK_BYTES = 256 << 10
MIN_CHUNK_BYTES = 4 << 10
MAX_CONCURRENT = 2
DIAL_TIMEOUT_S = 3.0
PING_COST = 0.05  # of one transfer's budget

_limited = guarded(lambda s: s.limits, lambda s, reason: s.reject(reason))
_limited_ping = guarded(lambda s: s.limits, lambda s, reason: s.reject(reason), cost=PING_COST)
_limited_stream = guarded(lambda s: s.limits, lambda s, reason: s.reject(reason), streaming=True, max_stream_s=lambda s: s.max_stream_s)


def dial_address(caller: str, port: int) -> tuple[str, int]:
    """'ipv4:10.0.0.5' / 'ipv6:[::1]' (grpc's peer string without its port) -> (host, port)."""
    kind, _, host = caller.partition(":")
    if kind not in ("ipv4", "ipv6") or not host:
        raise RpcAbort(grpc.StatusCode.FAILED_PRECONDITION, f"cannot dial back a caller at {caller!r} (not an IP address)",
                       swarm_pb2.MALFORMED)
    return host.strip("[]"), port


def dial(host: str, port: int, nonce: bytes = b"", timeout_s: float = DIAL_TIMEOUT_S) -> swarm_pb2.DialBackReply:
    """Open a TCP connection to host:port and write `nonce` on it: whether it connected, in how
    long, and why not. Preflight's dial-back, and the Join's check of a peer's announced endpoint
    (peer/coordinator/service.py)."""
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    started = time.monotonic()
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as conn:
            conn.sendall(nonce[:64])
    except OSError as exc:
        return swarm_pb2.DialBackReply(connected=False, address=address, error=f"{type(exc).__name__}: {exc}",
                                       seconds=time.monotonic() - started)
    return swarm_pb2.DialBackReply(connected=True, address=address, seconds=time.monotonic() - started)


class PreflightServicer(swarm_pb2_grpc.PreflightServicer):
    def __init__(self, coordinator: Any, *, transfers_per_minute: float = 12.0, max_stream_s: float = 60.0) -> None:
        self.coordinator = coordinator
        self.limits = CallerLimits(per_peer_rate=transfers_per_minute / 60, per_peer_burst=transfers_per_minute, host_factor=1.0)
        self.transfers = threading.BoundedSemaphore(MAX_CONCURRENT)
        self.max_stream_s = max_stream_s

    def reject(self, reason: str) -> None:
        self.coordinator.registry.reject(f"preflight-{reason}")

    def _slot(self) -> None:
        if not self.transfers.acquire(blocking=False):
            raise RpcAbort(grpc.StatusCode.RESOURCE_EXHAUSTED, "another preflight is measuring right now: retry in a minute",
                           swarm_pb2.BUSY)

    @_limited_ping
    def Ping(self, request, context):
        return swarm_pb2.PingReply(round=self.coordinator.round)

    @_limited_stream
    def ProbeDownload(self, request, context) -> Iterator[swarm_pb2.Chunk]:
        size = max(0, min(request.size, MAX_PROBE_BYTES))
        chunk = max(MIN_CHUNK_BYTES, min(request.chunk_bytes or MAX_CHUNK_BYTES, MAX_CHUNK_BYTES))
        self._slot()
        try:
            block = os.urandom(chunk)  # incompressible, in case a link compresses
            for offset in range(0, size, chunk):
                yield swarm_pb2.Chunk(data=block[: min(chunk, size - offset)], offset=offset, total_size=size)
        finally:
            self.transfers.release()

    @_limited
    def ProbeUpload(self, request_iterator, context):
        self._slot()
        try:
            received = first = 0
            started = last = None
            for chunk in request_iterator:
                now = time.monotonic()
                if started is None:
                    started, first = now, len(chunk.data)
                last = now
                received += len(chunk.data)
                if received > MAX_PROBE_BYTES:
                    raise RpcAbort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"an upload probe may carry at most {MAX_PROBE_BYTES} bytes",
                                   swarm_pb2.MALFORMED)
            seconds = (last - started) if started is not None else 0.0
            return swarm_pb2.ProbeUploadReply(bytes=received, seconds=seconds, first_chunk_bytes=first)
        finally:
            self.transfers.release()

    @_limited
    def DialBack(self, request, context):
        if not 0 < request.port < 65536:
            raise RpcAbort(grpc.StatusCode.INVALID_ARGUMENT, "port must be in 1..65535", swarm_pb2.MALFORMED)
        return dial(*dial_address(host_of(context), request.port), nonce=bytes(request.nonce))
