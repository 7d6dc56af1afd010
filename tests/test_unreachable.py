"""A peer nobody can dial is told so, with what to do, instead of training for nothing.

At join the coordinator dials the endpoint the peer announces (preflight's dial) and refuses it
when nothing answers there (the CLI exits with the advice: a real peer announcing 127.0.0.2);
when the coordinator or the slice owners later cannot fetch a peer's update from its endpoint,
the next heartbeat reply carries the same advice, and the peer prints it once.
"""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager
from typing import Iterator

import pytest

from peer.coordinator.registry import PeerRecord, PeerRegistry
from peer.coordinator.service import unreachable_reason
from peer.node.heartbeat import Heartbeat, NodeSnapshot, NotReachable
from peer.node.node import PeerNode, PeerOptions
from protocol.accounting import ByteCounter
from protocol.envelope import JOIN_TAG
from protocol.identity import Identity
from protocol.signing import sign_body
from protocol.wire import swarm_pb2
from tests.coordinator_harness import heartbeat, join_body, make_update, serve_coordinator, tiny_config
from tests.fakes import FakeCoordinator
from tests.helpers import free_port

ADVICE = "pass --announce-host <public IP>, open the port, or use --client-mode"
START_S = 120.0  # at most, for a peer process on 2 busy cores to start and be refused


@pytest.fixture(scope="module")
def cfg():
    return tiny_config()


@contextmanager
def listening() -> Iterator[tuple[socket.socket, str]]:
    """A port on 127.0.0.1 that accepts connections (what a peer's server looks like to a dial)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        yield server, f"127.0.0.1:{server.getsockname()[1]}"


def join(served, identity: Identity, endpoint: str) -> swarm_pb2.JoinReply:
    return served.stub.Join(sign_body(identity, JOIN_TAG, join_body(served, endpoint)), timeout=10)


def test_the_dial_names_the_endpoint_and_what_to_do():
    with listening() as (_, endpoint):
        assert unreachable_reason(endpoint, "ipv4:127.0.0.1") == ""
        # A loopback address announced from another machine: a dial would reach the coordinator's own.
        told = unreachable_reason(endpoint, "ipv4:203.0.113.5")
        assert told.startswith(f"nobody can reach {endpoint}: {ADVICE}") and "loopback" in told and "203.0.113.5" in told
    closed = f"127.0.0.1:{free_port()}"
    told = unreachable_reason(closed, "ipv4:127.0.0.1")
    assert told.startswith(f"nobody can reach {closed}: {ADVICE}") and "dial-back failed: ConnectionRefusedError" in told


def test_a_join_whose_endpoint_nobody_can_dial_is_refused(cfg):
    with serve_coordinator(cfg, dial_back=True) as served:
        peer = Identity.generate()
        closed = f"127.0.0.1:{free_port()}"
        refused = join(served, peer, closed)
        assert not refused.accepted and refused.refusal == swarm_pb2.UNREACHABLE
        assert refused.reason.startswith(f"nobody can reach {closed}: {ADVICE}")
        assert served.coordinator.registry.get(peer.peer_id) is None
        with listening() as (_, endpoint):
            assert join(served, peer, endpoint).accepted
        assert join(served, peer, endpoint).accepted  # a rejoin with the endpoint it was reached at is not dialled again
        assert join(served, peer, "").accepted  # client mode: nothing to dial
        assert served.rejections()["unreachable-endpoint"] == 1


def test_an_update_the_coordinator_could_not_fetch_is_told_in_the_heartbeat(cfg):
    with serve_coordinator(cfg, dial_back=True) as served:
        c, peer = served.coordinator, Identity.generate()
        with listening() as (_, endpoint):
            assert join(served, peer, endpoint).accepted
        # The port closed after the join (a firewall, a NAT mapping that expired): the fetch fails.
        signed, _, _ = make_update(served, peer)
        assert served.stub.SubmitCommitment(swarm_pb2.CommitRequest(header=signed, endpoint=endpoint), timeout=10).accepted
        deadline = time.monotonic() + 30
        while c.book.excluded.get(peer.peer_id) != "unreachable" and time.monotonic() < deadline:
            time.sleep(0.05)
        told = heartbeat(served, peer).unreachable
        assert told == f"nobody can reach {endpoint}: {ADVICE} (round 0: the coordinator could not fetch this peer's update there)"
        c.registry.record_aggregation(1, [peer.peer_id], None)  # a later round used its update
        assert heartbeat(served, peer).unreachable == ""


def test_owners_that_cannot_fetch_half_the_slices_tell_the_peer():
    registry = PeerRegistry(peer_timeout_s=30)
    registry.upsert(PeerRecord(peer_id="p", public_key=b"", endpoint="203.0.113.5:31340", client_mode=False, version="", joined_round=0))
    registry.record_slices(4, ["p"], {0: {"p": "unreachable"}}, slices=4)  # one owner's own bad link
    assert registry.get("p").unreachable == ""
    registry.record_slices(5, ["p"], {j: {"p": "unreachable"} for j in range(2)}, slices=4)
    assert registry.get("p").unreachable == (f"nobody can reach 203.0.113.5:31340: {ADVICE} "
                                             "(round 5: the owners of 2 of 4 slices could not fetch this peer's update there)")
    registry.record_slices(6, ["p"], {}, slices=4)
    assert registry.get("p").unreachable == ""


def test_the_peer_says_it_once(capsys):
    fake = FakeCoordinator()
    node = PeerNode(PeerOptions(coordinator="127.0.0.1:1"))
    node.heartbeat = Heartbeat(client=fake, identity=node.identity, counter=ByteCounter(node.identity.peer_id),
                               snapshot=lambda: NodeSnapshot(), announce=lambda: None, rejoin=lambda: None, stop=threading.Event())
    fake.unreachable = f"nobody can reach 203.0.113.5:31340: {ADVICE}"
    node.heartbeat.beat()
    node.heartbeat.beat()
    assert node.heartbeat.drain() == [NotReachable(fake.unreachable)]  # once, however many replies say it
    fake.unreachable = ""
    node.heartbeat.beat()
    fake.unreachable = "nobody can reach 203.0.113.5:31341: ..."  # fixed, then broken again: said again
    node.heartbeat.beat()
    fake.unreachable = ""
    node.heartbeat.beat()
    node.running(0, None)  # the node drains on its own thread and prints
    assert capsys.readouterr().out.count("WARNING: nobody can reach 203.0.113.5:31341") == 1


def test_a_peer_announcing_an_address_nobody_can_dial_exits_with_the_advice(swarm, cfg):
    with serve_coordinator(cfg, dial_back=True) as served:
        swarm.coordinator_endpoint = served.endpoint
        port = free_port()  # served on 127.0.0.1 only: nothing answers at 127.0.0.2
        child = swarm.start_peer("peer", ["--port", str(port), "--announce-host", "127.0.0.2"], via_dht=False)
        assert swarm.wait(child, START_S) == 1
        out = "".join(child.lines)
        assert (f"swarmloco peer: the coordinator refused to admit this peer: nobody can reach 127.0.0.2:{port}: {ADVICE}") in out
        assert served.rejections()["unreachable-endpoint"] == 1
