"""A fresh channel reaches a server that came back on the same port (a peer restarted with --resume,
a test's holder on a port a previous one used): channels keep their own connections
(protocol/channels.py, LOCAL_SUBCHANNELS), so one refused earlier does not lend its reconnect backoff
to the next (with gRPC's process-wide pool the fresh channel failed at once with "connection refused")."""

from __future__ import annotations

import grpc
import pytest

from protocol.channels import create_channel
from protocol.payload_service import PayloadServicer, serve_payloads
from protocol.payload_store import PayloadStore
from protocol.wire import swarm_pb2, swarm_pb2_grpc
from tests.helpers import free_port


def _serve(port: int = 0):
    return serve_payloads(PayloadServicer(PayloadStore(), verify_header=lambda signed: None), None, host="127.0.0.1", port=port)


def _ask(channel) -> grpc.StatusCode:
    try:
        list(swarm_pb2_grpc.PeerStub(channel).FetchPayload(swarm_pb2.FetchRequest(sha256="0" * 64), timeout=5))
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def test_a_fresh_channel_reaches_a_server_back_on_a_port_that_refused_a_moment_ago():
    # A port of free_port's block, not one the kernel picked: once freed, an ephemeral port can go to
    # any other test's outgoing connection or server, and then the "refused" ask is answered.
    server, port = _serve(free_port())
    assert server.stop(0).wait(30)  # stop() returns at once: a server still listening would answer the ask below
    refused = create_channel(f"127.0.0.1:{port}")
    assert _ask(refused) == grpc.StatusCode.UNAVAILABLE  # nobody there: refused, that channel backs off
    again, _ = _serve(port)
    try:
        fresh = create_channel(f"127.0.0.1:{port}")
        assert _ask(fresh) == grpc.StatusCode.NOT_FOUND  # reached: the server answers it holds no such payload
        fresh.close()
    finally:
        refused.close()
        again.stop(0)
