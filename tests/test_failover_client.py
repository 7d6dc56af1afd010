"""A peer's long-poll across a coordinator switch (failover): the successor is asked not to wait,
so the round in flight commits there at once instead of after a whole poll (in-process fakes)."""

from __future__ import annotations

import time

import grpc
import pytest

from peer.node.coordinator_client import CoordinatorClient
from protocol.accounting import ByteCounter
from protocol.wire import swarm_pb2


class Lost(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "connection refused (the coordinator was SIGKILLed)"


class DeadStub:
    def GetManifest(self, request, timeout):
        raise Lost()


class Successor:
    """Answers a long-poll only after its whole wait (it has no manifest: nobody committed yet)."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def GetManifest(self, request, timeout):
        self.waits.append(request.wait_s)
        time.sleep(request.wait_s)
        return swarm_pb2.ManifestReply(ready=False, current_round=request.round)


class FakeClient(CoordinatorClient):
    def __init__(self, successor: Successor) -> None:
        super().__init__("127.0.0.1:1", ByteCounter("peer"), locate=lambda: "127.0.0.1:2")
        self.stub = DeadStub()
        self.successor = successor

    def _switch(self, endpoint: str) -> None:
        self.endpoint, self.stub = endpoint, self.successor


def test_a_long_poll_that_moved_returns_at_once_from_the_successor():
    successor = Successor()
    client = FakeClient(successor)
    try:
        t0 = time.monotonic()
        reply = client.manifest(2, wait_s=5.0)
        took = time.monotonic() - t0
    finally:
        client.close()
    assert client.generation == 1 and client.endpoint == "127.0.0.1:2"
    assert not reply.ready
    assert successor.waits == [0.0]  # not a 5 s poll against a coordinator that holds nothing of ours
    assert took < 2.0, took


def test_a_long_poll_without_a_switch_waits_as_asked():
    successor = Successor()
    client = FakeClient(successor)
    client.stub = successor  # alive: no switch
    try:
        t0 = time.monotonic()
        client.manifest(2, wait_s=0.6)
        took = time.monotonic() - t0
    finally:
        client.close()
    assert successor.waits == [0.6] and took >= 0.6 and client.generation == 0


def test_a_join_whose_coordinator_died_meanwhile_connects_where_the_runs_record_is_now():
    """A peer found the run's active coordinator in the DHT, which then died (a standby took over)
    before the peer's first connection: each later attempt asks where the run's active record is
    now, instead of dialling the dead address until --connect-timeout runs out (chaos seed 1: a
    churner restarted 24 s before the takeover gave up after 113 s)."""
    from datetime import timedelta

    from peer.node.trust import JoinSteps, _connect
    from peer.run.timeouts import JoinTimeouts
    from tests.coordinator_harness import serve_coordinator, tiny_config
    from tests.helpers import free_port

    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    asked: list[str] = []
    with serve_coordinator(tiny_config()) as successor:
        steps = JoinSteps(JoinTimeouts(window=timedelta(seconds=30), attempt=timedelta(seconds=1), max_sleep=timedelta(seconds=0.2)),
                          time.monotonic() + 30, lambda line: None)
        client = _connect(dead, ByteCounter("p"), steps, lambda: asked.append("locate") or successor.endpoint)
        try:
            assert client.endpoint == successor.endpoint and asked  # the first attempt dials the address found
            assert client.run_info().run_id == successor.coordinator.cfg.run_id
        finally:
            client.close()


def test_a_join_that_comes_as_the_run_ends_stops_on_the_runs_finished_record():
    """Chaos (issue 22): a churner restarted just before the active coordinator was killed found
    the new one, built its model, and joined as the run finished: its Join met a coordinator gone
    for good and retried for coordinator_retry (120 s), still running a minute after the run ended.
    The run's coordinator wrote a signed "finished" record in the DHT as it ended: the retry reads
    it (with the locate it makes anyway) and stops with RunOver, a PeerExit that says so."""
    from datetime import timedelta

    from peer.node.errors import RunOver
    from peer.node.trust import RunAuthority
    from protocol import discovery
    from protocol.identity import Identity
    from protocol.keys import CoordinatorKeys
    from tests.helpers import free_port

    coordinator = Identity.generate()
    dht = discovery.start_dht(coordinator, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    dead = f"127.0.0.1:{free_port()}"  # the coordinator that finished the run, gone
    client = CoordinatorClient(dead, ByteCounter("peer"), retry_for=timedelta(seconds=60))
    try:
        assert discovery.announce_run(dht, coordinator, run_id="r1", endpoint=dead, role="finished", ttl_s=60)
        authority = RunAuthority(keys=CoordinatorKeys.of([coordinator.peer_id]), run_id="r1", client=client,
                                 counter=client.counter, endpoints=[], dht=dht)
        client.locate, client.run_over = authority.locate, authority.run_over  # as join_run wires them
        with pytest.raises(RunOver, match="run r1 has finished"):  # old code: CoordinatorUnavailable after 60 s
            client.join(swarm_pb2.Signed())
        stranger = RunAuthority(keys=CoordinatorKeys.of([Identity.generate().peer_id]), run_id="r1", client=client,
                                counter=client.counter, endpoints=[], dht=dht)
        stranger.locate()
        assert stranger.run_over() == ""  # only a record of one of the run's keys ends it
    finally:
        client.close()
        discovery.stop_dht(dht)


def test_a_port_taken_by_a_server_that_is_not_a_coordinator_is_a_lost_coordinator():
    """The active coordinator was SIGKILLed and the OS gave its freed port to another process's
    gRPC server (a peer's, with the Peer service only): calls there answer UNIMPLEMENTED "Method not
    found!". With a locator that is a gone coordinator (ask where the run is now); without one it is
    a wrong address, said as such (make test, session 15: four peers died with a traceback)."""
    from peer.node.coordinator_client import CoordinatorUnavailable
    from protocol.channels import create_server
    from tests.coordinator_harness import serve_coordinator, tiny_config

    squatter, port = create_server(host="127.0.0.1", port=0)  # serves no service at all
    squatter.start()
    taken = f"127.0.0.1:{port}"
    try:
        with serve_coordinator(tiny_config()) as successor:
            client = CoordinatorClient(taken, ByteCounter("p"), locate=lambda: successor.endpoint)
            try:
                assert client.run_info().run_id == successor.coordinator.cfg.run_id
                assert client.endpoint == successor.endpoint and client.generation == 1
            finally:
                client.close()
        lost = CoordinatorClient(taken, ByteCounter("p"))
        try:
            with pytest.raises(CoordinatorUnavailable, match="does not serve the coordinator's service.*same swarmloco version"):
                lost.run_info()
        finally:
            lost.close()
        # A locator that never names another coordinator (an old coordinator without this method,
        # say): the same advice once the retries run out, not a bare "unreachable".
        from datetime import timedelta

        stuck = CoordinatorClient(taken, ByteCounter("p"), retry_for=timedelta(seconds=1), locate=lambda: taken)
        try:
            with pytest.raises(CoordinatorUnavailable, match="same swarmloco version.*no other coordinator of the run found"):
                stuck.run_info()
        finally:
            stuck.close()
    finally:
        squatter.stop(0).wait(5)
