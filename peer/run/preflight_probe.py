"""The measurements of `swarmloco preflight` against a coordinator's Preflight service.

RTT: the median of a few tiny Ping calls on a warm channel. Throughput: a bounded bulk
transfer each way (ProbeDownload / ProbeUpload), timed from the first chunk to the last, so
connection setup and the first chunk's latency are not counted; a small first transfer sizes
the real one to take about `target_s`. Dial-back: this machine listens on the port it would
announce, the coordinator connects to it (on this machine's address as it sees it) and writes a
nonce; only a connection that delivers the nonce counts.
"""

from __future__ import annotations

import os
import socket
import statistics
import threading
import time
from typing import Iterator

from protocol.wire import swarm_pb2, swarm_pb2_grpc

PROBE_CHUNK = 64 << 10
MIN_PROBE = 512 << 10
MAX_PROBE = 48 << 20


def measure_rtt(stub: swarm_pb2_grpc.PreflightStub, pings: int = 9) -> float:
    stub.Ping(swarm_pb2.PingRequest(), timeout=10)  # warm the channel first
    samples = []
    for _ in range(pings):
        t0 = time.perf_counter()
        stub.Ping(swarm_pb2.PingRequest(), timeout=10)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def _download(stub: swarm_pb2_grpc.PreflightStub, size: int) -> tuple[int, float]:
    """(bytes after the first chunk, seconds from the first chunk to the last)."""
    first_at = last_at = None
    counted = 0
    for chunk in stub.ProbeDownload(swarm_pb2.ProbeDownloadRequest(size=size, chunk_bytes=PROBE_CHUNK), timeout=120):
        now = time.perf_counter()
        if first_at is None:
            first_at = now
        else:
            counted += len(chunk.data)
        last_at = now
    return counted, (last_at - first_at) if first_at is not None else 0.0


def _upload(stub: swarm_pb2_grpc.PreflightStub, size: int) -> tuple[int, float]:
    block = os.urandom(PROBE_CHUNK)

    def chunks() -> Iterator[swarm_pb2.Chunk]:
        for offset in range(0, size, PROBE_CHUNK):
            yield swarm_pb2.Chunk(data=block[: min(PROBE_CHUNK, size - offset)], offset=offset, total_size=size)

    reply = stub.ProbeUpload(chunks(), timeout=120)
    return reply.bytes - reply.first_chunk_bytes, reply.seconds


def measure_throughput(stub: swarm_pb2_grpc.PreflightStub, direction: str, target_s: float = 3.0) -> dict[str, float]:
    """Bytes per second one way ('download' or 'upload'): a sizing transfer, then one of ~target_s."""
    transfer = _download if direction == "download" else _upload
    counted, seconds = transfer(stub, MIN_PROBE)
    rate = counted / max(seconds, 1e-6)
    size = int(min(MAX_PROBE, max(MIN_PROBE, rate * target_s)))
    counted, seconds = transfer(stub, size)
    return {"bytes_per_s": counted / max(seconds, 1e-6), "bytes": counted, "seconds": seconds}


class DialBackListener:
    """Listens on host:port and records whether a connection delivered the expected nonce."""

    def __init__(self, host: str, port: int) -> None:
        self.nonce = os.urandom(16)
        self.received = threading.Event()
        self.sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((host, port))
        except OSError as exc:
            self.sock.close()
            raise OSError(f"cannot listen on {host}:{port} for the dial-back check: {exc}; is a peer already using it? "
                          "pick the port you will announce with --port") from None
        self.sock.listen(4)
        self.sock.settimeout(0.2)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._accept, name="swarmloco-dial-back", daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(2.0)
                data = b""
                try:
                    while len(data) < len(self.nonce) and (piece := conn.recv(64)):
                        data += piece
                except OSError:
                    continue
                if data[: len(self.nonce)] == self.nonce:
                    self.received.set()

    def close(self) -> None:
        self.stop.set()
        self.sock.close()
        self.thread.join(timeout=2)


def check_dial_back(stub: swarm_pb2_grpc.PreflightStub, host: str, port: int) -> dict[str, object]:
    listener = DialBackListener(host, port)
    try:
        reply = stub.DialBack(swarm_pb2.DialBackRequest(port=port, nonce=listener.nonce), timeout=15)
        reached = reply.connected and listener.received.wait(3.0)
        error = reply.error or ("" if reached else "a connection arrived but did not carry this check's nonce: another "
                                                   "machine answers on that address (port forwarding to elsewhere?)")
        return {"reachable": bool(reached), "address": reply.address, "error": error, "connect_s": reply.seconds}
    finally:
        listener.close()
