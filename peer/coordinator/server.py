"""The coordinator's gRPC server: both services on one port, wired once for the CLI and the tests."""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from peer.coordinator.preflight_service import PreflightServicer
from peer.coordinator.service import CoordinatorServicer
from peer.coordinator.state import Coordinator
from protocol.aio_server import AsyncServer
from protocol.channels import create_async_server
from protocol.payload_service import PayloadServicer
from protocol.ratelimit import CallerLimits
from protocol.wire import swarm_pb2_grpc


@dataclass(frozen=True, slots=True)
class CoordinatorServer:
    server: AsyncServer  # not started yet; long-polls wait on its loop, holding no thread
    port: int
    servicer: CoordinatorServicer
    payloads: PayloadServicer


def build_coordinator_server(
    coordinator: Coordinator,
    *,
    host: str = "0.0.0.0",
    port: int = 0,
    announce_host: str = "127.0.0.1",
    limits: CallerLimits | None = None,
    max_stream_s: float = 120.0,
    **servicer_options,
) -> CoordinatorServer:
    """Bind host:port (0 = any free port), add the Coordinator and Peer services, and set
    `coordinator.endpoint` to announce_host:port. Bytes are counted on coordinator.counter.
    `limits` and `max_stream_s` apply to both services; other options go to CoordinatorServicer.
    The caller starts the server (and stops it)."""
    server, bound = create_async_server(coordinator.counter, host=host, port=port)
    coordinator.channels.aio.share_loop(server.loop)  # its fetches on the server's loop: one gRPC loop (protocol/aio_channels.py)
    coordinator.endpoint = f"{announce_host}:{bound}"
    servicer = CoordinatorServicer(coordinator, limits=limits, max_stream_s=max_stream_s, **servicer_options)
    payloads = PayloadServicer(
        coordinator.store,
        verify_header=coordinator.verify_pushed_header,
        on_reject=coordinator.registry.reject,
        limits=limits,
        max_stream_s=max_stream_s,
    )
    swarm_pb2_grpc.add_CoordinatorServicer_to_server(servicer, server)
    swarm_pb2_grpc.add_PeerServicer_to_server(payloads, server)
    swarm_pb2_grpc.add_PreflightServicer_to_server(PreflightServicer(coordinator), server)  # `swarmloco preflight`
    return CoordinatorServer(server, bound, servicer, payloads)
