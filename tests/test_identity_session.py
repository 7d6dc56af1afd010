"""One key, one live process: a second process of an identity is refused before it can equivocate.

On one machine the key's lock refuses it at start, and the lock dies with its holder, SIGKILL
included. A copy of the key elsewhere reaches the coordinator, which refuses a Join from a second
live session of the key, while a restart after a crash is admitted at once: its Join names the
session it succeeds, read from the lock file it took over. A ban for equivocation says what
probably happened and that a new --identity-path is needed.

The coordinator's rules run in process against a served coordinator, the peer's side against
tests/fakes.py; one test runs real peer processes (the CLI) for all of it: a second local
process, a copy of the key, a SIGKILL and a restart.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Callable

import grpc
import pytest

from peer.node.errors import NotAdmitted, PeerExit
from peer.node.heartbeat import Heartbeat, MustStop, NodeSnapshot
from peer.node.node import PeerNode, PeerOptions
from protocol.accounting import ByteCounter
from protocol.envelope import HEARTBEAT_TAG, JOIN_TAG
from protocol.identity import Identity, lock_identity
from protocol.payload_service import push_chunks
from protocol.rpc_errors import refusal_of
from protocol.signing import open_signed, sign_body
from protocol.wire import swarm_pb2
from tests.coordinator_harness import equivocate, heartbeat, join_body, make_update, push_and_commit, serve_coordinator, tiny_config
from tests.fakes import FakeCoordinator

START_S = 120.0  # at most, for a peer process on 2 busy cores: torch, the model, the corpus, the run's config
LIVE_S = 60.0  # rounds.peer_timeout_s in these tests: a restart is admitted long before the old session would time out


@pytest.fixture(scope="module")
def cfg():
    return tiny_config(peer_timeout_s=LIVE_S)


def until(what: str, ready: Callable[[], object], timeout_s: float = START_S):
    """Wait for an observable state (a file's content, the coordinator's registry) to hold."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := ready():
            return value
        time.sleep(0.05)
    raise AssertionError(f"never saw {what} within {timeout_s:.0f} s")


def join(served, identity: Identity, session: str = "", succeeds: str = "", endpoint: str = "") -> swarm_pb2.JoinReply:
    body = join_body(served, endpoint, session=session, succeeds=succeeds)
    return served.stub.Join(sign_body(identity, JOIN_TAG, body), timeout=10)


def lock_note(key: Path) -> dict:
    """What the key's current (or last) holder wrote into its lock file."""
    try:
        return json.loads(key.with_name(key.name + ".lock").read_text() or "{}")
    except (OSError, ValueError):
        return {}


# --- the coordinator: one live session per key (in process) -------------------------------------


def test_a_second_live_session_is_refused_and_a_successor_takes_over(cfg):
    with serve_coordinator(cfg) as served:
        key = Identity.generate()
        assert join(served, key, "s1").accepted
        assert not heartbeat(served, key, session="s1").refusal

        second = join(served, key, "s2")  # a copy of the key on another machine, while s1 heartbeats
        assert not second.accepted and second.refusal == swarm_pb2.DUPLICATE_SESSION
        assert "another process with this identity is live" in second.reason
        assert "--identity-path NEW.pem" in second.reason and "equivocation" in second.reason
        assert not heartbeat(served, key, session="s1").refusal  # the live one is untouched
        assert join(served, key, "s1").accepted  # a rejoin of the same process is no duplicate

        successor = join(served, key, "s3", succeeds="s1")  # restarted after a crash: it holds s1's lock now
        assert successor.accepted
        stale = heartbeat(served, key, session="s1")  # the old process, had it been frozen and woken up
        assert stale.refusal == swarm_pb2.DUPLICATE_SESSION and "took this peer's place" in stale.reason
        assert "--identity-path" in stale.reason
        assert not heartbeat(served, key, session="s3").refusal
        assert served.rejections()["duplicate-session"] == 2
        assert served.coordinator.registry.get(key.peer_id).session == "s3"


def test_a_malformed_session_is_refused_and_a_heartbeat_without_one_is_not_checked(cfg):
    with serve_coordinator(cfg) as served:
        key = Identity.generate()
        for bad in ({"session": 7}, {"session": "x" * 65}, {"succeeds": ["s1"]}):
            body = {**join_body(served, ""), **bad}
            with pytest.raises(grpc.RpcError) as info:
                served.stub.Join(sign_body(key, JOIN_TAG, body), timeout=10)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and refusal_of(info.value) == swarm_pb2.MALFORMED
        assert join(served, key, "s1").accepted
        assert not heartbeat(served, key).refusal  # an older peer's heartbeat names no session
        assert not heartbeat(served, key, session=["not", "a", "session"]).refusal
        assert served.coordinator.registry.get(key.peer_id).session == "s1"


def test_a_session_silent_for_the_liveness_window_may_be_taken_over(cfg):
    with serve_coordinator(cfg) as served:
        key = Identity.generate()
        assert join(served, key, "s1").accepted
        assert join(served, key, "s2").refusal == swarm_pb2.DUPLICATE_SESSION
        record = served.coordinator.registry.get(key.peer_id)
        record.last_seen -= LIVE_S  # s1 has been silent for the whole window: crashed, or frozen
        assert join(served, key, "s2").accepted
        assert join(served, Identity.generate()).accepted  # a peer that names no session is not checked


def test_a_successor_does_not_commit_twice_in_the_round_its_predecessor_committed(cfg):
    """The crashed process's update is in the open round already: a second one would be
    equivocation (a ban), so the successor is told to take part from the next round."""
    with serve_coordinator(cfg) as served:
        key = Identity.generate()
        assert join(served, key, "s1").accepted
        first, payload, _ = make_update(served, key, seed=1)
        assert push_and_commit(served, first, payload).accepted
        assert join(served, key, "s2", succeeds="s1").accepted
        second, payload_2, _ = make_update(served, key, seed=2)
        pushed = served.peer_stub.PushPayload(push_chunks(second, payload_2), timeout=10)
        assert not pushed.accepted and pushed.refusal == swarm_pb2.STALE_ROUND
        committed = served.stub.SubmitCommitment(swarm_pb2.CommitRequest(header=second), timeout=10)
        assert not committed.accepted and committed.refusal == swarm_pb2.STALE_ROUND
        assert "a previous process of this identity already committed round 0" in committed.reason
        assert not served.coordinator.registry.is_banned(key.peer_id)


def test_an_equivocation_ban_says_what_probably_happened(cfg):
    with serve_coordinator(cfg) as served:
        key = Identity.generate()
        assert join(served, key).accepted
        refused = equivocate(served, key)
        assert refused.refusal == swarm_pb2.EQUIVOCATION and "banned" in refused.reason
        rejoin = join(served, key)
        beat = heartbeat(served, key)
        for told in (refused.reason, rejoin.reason, beat.reason):
            assert "two processes signed different updates with this key" in told
            assert "a copy of the key on another machine?" in told and "each peer needs its own --identity-path" in told
        assert rejoin.refusal == swarm_pb2.BANNED and rejoin.reason.startswith("banned: equivocation in round 0")
        assert "restart with --identity-path NEW.pem for a new identity" in rejoin.reason and beat.banned
        status = {p["peer_id"]: p for p in served.status()["peers"]}
        assert status[key.peer_id]["banned_reason"] == "equivocation in round 0"  # status keeps the short form


# --- the peer's side (in process, against tests/fakes.py) ---------------------------------------


def test_a_peer_whose_place_another_process_took_stops_with_the_reason():
    node = PeerNode(PeerOptions(coordinator="127.0.0.1:1"))
    fake = FakeCoordinator()
    node.heartbeat = Heartbeat(client=fake, identity=node.identity, counter=ByteCounter(node.identity.peer_id),
                               snapshot=lambda: NodeSnapshot(), announce=lambda: None, rejoin=lambda: None, stop=threading.Event(),
                               session=node.held.session)
    node.heartbeat.beat()
    body, _ = open_signed(fake.heartbeats[0], HEARTBEAT_TAG)
    assert body["session"] == node.held.session and len(node.held.session) == 32  # every heartbeat names this process
    fake.refuse("heartbeat", swarm_pb2.DUPLICATE_SESSION, "another process with this identity took this peer's place")
    node.heartbeat.beat()
    with pytest.raises(PeerExit, match="another process with this identity took this peer's place"):
        node.running(0, None)


def test_a_rejoin_refused_for_good_stops_the_peer():
    fake = FakeCoordinator()

    def rejoin() -> None:
        raise NotAdmitted("the coordinator refused to admit this peer: nobody can reach 10.0.0.5:31340: ...", swarm_pb2.UNREACHABLE,
                          "nobody can reach 10.0.0.5:31340: ...")

    identity = Identity.generate()
    beat = Heartbeat(client=fake, identity=identity, counter=ByteCounter(identity.peer_id), snapshot=lambda: NodeSnapshot(),
                     announce=lambda: None, rejoin=rejoin, stop=threading.Event())
    fake.refuse("heartbeat", swarm_pb2.UNKNOWN_PEER)  # a restarted coordinator, and the peer's port closed meanwhile
    beat.beat()
    assert beat.drain() == [MustStop("the coordinator refused to admit this peer: nobody can reach 10.0.0.5:31340: ...")]


# --- the lock (in process), and real peers: a second local process, a copy of the key, a crash --


def test_the_lock_names_its_holder_and_goes_with_it(tmp_path):
    key = tmp_path / "peer.pem"
    Identity.load_or_create(key)
    held = lock_identity(key, {"session": "s1"})
    with pytest.raises(OSError, match=r"another swarmloco process \(this process\) already runs with identity .*peer.pem: stop it, "
                                      r"or pass --identity-path NEW.pem for a second peer"):
        lock_identity(key)
    held.release()
    again = lock_identity(key, {"session": "s2"})  # whoever held it last is named, for the next holder to succeed
    assert again.previous == {"pid": os.getpid(), "session": "s1"}
    again.release()


def test_one_key_one_process_and_a_crashed_peer_restarts_at_once(swarm, cfg):
    """A second process with the key's file on this machine stops at its lock; a copy of the key
    ("another machine") is refused by the coordinator; a SIGKILLed peer restarted at once is
    admitted (its old session would look live for LIVE_S more), whichever of the copy and the
    restart reaches the coordinator first."""
    with serve_coordinator(cfg, dial_back=True) as served:
        swarm.coordinator_endpoint = served.endpoint
        key = swarm.workdir / "peer.pem"
        peer_id = Identity.load_or_create(key).peer_id
        registry = served.coordinator.registry

        def admitted(child) -> str:
            """The session of `child` once the coordinator admitted it under that session."""
            note = lock_note(key)
            record = registry.get(peer_id)
            held = note.get("pid") == child.process.pid and note.get("session")
            return held if held and record is not None and record.session == held else ""

        first = swarm.start_peer("peer", [], via_dht=False)
        until("the first peer's lock", lambda: lock_note(key).get("pid") == first.process.pid)
        local = swarm.start_peer("peer", [], via_dht=False)  # the same key file, on this machine
        assert swarm.wait(local, START_S) == 1
        assert (f"swarmloco peer: another swarmloco process (pid {first.process.pid}) already runs with identity {key}: "
                "stop it, or pass --identity-path NEW.pem for a second peer") in "".join(local.lines)
        first_session = until("the first peer admitted", lambda: admitted(first))

        swarm.kill(first)  # a crash (SIGKILL: no handler runs; the kernel drops its lock)
        swarm.wait(first, 30)
        shutil.copy(key, swarm.workdir / "copy.pem")
        copy = swarm.start_peer("copy", [], via_dht=False)  # the same key at another path: "another machine"
        restarted = swarm.start_peer("peer", [], via_dht=False)
        assert swarm.wait(copy, START_S) == 1
        out = "".join(copy.lines)
        assert "swarmloco peer: the coordinator refused to admit this peer: another process with this identity is live" in out
        assert "--identity-path NEW.pem" in out
        session = until("the restarted peer admitted", lambda: admitted(restarted))
        assert session != first_session and restarted.alive()
        assert served.rejections().get("duplicate-session") == 1  # the copy's Join only
        swarm.kill(restarted)
        swarm.wait(restarted, 30)
