"""The one place where gRPC channels and servers are created, with every option in view.

Message size limits, keepalive, per-call deadlines and optional TLS live here so that no other
module configures gRPC by hand. Payloads travel in chunks of at most CHUNK_BYTES, so the message
size limit only has to fit one chunk plus headers.

TLS is a process-wide setting: the CLI calls `configure_tls(TlsConfig(...))` once, from
`--tls-cert/--tls-key/--tls-ca`, before anything makes a channel or a server, and every server
and channel this process creates afterwards (coordinator server, a peer's payload server, the
coordinator client, the peer-to-peer ChannelPool, `swarmloco status`) uses it, unless a caller
passes its own `tls`. Node and coordinator code needs no TLS plumbing, and no channel can be
made in plaintext by forgetting to pass a flag along. The setting is server-authenticated TLS
(flower's habit): a process that serves (coordinator, a peer without --client-mode) presents a
certificate for the host others dial, signed by a CA every client trusts (`--tls-ca`); callers
are authenticated by their Ed25519 signatures, not by client certificates. When a channel does
not connect, `wait_ready` tells a TLS mismatch (plaintext client and TLS server, an untrusted
certificate, TLS client and plaintext server) apart from an unreachable address.
"""

from __future__ import annotations

import functools
import socket
import ssl
import time
from concurrent import futures
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc

from protocol.accounting import ByteCounter, async_server_counting_interceptor, counting_interceptors, server_counting_interceptor
from protocol.aio_server import AsyncServer

CHUNK_BYTES = 1 << 20  # 1 MiB of data per streamed message (DESIGN.md: chunks <= 1 MiB)
MAX_MESSAGE_BYTES = CHUNK_BYTES + (64 << 10)  # one chunk plus room for headers and signatures
PART_OVERHEAD = 64  # bytes a packed part (Chunk.parts, SlicePush.parts) may add beyond its data and proof: tags, lengths, index

# Deadlines for calls. Long-polls pass their own (wait + DEFAULT).
DEFAULT_DEADLINE = timedelta(seconds=10)
CONNECT_TIMEOUT = timedelta(seconds=5)
TRANSFER_DEADLINE = timedelta(seconds=120)  # a whole payload or checkpoint stream
STALL_TIMEOUT = timedelta(seconds=5)  # a data stream that brings nothing this long is cut off (protocol/stall_watch.py)


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


class TlsError(ValueError):
    """A --tls-* flag is missing its partner, or names a file that is missing, unreadable or not
    what the flag says; the message names the flag and what to pass."""


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """TLS for every gRPC server and channel (`--tls-cert/--tls-key/--tls-ca`).

    cert_path + key_path: this process's certificate (PEM, naming the host others dial) and its
    private key, for the servers it runs. ca_path: the CA certificate (PEM) that signed the
    certificates of the processes it dials; without it, the system's CAs are trusted."""

    cert_path: str | None = None
    key_path: str | None = None
    ca_path: str | None = None

    def __post_init__(self) -> None:
        if self.key_path and not self.cert_path:
            raise TlsError("--tls-key needs --tls-cert: pass the certificate that goes with the key")
        if self.cert_path and not self.key_path:
            raise TlsError("--tls-cert needs --tls-key: pass the certificate's private key")

    @property
    def enabled(self) -> bool:
        return bool(self.cert_path or self.ca_path)

    def check(self) -> None:
        """Read every file now and check it is what its flag says (raise TlsError otherwise), so
        that a bad path fails at start-up rather than at the first connection."""
        for flag, path in (("--tls-cert", self.cert_path), ("--tls-key", self.key_path), ("--tls-ca", self.ca_path)):
            if path:
                _read(flag, path)
        if self.cert_path and self.key_path:
            try:
                ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(self.cert_path, self.key_path)
            except ssl.SSLError as exc:
                raise TlsError(f"--tls-cert {self.cert_path} and --tls-key {self.key_path} are not a PEM certificate "
                               f"and its private key ({exc.reason or exc}); pass the pair your CA issued") from None
        if self.ca_path:
            try:
                ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=self.ca_path)
            except ssl.SSLError as exc:
                raise TlsError(f"--tls-ca {self.ca_path} is not a PEM CA certificate ({exc.reason or exc})") from None

    def check_serves(self) -> None:
        """Raise TlsError unless this config can run a server (certificate and key)."""
        if not (self.cert_path and self.key_path):
            raise TlsError(
                "TLS is on and this process serves gRPC (a coordinator, or a peer without --client-mode): pass --tls-cert "
                "and --tls-key, a certificate for the address others dial (--announce-host) signed by the swarm's CA; "
                "a peer with only --tls-ca must run with --client-mode"
            )

    def server_credentials(self) -> grpc.ServerCredentials:
        self.check_serves()
        return _server_credentials(self)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return _channel_credentials(self)


def _read(flag: str, path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise TlsError(f"{flag} {path}: no such file") from None
    except OSError as exc:
        raise TlsError(f"{flag} {path}: cannot read it ({exc.strerror or exc})") from None


# Built on first use, after the DHT has forked (gRPC objects must not exist before a fork), and
# once per process rather than per channel.
@functools.cache
def _server_credentials(tls: TlsConfig) -> grpc.ServerCredentials:
    assert tls.cert_path and tls.key_path
    return grpc.ssl_server_credentials([(_read("--tls-key", tls.key_path), _read("--tls-cert", tls.cert_path))])


@functools.cache
def _channel_credentials(tls: TlsConfig) -> grpc.ChannelCredentials:
    root = _read("--tls-ca", tls.ca_path) if tls.ca_path else None
    return grpc.ssl_channel_credentials(root_certificates=root)


_process_tls: TlsConfig | None = None


def configure_tls(tls: TlsConfig | None, *, serves: bool = False) -> None:
    """Use `tls` for every server and channel this process creates from now on (None or a
    config without files: plaintext). Checks the files first, and with `serves` (the process
    will run a server) that there is a certificate; raises TlsError."""
    global _process_tls
    if tls is not None and tls.enabled:
        tls.check()
        if serves:
            tls.check_serves()
        _process_tls = tls
    else:
        _process_tls = None


def process_tls() -> TlsConfig | None:
    """The process-wide TLS setting (None: plaintext)."""
    return _process_tls


def _tls_for(tls: TlsConfig | None) -> TlsConfig | None:
    """A caller's own setting, else the process-wide one; None when TLS is off."""
    chosen = _process_tls if tls is None else tls
    return chosen if chosen is not None and chosen.enabled else None


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
    cannot be bound. `tls`: None = the process-wide setting (`configure_tls`).
    """
    interceptors = [server_counting_interceptor(counter)] if counter is not None else []
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="swarmloco-rpc"),
        interceptors=interceptors,
        options=_options(),
        maximum_concurrent_rpcs=max_workers * 4,
    )
    return server, _bind(server, host, port, tls)


MAX_ASYNC_CALLS = 16_384  # calls an async server holds at once (parked long-polls included); more: RESOURCE_EXHAUSTED


def create_async_server(
    counter: ByteCounter | None = None,
    *,
    max_workers: int = 16,
    tls: TlsConfig | None = None,
    host: str = "0.0.0.0",
    port: int = 0,
) -> tuple[AsyncServer, int]:
    """create_server's twin for a server whose `async def` handlers wait without a thread
    (protocol/aio_server.py: the coordinator's long-polls); plain handlers run on a pool of
    `max_workers` threads as on create_server's server. Same options, TLS, byte accounting and
    errors; returns (server, bound port), the server not started."""
    interceptors = [async_server_counting_interceptor(counter)] if counter is not None else []
    pool = futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="swarmloco-rpc")
    bound: list[int] = []

    def build() -> grpc.aio.Server:
        server = grpc.aio.server(migration_thread_pool=pool, interceptors=interceptors, options=_options(),
                                 maximum_concurrent_rpcs=MAX_ASYNC_CALLS)
        bound.append(_bind(server, host, port, tls))
        return server

    return AsyncServer(build, pool), bound[0]


def _bind(server: grpc.Server | grpc.aio.Server, host: str, port: int, tls: TlsConfig | None) -> int:
    """Add the port (TLS per `tls`, None = the process-wide setting); OSError with advice when it cannot be bound."""
    address = f"{host}:{port}"
    tls = _tls_for(tls)
    try:
        if tls is not None:
            bound = server.add_secure_port(address, tls.server_credentials())
        else:
            bound = server.add_insecure_port(address)
    except RuntimeError:  # grpc raises RuntimeError when it cannot bind; its reason is in its C++ log (swarmloco -v)
        bound = 0
    if bound == 0:
        wildcard = host in ("0.0.0.0", "::", "[::]", "")
        raise OSError(f"cannot listen on {address}: is the port already in use"
                      + ("? pick another --port (0: any free port)" if wildcard else
                         f", or {host} not an address of this machine? pick another --port (0: any free port) or --host")
                      + " (swarmloco -v shows gRPC's own reason)")
    return bound


# A response stream (FetchPayload, StreamCheckpoint, ProbeDownload) is read by the thread that
# iterates it, straight from the call's own completion queue, instead of by a "channel spin"
# thread that gRPC starts for each burst of calls and that hands every message over to the
# reader (a thread start per call and a thread hop per message). Issue 24: the sliced exchange at
# 8 peers x 1M floats on 2 cores, 0.72-0.83 s -> 0.52-0.56 s per round (same CPU). Our streams are
# only ever iterated (one reader each) and cancelled; result() and friends, which this mode
# refuses before the call completes, are never called on them.
SINGLE_THREADED_STREAMS = ("SingleThreadedUnaryStream", 1)  # grpc.experimental.ChannelOptions.SingleThreadedUnaryStream


def create_channel(
    target: str,
    counter: ByteCounter | None = None,
    *,
    remote_peer: str | None = None,
    tls: TlsConfig | None = None,
) -> grpc.Channel:
    """A channel to HOST:PORT; every call through it is counted under `remote_peer` (default: target).
    `tls`: None = the process-wide setting (`configure_tls`)."""
    channel = _open_channel(grpc, target, tls, [*_options(), SINGLE_THREADED_STREAMS])
    if counter is not None:
        channel = grpc.intercept_channel(channel, *counting_interceptors(counter, remote_peer or target))
    return channel


def create_async_channel(target: str, *, tls: TlsConfig | None = None) -> grpc.aio.Channel:
    """create_channel's twin for a grpc.aio channel (protocol/aio_channels.py: call it on the loop that
    will use it). Same options and TLS; no interceptors: its one caller counts its calls and bytes itself
    (protocol/batched_fetch.py)."""
    return _open_channel(grpc.aio, target, tls, _options())


# A channel's connections are its own: with gRPC's process-wide subchannel pool, a new channel to an
# address whose earlier connection was refused (a peer restarted on the same port, a test's server on a
# port a previous one used) shares that subchannel's reconnect backoff and fails at once with "connection
# refused" for up to its backoff while the new server is up (measured: UNAVAILABLE through a fresh channel
# to a freshly started server; with a local pool the call reaches it).
LOCAL_SUBCHANNELS = ("grpc.use_local_subchannel_pool", 1)


def _open_channel(api, target: str, tls: TlsConfig | None, options: list) -> Any:
    """`api` (grpc or grpc.aio)'s channel to target: TLS per `tls` (None: the process-wide setting)."""
    options = [*options, LOCAL_SUBCHANNELS]
    tls = _tls_for(tls)
    if tls is not None:
        return api.secure_channel(target, tls.channel_credentials(), options=options)
    return api.insecure_channel(target, options=options)


PROBE_AFTER = timedelta(seconds=1)  # a channel not up by then is checked for a TLS mismatch


class EndpointUnreachable(ConnectionError):
    """Nothing accepted a connection at the address within the wait (not a TLS mismatch: that is a
    plain ConnectionError saying what to pass)."""


def wait_ready(channel: grpc.Channel, target: str, timeout: timedelta = CONNECT_TIMEOUT, *, tls: TlsConfig | None = None) -> None:
    """Block until the channel connects; raise ConnectionError with advice otherwise.

    `tls`: what the channel was made with (None = the process-wide setting). A channel that is
    not up after PROBE_AFTER is checked once for a TLS mismatch with the other end, which gRPC
    reports only as a connection that never comes up; a mismatch fails at once with what to pass."""
    deadline = time.monotonic() + timeout.total_seconds()
    probed = False
    while True:
        left = deadline - time.monotonic()
        future = grpc.channel_ready_future(channel)
        try:
            future.result(timeout=max(0.0, left if probed else min(left, PROBE_AFTER.total_seconds())))
            return
        except grpc.FutureTimeoutError:
            future.cancel()
        if not probed:
            probed = True
            mismatch = tls_mismatch(target, _tls_for(tls), timeout_s=max(0.5, min(3.0, deadline - time.monotonic())))
            if mismatch:
                raise ConnectionError(mismatch)
        if time.monotonic() >= deadline:
            raise EndpointUnreachable(
                f"cannot reach {target} within {timeout.total_seconds():.0f}s: is the process running and the port open? "
                "check the address, firewalls, and that the coordinator printed this port"
            ) from None


def tls_mismatch(target: str, tls: TlsConfig | None, *, timeout_s: float = 3.0) -> str | None:
    """Why a channel to HOST:PORT cannot connect when the cause is TLS (what to pass instead);
    None when TLS is not the problem or the other end cannot be asked (unreachable, silent)."""
    host, _, port_text = target.rpartition(":")
    host = host.strip("[]")
    try:
        port = int(port_text)
    except ValueError:
        return None
    anything = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # only asks: does the other end speak TLS?
    anything.check_hostname = False
    anything.verify_mode = ssl.CERT_NONE
    speaks_tls = _handshake(anything, host, port, timeout_s)
    if speaks_tls is None:
        return None
    if speaks_tls is not True and tls is None:
        return None  # plaintext both ways: not a TLS problem
    if tls is None:
        return (f"{target} serves TLS, and this process has no TLS settings: pass --tls-ca CA.pem, the CA certificate "
                f"that signed {target}'s certificate (the swarm's operator has it)")
    if speaks_tls is not True:
        return (f"{target} does not serve TLS (plaintext gRPC): leave out the --tls-* flags to reach it, "
                "or restart it with --tls-cert and --tls-key")
    trusting = ssl.create_default_context(cafile=tls.ca_path)  # what gRPC checks: chain and host name
    refused = _handshake(trusting, host, port, timeout_s)
    if isinstance(refused, ssl.SSLCertVerificationError):
        trusted = f"the CA in --tls-ca {tls.ca_path}" if tls.ca_path else "the system's CAs (no --tls-ca given)"
        return (f"{target}'s TLS certificate is not trusted by {trusted}: {refused.verify_message}; pass --tls-ca with "
                f"the CA certificate that signed it, and check that the certificate names {host}")
    return None


def _handshake(context: ssl.SSLContext, host: str, port: int, timeout_s: float) -> bool | ssl.SSLError | None:
    """True: a TLS handshake completed; an SSLError: the other end answered but not with
    acceptable TLS; None: it could not be reached or said nothing."""
    context.set_alpn_protocols(["h2"])
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            with context.wrap_socket(sock, server_hostname=host):
                return True
    except ssl.SSLError as exc:
        return exc
    except (ConnectionResetError, BrokenPipeError) as exc:  # closed on our hello: not a TLS server
        return ssl.SSLError(str(exc))
    except OSError:
        return None
