"""PushSlices over real gRPC on loopback: a client-mode author pushes its slices to their owner,
which keeps each only when its Merkle proof puts it under the author's signed root, never more
than the signed payload size, and wakes whoever waits for them (issue 24)."""

from __future__ import annotations

import hashlib
import threading

import grpc
import pytest

from protocol import merkle
from protocol.accounting import ByteCounter
from protocol.envelope import build_update_header, sign_update
from protocol.identity import Identity
from protocol.payload_fetch import ChannelPool
from protocol.payload_service import PayloadServicer, PayloadStore, StoredSlice, push_slices, serve_payloads
from protocol.wire import swarm_pb2

SLICES = [bytes([i]) * (100 + 37 * i) for i in range(5)]
DIGESTS = [hashlib.sha256(s).digest() for s in SLICES]
PROOFS = merkle.proofs(DIGESTS)


def _item(j: int, data: bytes | None = None, proof=None) -> tuple[int, StoredSlice]:
    data = SLICES[j] if data is None else data
    return j, StoredSlice(0, hashlib.sha256(data).hexdigest(), tuple(PROOFS[j] if proof is None else proof), len(SLICES), data)


@pytest.fixture
def owner():
    author = Identity.generate()
    header = build_update_header(run_id="run", round_=0, peer_id=author.peer_id, codec="fp16", numel=1, layout_hash="L",
                                 base_param_hash="B", payload=b"".join(SLICES), slices=[d.hex() for d in DIGESTS])
    signed = sign_update(author, header)
    store = PayloadStore()
    server, port = serve_payloads(PayloadServicer(store, verify_header=lambda s: header, accept_slice_pushes=True),
                                  ByteCounter("owner"), host="127.0.0.1", port=0)
    pool = ChannelPool()
    stub = pool.peer_stub(f"127.0.0.1:{port}")
    yield header, signed, store, stub
    pool.close()
    server.stop(0)


def test_pushed_slices_are_kept_with_their_proofs_and_wake_a_waiting_owner(owner):
    header, signed, store, stub = owner
    root = header.root_bytes()
    waited = threading.Thread(target=store.wait_slices, args=([(root, 1), (root, 3)], 60.0))
    waited.start()
    reply = stub.PushSlices(push_slices(signed, [_item(1), _item(3)]), timeout=30)
    waited.join(30)
    assert reply.accepted and not waited.is_alive()
    for j in (1, 3):
        held = store.get_slice(root, j)
        assert (held.payload, held.digest, list(held.proof)) == (SLICES[j], DIGESTS[j].hex(), PROOFS[j])
    assert store.get_slice(root, 0) is None


def test_a_slice_whose_proof_does_not_hold_is_refused_and_the_others_kept(owner):
    header, signed, store, stub = owner
    root = header.root_bytes()
    forged = _item(2, data=b"x" * len(SLICES[2]))  # other bytes under slice 2's genuine proof
    misplaced = _item(4, data=SLICES[0], proof=PROOFS[0])  # slice 0 with its own valid proof, claimed as slice 4
    reply = stub.PushSlices(push_slices(signed, [_item(0), forged, misplaced]), timeout=30)
    assert not reply.accepted and reply.refusal == swarm_pb2.INVALID_UPDATE
    assert "[2, 4]" in reply.reason and "1 kept" in reply.reason
    assert store.get_slice(root, 0).payload == SLICES[0]
    assert store.get_slice(root, 2) is None and store.get_slice(root, 4) is None


def test_more_bytes_than_the_signed_payload_are_refused_and_nothing_is_kept(owner):
    header, signed, store, stub = owner
    padded = [_item(j) for j in range(len(SLICES))] + [_item(0)]  # every slice, then one more
    with pytest.raises(grpc.RpcError) as failed:
        stub.PushSlices(push_slices(signed, padded), timeout=30)
    assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "payload size" in failed.value.details()
    assert all(store.get_slice(header.root_bytes(), j) is None for j in range(len(SLICES)))


def test_waiting_for_slices_nobody_pushes_ends_at_its_timeout():
    store = PayloadStore()
    store.wait_slices([(b"r" * 32, 0)], 0.05)  # returns; the caller then counts the author unreachable
    assert store.get_slice(b"r" * 32, 0) is None
