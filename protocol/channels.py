"""The one place where gRPC channels and servers are created, with every option in view.

Message size limits, keepalive, per-call deadlines and optional TLS live here so that no other
module configures gRPC by hand. Payloads travel in chunks of at most CHUNK_BYTES, so the message
size limit only has to fit one chunk plus headers.
"""

from __future__ import annotations

from concurrent import futures
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import grpc

from protocol.accounting import ByteCounter, counting_interceptors, server_counting_interceptor

CHUNK_BYTES = 1 << 20  # 1 MiB of data per streamed message (DESIGN.md: chunks <= 1 MiB)
MAX_MESSAGE_BYTES = CHUNK_BYTES + (64 << 10)  # one chunk plus room for headers and signatures

# Deadlines for calls. Long-polls pass their own (wait + DEFAULT).
DEFAULT_DEADLINE = timedelta(seconds=10)
CONNECT_TIMEOUT = timedelta(seconds=5)
TRANSFER_DEADLINE = timedelta(seconds=120)  # a whole payload or checkpoint stream


def _options() -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", 20_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.http2.min_time_between_pings_ms", 10_000),
        ("grpc.enable_retries", 1),
        ("grpc.so_reuseport", 0),  # a second server on the same port must fail loudly
    ]


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """Optional TLS for the data plane (`--tls-cert/--tls-key/--tls-ca`)."""

    cert_path: str | None = None
    key_path: str | None = None
    ca_path: str | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.cert_path or self.ca_path)

    def server_credentials(self) -> grpc.ServerCredentials:
        if not (self.cert_path and self.key_path):
            raise ValueError("TLS server needs both --tls-cert and --tls-key")
        pair = (Path(self.key_path).read_bytes(), Path(self.cert_path).read_bytes())
        return grpc.ssl_server_credentials([pair])

    def channel_credentials(self) -> grpc.ChannelCredentials:
        root = Path(self.ca_path).read_bytes() if self.ca_path else None
        return grpc.ssl_channel_credentials(root_certificates=root)


def create_server(
    counter: ByteCounter | None = None,
    *,
    max_workers: int = 16,
    tls: TlsConfig | None = None,
    host: str = "0.0.0.0",
    port: int = 0,
) -> tuple[grpc.Server, int]:
    """Create a server bound to host:port (0 = any free port) and return (server, bound port).

    Services must be added before `server.start()`. Raises OSError with advice when the port
    cannot be bound.
    """
    interceptors = [server_counting_interceptor(counter)] if counter is not None else []
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="swarmloco-rpc"),
        interceptors=interceptors,
        options=_options(),
        maximum_concurrent_rpcs=max_workers * 4,
    )
    address = f"{host}:{port}"
    try:
        if tls is not None and tls.enabled:
            bound = server.add_secure_port(address, tls.server_credentials())
        else:
            bound = server.add_insecure_port(address)
    except RuntimeError as exc:  # grpc raises RuntimeError when it cannot bind
        raise OSError(f"cannot listen on {address}: {exc}; is the port already in use? pick another with --port") from None
    if bound == 0:
        raise OSError(f"cannot listen on {address}: is the port already in use? pick another with --port")
    return server, bound


def create_channel(
    target: str,
    counter: ByteCounter | None = None,
    *,
    remote_peer: str | None = None,
    tls: TlsConfig | None = None,
) -> grpc.Channel:
    """A channel to HOST:PORT; every call through it is counted under `remote_peer` (default: target)."""
    if tls is not None and tls.enabled:
        channel = grpc.secure_channel(target, tls.channel_credentials(), options=_options())
    else:
        channel = grpc.insecure_channel(target, options=_options())
    if counter is not None:
        channel = grpc.intercept_channel(channel, *counting_interceptors(counter, remote_peer or target))
    return channel


def wait_ready(channel: grpc.Channel, target: str, timeout: timedelta = CONNECT_TIMEOUT) -> None:
    """Block until the channel connects; raise ConnectionError with advice otherwise."""
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout.total_seconds())
    except grpc.FutureTimeoutError:
        raise ConnectionError(
            f"cannot reach {target} within {timeout.total_seconds():.0f}s: is the process running and the port open? "
            "check the address, firewalls, and that the coordinator printed this port"
        ) from None
