"""The heartbeat in process against tests/fakes.py: what it reports comes from the node's frozen
snapshot, what the coordinator says comes back as events, and the node learns them only when it
drains them on its own thread (the heartbeat writes nothing of the node's)."""

from __future__ import annotations

import threading

import grpc
import pytest

from peer.node.errors import NotAdmitted, PeerExit
from peer.node.heartbeat import Banned, Heartbeat, NodeSnapshot, RunFinished
from peer.node.node import PeerNode, PeerOptions
from protocol.accounting import ByteCounter
from protocol.envelope import HEARTBEAT_TAG
from protocol.identity import Identity
from protocol.signing import open_signed
from protocol.wire import swarm_pb2
from tests.fakes import CutTransfer, FakeCoordinator


def heartbeat(fake: FakeCoordinator, snapshot: NodeSnapshot, rejoin=lambda: None) -> Heartbeat:
    identity = Identity.generate()
    return Heartbeat(client=fake, identity=identity, counter=ByteCounter(identity.peer_id), snapshot=lambda: snapshot,
                     announce=lambda: None, rejoin=rejoin, stop=threading.Event())


def test_the_body_is_the_snapshot():
    fake = FakeCoordinator()
    snap = NodeSnapshot(round=3, param_hash="ab" * 32, state="training", step=41, loss=2.5,
                        round_bytes=(("round", 2), ("sent", 100), ("received", 200)), left_out=(1, 2),
                        compute_s=3.0, training_started=None)
    beat = heartbeat(fake, snap)
    assert beat.beat() is not None
    body, signer = open_signed(fake.heartbeats[0], HEARTBEAT_TAG)  # signed by the peer, verifiable
    assert signer == beat.identity.peer_id
    assert (body["round"], body["param_hash"], body["state"], body["step"], body["loss"]) == (3, "ab" * 32, "training", 41, 2.5)
    assert body["round_bytes"] == {"round": 2, "sent": 100, "received": 200} and body["left_out"] == [1, 2]
    assert body["utilization"] == 0.0 and body["peer_id"] == beat.identity.peer_id


def test_utilization_is_compute_over_wall_time_since_the_first_step():
    assert NodeSnapshot(compute_s=3.0, training_started=10.0).utilization(now=14.0) == pytest.approx(0.75)
    assert NodeSnapshot(compute_s=3.0).utilization(now=14.0) == 0.0


def test_a_ban_and_the_end_of_the_run_come_back_as_events():
    fake = FakeCoordinator()
    beat = heartbeat(fake, NodeSnapshot())
    fake.banned_reason, fake.finished = "false slice result in round 4", True
    beat.beat()
    assert beat.drain() == [Banned("false slice result in round 4"), RunFinished()]
    assert beat.drain() == []


def test_a_coordinator_that_lost_us_gets_a_rejoin():
    fake = FakeCoordinator()
    rejoined: list[int] = []
    beat = heartbeat(fake, NodeSnapshot(), rejoin=lambda: rejoined.append(1))
    fake.refuse("heartbeat", swarm_pb2.UNKNOWN_PEER)
    assert beat.beat() is None and rejoined == [1] and beat.drain() == []


def test_a_rejoin_refused_as_banned_is_a_ban():
    fake = FakeCoordinator()

    def rejoin() -> None:
        raise NotAdmitted("the coordinator refused to admit this peer: banned", swarm_pb2.BANNED, "equivocation in round 2")

    beat = heartbeat(fake, NodeSnapshot(), rejoin=rejoin)
    fake.refuse("heartbeat", swarm_pb2.UNKNOWN_PEER)
    beat.beat()
    assert beat.drain() == [Banned("equivocation in round 2")]


@pytest.mark.parametrize("error", [CutTransfer(), RuntimeError("injected")])
def test_a_failed_heartbeat_changes_nothing(error):
    fake = FakeCoordinator()
    beat = heartbeat(fake, NodeSnapshot())
    fake.fail("heartbeat", error)
    assert beat.beat() is None and beat.drain() == []
    assert isinstance(error, (grpc.RpcError, RuntimeError))


def test_the_node_learns_only_when_it_drains():
    node = PeerNode(PeerOptions(coordinator="127.0.0.1:1"))
    fake = FakeCoordinator()
    node.heartbeat = heartbeat(fake, NodeSnapshot())
    fake.banned_reason = "false slice result in round 0"
    node.heartbeat.beat()  # as its thread would
    assert node.banned_reason == "" and not node.finished  # nothing written from the heartbeat
    with pytest.raises(PeerExit, match="banned from the run: false slice result in round 0"):
        node.running(0, None)


def test_the_end_of_the_run_stops_the_loop_before_a_ban_does():
    node = PeerNode(PeerOptions(coordinator="127.0.0.1:1"))
    fake = FakeCoordinator()
    node.heartbeat = heartbeat(fake, NodeSnapshot())
    fake.banned_reason, fake.finished = "banned", True
    node.heartbeat.beat()
    assert node.running(0, None) is False and node.finished  # a finished run ends cleanly, banned or not


def test_the_loop_beats_at_once_when_told_and_stops():
    fake = FakeCoordinator()
    beat = heartbeat(fake, NodeSnapshot())
    seen = threading.Event()
    fake.on_call(lambda method, n: method == "heartbeat" and seen.set())
    beat.start()
    beat.now.set()
    assert seen.wait(10)
    beat.stop.set()
    beat.join(timeout=10)
    assert not beat.thread.is_alive()


def test_a_dht_refresh_that_hangs_does_not_stop_the_beats(monkeypatch):
    """A refresh of the DHT record stuck on an unreachable replica (chaos seed 0: a partitioned
    peer's node; three honest peers went silent past peer_timeout_s and were marked gone) blocks
    only itself: beats go on, and no second refresh starts while the first is in flight."""
    monkeypatch.setattr("peer.node.heartbeat.RECORD_TTL_S", 0.0)  # a refresh due at every tick
    fake = FakeCoordinator()
    release, refreshes = threading.Event(), []

    def stuck_announce() -> None:
        refreshes.append(1)
        release.wait(60)

    beat = Heartbeat(client=fake, identity=Identity.generate(), counter=ByteCounter(), snapshot=NodeSnapshot,
                     announce=stuck_announce, rejoin=lambda: None, stop=threading.Event())
    beats = threading.Semaphore(0)
    fake.on_call(lambda method, n: method == "heartbeat" and beats.release())
    beat.start()
    try:
        for _ in range(3):
            beat.now.set()
            assert beats.acquire(timeout=10)  # answered while the refresh hangs
        assert refreshes == [1] and beat.announcing()
    finally:
        release.set()
        beat.stop.set()
        beat.join(timeout=10)
    assert not beat.thread.is_alive()
    beat.announcer.join(10)
    assert not beat.announcing()


def test_a_peer_with_no_news_beats_only_to_keep_alive():
    """Every 2 s tick beats while there is news (a step, a phase, a round); with none, only every
    keepalive_s (the node passes peer_timeout_s / 4), or at once when told (a round ended)."""
    beat = Heartbeat(client=FakeCoordinator(), identity=Identity.generate(), counter=ByteCounter(), snapshot=NodeSnapshot,
                     announce=lambda: None, rejoin=lambda: None, stop=threading.Event(), keepalive_s=7.5)
    waiting = NodeSnapshot(round=4, state="waiting", step=30)
    assert beat.due(waiting.news(), forced=False, now=100.0)  # never told
    beat.told, beat.beaten = waiting.news(), 100.0
    assert not beat.due(waiting.news(), forced=False, now=102.0)
    assert not beat.due(NodeSnapshot(round=4, state="waiting", step=30, compute_s=9.0).news(), forced=False, now=104.0)
    assert beat.due(waiting.news(), forced=False, now=107.5)  # keep-alive
    assert beat.due(waiting.news(), forced=True, now=102.0)  # a round ended
    assert beat.due(NodeSnapshot(round=4, state="training", step=31).news(), forced=False, now=102.0)  # news
    # never slower than peer_timeout_s allows, never faster than the 2 s tick
    assert Heartbeat(client=FakeCoordinator(), identity=Identity.generate(), counter=ByteCounter(), snapshot=NodeSnapshot,
                     announce=lambda: None, rejoin=lambda: None, stop=threading.Event(), keepalive_s=1.5).keepalive_s == 2.0
