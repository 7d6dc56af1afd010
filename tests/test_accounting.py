"""Byte accounting per RPC: the same bytes as the per-peer ledger, split by the method that moved them."""

from __future__ import annotations

from protocol._generated import swarm_pb2, swarm_pb2_grpc
from protocol.accounting import ByteCounter
from protocol.channels import create_channel, create_server


class _Probe(swarm_pb2_grpc.PreflightServicer):
    def Ping(self, request, context):
        return swarm_pb2.PingReply(round=7)

    def ProbeDownload(self, request, context):
        for offset in range(0, request.size, 1000):
            yield swarm_pb2.Chunk(data=b"x" * min(1000, request.size - offset), offset=offset, total_size=request.size)


def _sums(by_method: dict) -> tuple[int, int, int]:
    rows = [t for methods in by_method.values() for t in methods.values()]
    return sum(t["bytes_sent"] for t in rows), sum(t["bytes_received"] for t in rows), sum(t["calls"] for t in rows)


def test_bytes_by_method_add_up_to_the_ledger_on_both_sides():
    client, served = ByteCounter("client-peer"), ByteCounter("server-peer")
    server, port = create_server(served, host="127.0.0.1", port=0)
    swarm_pb2_grpc.add_PreflightServicer_to_server(_Probe(), server)
    server.start()
    try:
        channel = create_channel(f"127.0.0.1:{port}", client, remote_peer="server-peer")
        stub = swarm_pb2_grpc.PreflightStub(channel)
        assert stub.Ping(swarm_pb2.PingRequest(), timeout=10).round == 7
        client.round = 1
        assert stub.Ping(swarm_pb2.PingRequest(), timeout=10).round == 7
        chunks = list(stub.ProbeDownload(swarm_pb2.ProbeDownloadRequest(size=2500), timeout=10))
        assert sum(len(c.data) for c in chunks) == 2500
        channel.close()
    finally:
        server.stop(None)

    methods = client.by_method()
    assert set(methods) == {"0", "1"}
    assert methods["0"]["Ping"]["calls"] == 1 and methods["1"]["Ping"]["calls"] == 1
    assert methods["1"]["Ping"]["bytes_received"] == swarm_pb2.PingReply(round=7).ByteSize()
    download = methods["1"]["ProbeDownload"]
    assert download["calls"] == 1 and download["bytes_received"] == sum(c.ByteSize() for c in chunks)
    total = client.total()
    assert _sums(methods) == (total.sent, total.received, total.calls)

    # The server tallies what it served, under the caller it names, with the same sizes.
    served_methods = served.by_method()
    served_rows = [m for rounds in served_methods.values() for m in rounds]
    assert set(served_rows) == {"served:Ping", "served:ProbeDownload"}
    total = served.total()
    assert _sums(served_methods) == (total.sent, total.received, total.calls)
    assert total.sent == client.total().received and total.received == client.total().sent
    assert set(served.by_peer()) == {"client-peer"}
