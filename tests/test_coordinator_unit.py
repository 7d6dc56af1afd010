"""The coordinator's protocol rules, in process on a real gRPC server on 127.0.0.1.

Equivocation (committed or pushed) bans with evidence; replayed and forged updates are refused
with their reason counted; a commitment cannot redirect the coordinator's fetcher; peers, bans
and evidence survive a coordinator restart from its checkpoint. `serve_coordinator` and the
signed-message helpers are tests/coordinator_harness.py.
"""

from __future__ import annotations

import dataclasses
import time

import grpc
import pytest

from peer.run.config import RunConfig
from peer.coordinator.state import Coordinator
from peer.node.coordinator_client import CoordinatorClient
from protocol.accounting import ByteCounter
from protocol.wire import swarm_pb2
from protocol.envelope import HEARTBEAT_TAG, UPDATE_TAG, header_body, signed_from_json
from protocol.identity import Identity, verify_signature
from protocol.payload_service import push_chunks
from protocol.rpc_errors import Refused, refusal_of
from protocol.signing import sign_body
from tests.coordinator_harness import equivocate, heartbeat, join, make_update, push_and_commit, serve_coordinator, tiny_config
from tests.helpers import tiny_run_config


@pytest.fixture(scope="module")
def cfg() -> RunConfig:
    return tiny_config()


def _decode_signed(d: dict) -> tuple[bytes, bytes, bytes]:
    signed = signed_from_json(d)
    return signed.body, signed.signature, signed.public_key


def test_equivocation_bans_and_keeps_both_signed_headers(cfg):
    with serve_coordinator(cfg) as served:
        cheat, honest = Identity.generate(), Identity.generate()
        assert join(served, cheat).accepted and join(served, honest).accepted
        reply = equivocate(served, cheat)
        assert not reply.accepted and reply.refusal == swarm_pb2.EQUIVOCATION and "banned" in reply.reason

        status = served.status()
        record = next(p for p in status["peers"] if p["peer_id"] == cheat.peer_id)
        assert record["state"] == "banned" and "equivocation in round 0" in record["banned_reason"]
        (evidence,) = record["evidence"]
        headers = [_decode_signed(evidence[k]) for k in ("first_header", "second_header")]
        assert headers[0][0] != headers[1][0]  # two different bodies ...
        assert all(verify_signature(pk, sig, body) for body, sig, pk in headers)  # ... both signed by the cheat
        assert status["rejections"]["equivocation"] == 1
        assert status["open_round"]["excluded"] == {cheat.peer_id: "equivocation"}
        # Banned for the run: rejoining is refused, so are its heartbeats' claims.
        rejoin = join(served, cheat)
        assert not rejoin.accepted and rejoin.refusal == swarm_pb2.BANNED
        assert heartbeat(served, cheat).banned
        # The honest peer is untouched.
        signed, payload, _ = make_update(served, honest, seed=3)
        assert push_and_commit(served, signed, payload).accepted


def test_second_different_push_in_a_round_is_equivocation(cfg):
    with serve_coordinator(cfg) as served:
        cheat = Identity.generate()
        assert join(served, cheat).accepted
        a, payload_a, _ = make_update(served, cheat, seed=1)
        b, payload_b, _ = make_update(served, cheat, seed=2)
        assert served.peer_stub.PushPayload(push_chunks(a, payload_a), timeout=10).accepted
        assert served.peer_stub.PushPayload(push_chunks(a, payload_a), timeout=10).accepted  # a retry is fine
        refused = served.peer_stub.PushPayload(push_chunks(b, payload_b), timeout=10)
        assert not refused.accepted and refused.refusal == swarm_pb2.EQUIVOCATION
        assert served.coordinator.registry.is_banned(cheat.peer_id)
        assert served.rejections()["equivocation"] == 1


def test_replayed_and_forged_updates_are_refused_with_their_reason(cfg):
    with serve_coordinator(cfg) as served:
        c = served.coordinator
        alice, mallory = Identity.generate(), Identity.generate()
        assert join(served, alice).accepted and join(served, mallory).accepted
        # Replay: a header signed for another round.
        old, _, _ = make_update(served, alice, round_=c.round + 5)
        reply = served.stub.SubmitCommitment(swarm_pb2.CommitRequest(header=old), timeout=10)
        assert not reply.accepted and reply.refusal == swarm_pb2.STALE_ROUND and reply.current_round == c.round
        # Forgery 1: Mallory signs a header that names Alice.
        _, _, header = make_update(served, alice, seed=4)
        forged = sign_body(mallory, UPDATE_TAG, header_body(header))
        reply = served.stub.SubmitCommitment(swarm_pb2.CommitRequest(header=forged), timeout=10)
        assert not reply.accepted and reply.refusal == swarm_pb2.BAD_SIGNATURE and "forged" in reply.reason
        # Forgery 2: Alice's header with Mallory's signature and key swapped in / a flipped body byte.
        genuine, _, _ = make_update(served, alice, seed=5)
        swapped = swarm_pb2.Signed(body=genuine.body, signature=mallory.sign(genuine.body), public_key=alice.public_key)
        tampered = swarm_pb2.Signed(body=genuine.body.replace(b'"round":0', b'"round":1'), signature=genuine.signature,
                                    public_key=alice.public_key)
        for bad in (swapped, tampered):
            reply = served.stub.SubmitCommitment(swarm_pb2.CommitRequest(header=bad), timeout=10)
            assert not reply.accepted and reply.refusal == swarm_pb2.BAD_SIGNATURE
        # A wrong-run header, pushed: refused before a byte of payload is read.
        counts = served.rejections()
        assert (counts["stale-round"], counts["forged"], counts["bad-signature"]) == (1, 1, 2)
        assert c.book.commitments == {}


def test_commitment_cannot_redirect_the_fetcher(cfg):
    with serve_coordinator(cfg) as served:
        peer = Identity.generate()
        assert join(served, peer, endpoint="127.0.0.1:40001").accepted
        signed, _, _ = make_update(served, peer)
        reply = served.stub.SubmitCommitment(swarm_pb2.CommitRequest(header=signed, endpoint="10.0.0.1:22"), timeout=10)
        assert not reply.accepted and reply.refusal == swarm_pb2.WRONG_ENDPOINT
        with pytest.raises(grpc.RpcError) as info:
            served.stub.SubmitCommitment(swarm_pb2.CommitRequest(header=signed, endpoint="not an endpoint"), timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and refusal_of(info.value) == swarm_pb2.MALFORMED


def test_peers_bans_and_history_survive_a_coordinator_restart(cfg, tmp_path):
    path = tmp_path / "coordinator.ckpt"
    cheat, honest, key = Identity.generate(), Identity.generate(), Identity.generate()
    with serve_coordinator(cfg, checkpoint_path=path, identity=key) as served:
        c = served.coordinator
        assert join(served, cheat).accepted and join(served, honest).accepted
        a, payload_a, _ = make_update(served, cheat, seed=1)
        b, _, _ = make_update(served, cheat, seed=2)
        assert push_and_commit(served, a, payload_a).accepted
        assert not served.stub.SubmitCommitment(swarm_pb2.CommitRequest(header=b), timeout=10).accepted
        signed, payload, _ = make_update(served, honest, seed=3)
        assert push_and_commit(served, signed, payload).accepted
        result = c.tick()  # every expected (unbanned, alive) peer committed: round 0 closes
        assert result is not None and result.updates == 1 and result.excluded == {cheat.peer_id: "equivocation"}
        before = (c.round, c.param_hash, served.status()["peers"])

    with serve_coordinator(cfg, checkpoint_path=path, identity=key) as served:  # the run's key: the same identity file
        c = served.coordinator
        assert (c.round, c.param_hash) == before[:2] == (1, before[1])
        assert [h.round for h in c.history] == [0]
        assert not join(served, cheat).accepted  # still banned after the restart
        restored = {p["peer_id"]: p for p in served.status()["peers"]}
        old = {p["peer_id"]: p for p in before[2]}
        assert restored[cheat.peer_id]["evidence"] == old[cheat.peer_id]["evidence"]
        # The honest peer is awaited in the restored round without having to rejoin first.
        assert c.registry.active(c.round) == [honest.peer_id]
        signed, payload, _ = make_update(served, honest, seed=4)
        assert push_and_commit(served, signed, payload).accepted


def test_unknown_peer_is_the_same_typed_refusal_on_every_path(cfg):
    """Heartbeat, push and commit from a peer the coordinator does not know (e.g. after a restart)
    all come out of the peer's client as Refused(UNKNOWN_PEER), its cue to join again; an
    RPC-level error carries its refusal too (trailing metadata), read by the same client."""
    with serve_coordinator(cfg) as served:
        stranger = Identity.generate()
        signed, payload, _ = make_update(served, stranger)
        client = CoordinatorClient(served.endpoint, ByteCounter(stranger.peer_id))
        beat = lambda: client.heartbeat(sign_body(stranger, HEARTBEAT_TAG, {"peer_id": stranger.peer_id, "timestamp": time.time()}))
        paths = {
            "heartbeat": beat,
            "push": lambda: client.push(push_chunks(signed, payload)),
            "commit": lambda: client.submit(signed, ""),
        }
        try:
            for name, call in paths.items():
                with pytest.raises(Refused) as info:
                    call()
                assert info.value.refusal == swarm_pb2.UNKNOWN_PEER, name
                assert "Join" in info.value.reason, name
            with pytest.raises(Refused) as info:
                client.submit(signed, "not an endpoint")  # INVALID_ARGUMENT, typed through the metadata
            assert info.value.refusal == swarm_pb2.MALFORMED
            assert join(served, stranger).accepted  # what the node does on UNKNOWN_PEER; then every path works
            assert not beat().banned
            assert client.push(push_chunks(signed, payload)).accepted
            assert client.submit(signed, "").accepted
        finally:
            client.close()


def test_status_names_the_coordinator_its_term_and_the_run_keys(cfg):
    from peer.cli.status import status_table

    key, standby = Identity.generate(), Identity.generate()
    listed = dataclasses.replace(cfg, control=dataclasses.replace(cfg.control, coordinators=[standby.peer_id]))
    c = Coordinator(listed, key, term=3)
    status = c.status()
    assert status["coordinator"]["term"] == 3 and status["coordinator"]["fingerprint"] == key.peer_id
    assert sorted(status["coordinator"]["coordinators"]) == sorted([key.peer_id, standby.peer_id])  # its own key is added
    assert f"coordinator {key.peer_id[:16]} (term 3) | run keys 2" in status_table(status)


def test_status_pairs_a_peers_hash_with_the_round_its_heartbeat_named(cfg):
    """A heartbeat's hash is of the state its round opens; status says which round that is, apart
    from last_round (the last manifest that listed the peer, which a heartbeat lags or leads)."""
    with serve_coordinator(cfg) as served:
        peer = Identity.generate()
        assert join(served, peer).accepted
        [record] = served.status()["peers"]
        assert (record["param_hash"], record["param_hash_round"]) == ("", -1)
        heartbeat(served, peer, round=2, param_hash="ab" * 32)
        [record] = served.status()["peers"]
        assert (record["param_hash"], record["param_hash_round"], record["last_round"]) == ("ab" * 32, 2, -1)


def test_the_coordinators_checkpoint_carries_its_run_config(cfg, tmp_path):
    """export/sample need no --config for a coordinator's checkpoint: the config (with the key the
    coordinator adds) is inside it, and its hash is the checkpoint's."""
    from peer.cli.checkpoint_model import load_checkpoint_model

    c = Coordinator(cfg, Identity.generate(), checkpoint_path=tmp_path / "run.ckpt")
    model, loaded, _ = load_checkpoint_model(str(tmp_path / "run.ckpt"), None)
    assert loaded.config_hash() == c.cfg.config_hash() != cfg.config_hash()  # the coordinator listed its key
    assert sum(p.numel() for p in model.parameters()) == c.numel


def test_closing_the_sliced_mode_ends_its_threads(tmp_path):
    """A demoted coordinator lives on as a standby (peer/coordinator/main.py closes the mode it led
    with): the sliced mode's gather-ahead, slice and stream workers end instead of idling on."""
    c = Coordinator(dataclasses.replace(tiny_config(), exchange=tiny_run_config().exchange), Identity.generate(),
                    checkpoint_path=tmp_path / "run.ckpt")
    assert c.exchange.name == "sliced"
    executors = (c.exchange.ahead, c.exchange.slices.slice_workers, c.exchange.slices.streams)
    for executor in executors:
        executor.submit(lambda: None).result()  # each has a live worker thread now
    threads = [t for e in executors for t in e._threads]
    assert threads and all(t.is_alive() for t in threads)
    c.exchange.close()
    for thread in threads:
        thread.join(timeout=10)
    assert not [t.name for t in threads if t.is_alive()]
    for executor in executors:
        with pytest.raises(RuntimeError):
            executor.submit(lambda: None)
