"""A live coordinator's resource limits under abuse: long-polls beyond its slots, a push that
stalls after its header, floods from one peer id and from rotating ones, Sybil joins. Each is
refused with a status while ordinary calls keep being served. Random and mutated messages:
tests/test_fuzz_rpc.py."""

from __future__ import annotations

import threading
import time
from collections import Counter

import grpc
import pytest

from protocol.identity import Identity
from protocol.ratelimit import CallerLimits
from protocol.wire import swarm_pb2
from tests.helpers import tiny_run_config
from tests.coordinator_harness import join, make_update, serve_coordinator

ALL_TO_ALL = {"mode": "all-to-all"}  # the coordinator's own payload checks run in the all-to-all exchange


def test_long_polls_cannot_starve_the_server():
    """More long-polls than the server has slots: exactly the excess are answered at once, the
    others hold every slot until their deadline, and ordinary calls still get through."""
    slots, polls = 4, 12
    with serve_coordinator(tiny_run_config(exchange=ALL_TO_ALL), generous_limits=True, max_long_polls=slots) as served:
        replies: list[float] = []

        def poll() -> None:
            started = time.monotonic()
            served.stub.GetManifest(swarm_pb2.ManifestRequest(round=0, wait_s=1e308), timeout=8)
            replies.append(time.monotonic() - started)

        threads = [threading.Thread(target=poll) for _ in range(polls)]
        for t in threads:
            t.start()
        # Round 0 stays open, so a poll that got a slot waits ~7.5 s (its deadline less 0.5 s):
        # until then the only replies are the refused ones.
        deadline = time.monotonic() + 5.0
        while len(replies) < polls - slots and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(replies) == polls - slots, replies
        assert max(replies) < 3.0, replies  # answered at once, not after a wait
        # Every slot is taken now (a slot taken here would be a bug: give it back at once).
        assert not served.servicer.long_polls.acquire(blocking=False)
        for _ in range(5):
            assert served.stub.GetRunInfo(swarm_pb2.RunInfoRequest(), timeout=5).run_id
        assert len(replies) == polls - slots  # the slot holders are still waiting
        for t in threads:
            t.join(15)
        assert len(replies) == polls
        assert sorted(r > 5.0 for r in replies).count(True) == slots  # exactly the slot holders waited
        for _ in range(slots):  # and each gave its slot back
            assert served.servicer.long_polls.acquire(blocking=False)


def test_slowloris_push_is_cut_off_by_the_server():
    """A push that sends its header and then nothing is cancelled server-side, client deadline or not."""
    with serve_coordinator(tiny_run_config(exchange=ALL_TO_ALL), generous_limits=True, max_stream_s=1.0) as served:
        peer = Identity.generate()
        assert join(served, peer).accepted
        signed, payload, _ = make_update(served, peer)
        release = threading.Event()

        def stalled():
            yield swarm_pb2.PushChunk(header=signed, data=payload[:10])
            release.wait(30)  # the client never sends the rest

        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            served.peer_stub.PushPayload(stalled())  # no client deadline at all
        release.set()
        assert info.value.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.INVALID_ARGUMENT)
        assert time.monotonic() - started < 20
        # And the server still serves.
        assert served.stub.GetRunInfo(swarm_pb2.RunInfoRequest(), timeout=10).run_id == served.coordinator.cfg.run_id


def test_a_fetch_whose_client_stops_reading_is_cut_off_and_its_call_freed_by_the_server():
    """FetchPayload streams from the server's event loop (protocol/payload_service.serve_payloads). A
    client that reads one message of a 64 MiB object and then nothing parks the stream in flow
    control: at the servicer's max_stream_s the server ends it with CANCELLED, and by the call's
    deadline its handler is gone (a stream must have a deadline: without one it is refused).
    The server goes on serving."""
    from hashlib import sha256

    from protocol.accounting import ByteCounter
    from protocol.payload_service import PayloadServicer, serve_payloads
    from protocol.payload_store import PayloadStore
    from protocol.rpc_errors import WATCHDOG
    from protocol.wire import swarm_pb2_grpc

    store = PayloadStore()
    blob = bytes(range(256)) * (1 << 18)  # 64 MiB: far more than the HTTP/2 windows hold
    digest = sha256(blob).digest()
    store.put_blob(digest.hex(), 0, blob)
    servicer = PayloadServicer(store, verify_header=lambda s: None, max_stream_s=1.0)
    server, port = serve_payloads(servicer, ByteCounter("holder"), host="127.0.0.1", port=0)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        stub = swarm_pb2_grpc.PeerStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            next(stub.FetchPayload(swarm_pb2.FetchRequest(digest=digest)))  # no deadline at all
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "deadline" in refused.value.details()
        cut_before = WATCHDOG.cancelled
        started = time.monotonic()
        stream = stub.FetchPayload(swarm_pb2.FetchRequest(digest=digest), timeout=4.0)
        assert len(next(stream).data) > 0 and servicer.streaming == 1
        time.sleep(2.0)  # past the server's 1 s: the stream is cut while we do not read
        with pytest.raises(grpc.RpcError) as info:
            for _ in stream:
                pass
        assert info.value.code() == grpc.StatusCode.CANCELLED and "past the server's limit" in info.value.details()
        assert WATCHDOG.cancelled == cut_before + 1
        deadline = time.monotonic() + 20
        while servicer.streaming:  # freed by the call's deadline at the latest
            assert time.monotonic() < deadline, "the server still holds the stream a client stopped reading"
            time.sleep(0.1)
        # And the server still serves: a whole read within the limit.
        again = b"".join(m.data for m in stub.FetchPayload(swarm_pb2.FetchRequest(digest=digest, offset=len(blob) - 10), timeout=10))
        assert again == blob[-10:] and time.monotonic() - started < 30
    finally:
        channel.close()
        server.stop(0).wait(5)


def test_flooding_is_rate_limited_per_peer_and_per_host():
    # 1 call/s per claimed peer id (burst 20); the host gets 10x that (burst 200).
    limits = CallerLimits(per_peer_rate=1.0, per_peer_burst=20.0)
    with serve_coordinator(tiny_run_config(exchange=ALL_TO_ALL), limits=limits) as served:
        call = served.channel.unary_unary("/swarmloco.v1.Coordinator/GetRunInfo", request_serializer=None, response_deserializer=None)

        def flood(n: int, peer_ids) -> Counter[str]:
            codes: Counter[str] = Counter()
            for i in range(n):
                try:
                    call(b"", timeout=5, metadata=[("x-swarmloco-peer", peer_ids(i))])
                    codes["OK"] += 1
                except grpc.RpcError as exc:
                    codes[exc.code().name] += 1
            return codes

        one = flood(100, lambda i: "one")
        assert 20 <= one["OK"] < 100 and one["RESOURCE_EXHAUSTED"] == 100 - one["OK"], one
        # Rotating the self-declared peer id buys a fresh per-peer bucket, but not a fresh host bucket.
        rotating = flood(600, lambda i: f"sybil-{i}")
        # (the host bucket was also charged for every call of the first flood)
        assert 20 < rotating["OK"] < 600 and rotating["RESOURCE_EXHAUSTED"] > 0, rotating
        assert served.rejections()["rate-limited"] == one["RESOURCE_EXHAUSTED"] + rotating["RESOURCE_EXHAUSTED"]


def test_sybil_joins_are_admission_limited():
    with serve_coordinator(tiny_run_config(exchange=ALL_TO_ALL), generous_limits=True, new_peers_per_s=1.0, new_peers_burst=20.0) as served:
        outcomes = Counter()
        for _ in range(60):
            try:
                outcomes["accepted" if join(served, Identity.generate()).accepted else "refused"] += 1
            except grpc.RpcError as exc:
                outcomes[exc.code().name] += 1
        assert outcomes["accepted"] <= 25 and outcomes["RESOURCE_EXHAUSTED"] >= 35, outcomes
        assert served.rejections()["admission-limited"] == outcomes["RESOURCE_EXHAUSTED"]
