"""A slice travels with its Merkle proof and is believed only when the proof puts it under the
root its author signed: over real gRPC on loopback, a holder that tampers with the proof or
serves another slice's (valid) proof is refused on its first message and the next holder used;
with no honest holder the slice is unreachable, as a wrong digest made it before."""

from __future__ import annotations

import hashlib

import pytest
import torch

from protocol import merkle
from protocol.accounting import ByteCounter
from protocol.envelope import build_update_header
from protocol.identity import Identity
from protocol.payload_fetch import ChannelPool, FetchError, fetch_slice
from protocol.payload_service import PayloadServicer, serve_payloads
from protocol.payload_store import PayloadStore, StoredSlice
from protocol.wire import swarm_pb2

SLICES = [bytes([i]) * (100 + 37 * i) for i in range(11)]  # 11 slices: odd levels in the tree
DIGESTS = [hashlib.sha256(s).digest() for s in SLICES]
PROOFS = merkle.proofs(DIGESTS)


class Holder:
    """A real PayloadServicer whose store holds what a test puts in it."""

    def __init__(self) -> None:
        self.store = PayloadStore()
        self.server, port = serve_payloads(PayloadServicer(self.store, verify_header=lambda s: None), ByteCounter("holder"),
                                           host="127.0.0.1", port=0)
        self.endpoint = f"127.0.0.1:{port}"

    def serve(self, root: bytes, index: int, *, data: bytes, proof) -> None:
        self.store.put_slice(root, index, StoredSlice(0, hashlib.sha256(data).hexdigest(), tuple(proof), len(SLICES), data))


@pytest.fixture
def setup():
    author = Identity.generate()
    header = build_update_header(run_id="run", round_=0, peer_id=author.peer_id, codec="fp16", numel=1, layout_hash="L",
                                 base_param_hash="B", payload=b"".join(SLICES), slices=[d.hex() for d in DIGESTS])
    holders = [Holder() for _ in range(3)]
    pool = ChannelPool()
    yield header, holders, pool
    pool.close()
    for holder in holders:
        holder.server.stop(0)


def test_every_slice_fetches_with_a_proof_that_verifies(setup):
    header, (honest, *_), pool = setup
    root = header.root_bytes()
    for j, (data, proof) in enumerate(zip(SLICES, PROOFS)):
        honest.serve(root, j, data=data, proof=proof)
    for j in range(len(SLICES)):
        got = fetch_slice(pool, [honest.endpoint], header, j, max_size=2000)
        assert (got.data, got.digest, list(got.proof)) == (SLICES[j], DIGESTS[j].hex(), PROOFS[j])
        assert merkle.verify(bytes.fromhex(got.digest), j, len(SLICES), got.proof, root)


def test_a_tampered_proof_is_refused_and_the_next_holder_used(setup):
    header, (liar, honest, _), pool = setup
    root = header.root_bytes()
    j = 6
    tampered = [bytes([PROOFS[j][0][0] ^ 1]) + PROOFS[j][0][1:], *PROOFS[j][1:]]
    liar.serve(root, j, data=SLICES[j], proof=tampered)
    with pytest.raises(FetchError, match=f"Merkle proof of slice {j} does not verify against the root"):
        fetch_slice(pool, [liar.endpoint], header, j, max_size=2000)
    honest.serve(root, j, data=SLICES[j], proof=PROOFS[j])
    assert fetch_slice(pool, [liar.endpoint, honest.endpoint], header, j, max_size=2000).data == SLICES[j]


def test_another_slice_with_its_own_valid_proof_is_refused_for_this_index(setup):
    """Slice 3's bytes and proof are genuine, but under index 4 they prove nothing."""
    header, (liar, honest, _), pool = setup
    root = header.root_bytes()
    liar.serve(root, 4, data=SLICES[3], proof=PROOFS[3])
    with pytest.raises(FetchError, match="Merkle proof of slice 4 does not verify"):
        fetch_slice(pool, [liar.endpoint], header, 4, max_size=2000)
    honest.serve(root, 4, data=SLICES[4], proof=PROOFS[4])
    assert fetch_slice(pool, [liar.endpoint, honest.endpoint], header, 4, max_size=2000).data == SLICES[4]


def test_a_valid_proof_over_other_bytes_is_refused(setup):
    """Slice 2's true proof, streamed with other bytes of the same length."""
    header, (liar, *_), pool = setup
    root = header.root_bytes()
    liar.serve(root, 2, data=b"\xee" * len(SLICES[2]), proof=PROOFS[2])
    with pytest.raises(FetchError, match="Merkle proof of slice 2 does not verify"):
        fetch_slice(pool, [liar.endpoint], header, 2, max_size=2000)


def test_a_slice_over_its_bound_is_refused_before_it_is_read(setup):
    header, (liar, *_), pool = setup
    liar.serve(header.root_bytes(), 9, data=SLICES[9], proof=PROOFS[9])  # 433 bytes
    with pytest.raises(FetchError, match="more than the limit of 400"):
        fetch_slice(pool, [liar.endpoint], header, 9, max_size=400)


def test_a_slice_declares_no_digest_on_the_wire(setup):
    """The receiver hashes the bytes into the leaf: a slice's chunks carry the proof, not a sha256."""
    header, (honest, *_), pool = setup
    honest.serve(header.root_bytes(), 5, data=SLICES[5], proof=PROOFS[5])
    chunks = list(pool.peer_stub(honest.endpoint).FetchPayload(
        swarm_pb2.FetchRequest(slice=5, slices_root=header.root_bytes()), timeout=10))
    assert [(c.sha256, list(c.proof), c.data) for c in chunks] == [("", PROOFS[5], SLICES[5])]


def test_a_slice_of_another_update_or_index_outside_the_header_is_not_served(setup):
    header, (honest, *_), pool = setup
    root = header.root_bytes()
    honest.serve(root, 0, data=SLICES[0], proof=PROOFS[0])
    with pytest.raises(FetchError, match="outside the header's 0..10"):
        fetch_slice(pool, [honest.endpoint], header, 11, max_size=2000)
    stub = pool.peer_stub(honest.endpoint)
    reply = stub.FetchPayload(swarm_pb2.FetchRequest(slice=0, slices_root=b"\x00" * 32), timeout=10)
    with pytest.raises(Exception, match="no slice 0 of update root 0000"):
        list(reply)


def test_later_slices_of_one_root_come_with_short_proofs_and_are_served_on_whole(setup):
    """Fetches sharing one ProvenNodes ask only for the siblings below what is proven; the slice
    fetched is stored with its whole proof (rebuilt), so it can be served on to another owner."""
    header, (honest, *_), pool = setup
    root = header.root_bytes()
    for j, (data, proof) in enumerate(zip(SLICES, PROOFS)):
        honest.serve(root, j, data=data, proof=proof)
    proven = merkle.ProvenNodes(root, len(SLICES))
    sizes = []
    for j in (4, 5, 6, 0, 10):
        levels = proven.levels_for(j)
        got = fetch_slice(pool, [honest.endpoint], header, j, max_size=2000, proven=proven)
        assert got.data == SLICES[j] and list(got.proof) == PROOFS[j]  # the whole proof, for serving on
        sizes.append(len(merkle.truncate(PROOFS[j], j, len(SLICES), levels)))
    # 11 leaves, 4 levels: 4 needs its whole proof; 5 (4's sibling) its leaf sibling, whose pair
    # node 4's proof proved; 6 likewise (the 6-7 node was a sibling in 4's proof); 0 two levels
    # (the 0-3 node was one); 10 only its level-1 sibling (its level-3 node was a sibling too)
    assert sizes == [4, 1, 1, 2, 1] and sum(sizes) == 9 < sum(len(PROOFS[j]) for j in (4, 5, 6, 0, 10)) == 18
    # a short proof without what it stops at does not verify: a fresh fetcher gets the whole one
    chunks = list(pool.peer_stub(honest.endpoint).FetchPayload(
        swarm_pb2.FetchRequest(slice=5, slices_root=root, proof_levels=1), timeout=10))
    assert len(chunks[0].proof) == 1 and not merkle.verify(DIGESTS[5], 5, len(SLICES), list(chunks[0].proof), root)


def test_a_blob_fetched_by_sha256_comes_without_it_and_is_still_checked_against_it(setup):
    """fetch_blob asks the holder not to echo the sha256 it named (64 characters a fetch, each way);
    the bytes are checked against the one asked for, so a holder serving others is refused."""
    from protocol.payload_fetch import fetch_blob

    _, (honest, liar, _), pool = setup
    sha = hashlib.sha256(SLICES[3]).hexdigest()
    honest.store.put_blob(sha, 0, SLICES[3])
    liar.store.put_blob(sha, 0, SLICES[4][: len(SLICES[3])])
    stub = pool.peer_stub(honest.endpoint)
    chunks = list(stub.FetchPayload(swarm_pb2.FetchRequest(digest=bytes.fromhex(sha), omit_sha256=True), timeout=10))
    assert [(c.sha256, c.data) for c in chunks] == [("", SLICES[3])]  # addressed by 32 raw bytes, answered without the hex
    chunks = list(stub.FetchPayload(swarm_pb2.FetchRequest(sha256=sha), timeout=10))  # the hex address still serves
    assert [(c.sha256, c.data) for c in chunks] == [(sha, SLICES[3])]
    with pytest.raises(FetchError, match="do not match the declared sha256"):
        fetch_blob(pool, [liar.endpoint], sha, len(SLICES[3]))
    assert fetch_blob(pool, [liar.endpoint, honest.endpoint], sha, len(SLICES[3])) == SLICES[3]


@pytest.mark.parametrize("lie", ["tampered proof", "another slice's proof"])
def test_in_a_round_an_update_whose_slice_does_not_prove_is_left_out_of_that_slice_as_unreachable(lie):
    """The same outcome as a slice that missed its signed digest before the Merkle root: every
    owner of slice 5 finds no holder whose proof holds, leaves the author out of slice 5 only
    ("unreachable", not a fault that proves the author Byzantine), and every node gathers the
    same aggregate."""
    from peer.run.config import RunConfig
    from tests.test_slice_exchange import Node, make_round, reduce_all

    cfg = RunConfig.from_dict({"run_id": "slices", "exchange": {"mode": "sliced", "slices": 8, "replicas": 2},
                               "aggregation": {"name": "median"}})
    nodes = [Node(cfg) for _ in range(4)]
    try:
        rounds, _ = make_round(cfg, nodes)
        author = next(n for n in nodes if n.identity.peer_id not in rounds[0].owners[5])  # its own store is trusted
        header = rounds[0].headers[author.identity.peer_id]
        root = header.root_bytes()
        good = author.store.get_slice(root, 5)
        if lie == "tampered proof":
            proof = (bytes([good.proof[0][0] ^ 1]) + good.proof[0][1:], *good.proof[1:])
            author.store.put_slice(root, 5, StoredSlice(good.round, good.digest, proof, good.count, good.payload))
        else:
            other = author.store.get_slice(root, 4)
            author.store.put_slice(root, 5, other)
        outcomes = [node.exchange.gather(rnd, reduce_all(nodes, rounds)) for node, rnd in zip(nodes, rounds)]
        bad = author.identity.peer_id
        for outcome in outcomes:
            assert outcome.excluded[5] == {bad: "unreachable"}
            assert all(bad not in outcome.excluded[j] for j in range(8) if j != 5)
            assert not outcome.liars
            assert torch.equal(outcome.combined, outcomes[0].combined)
    finally:
        for node in nodes:
            node.close()


def test_a_batched_fetch_takes_objects_of_one_chunk_and_of_several(setup):
    """fetch_items over real gRPC: an object of one chunk is taken as it came, one split over
    several chunks (over CHUNK_BYTES) gathered whole; each checked against its sha256; a corrupt
    one left out, the rest kept."""
    from protocol.channels import CHUNK_BYTES
    from protocol.batched_fetch import Wanted, fetch_items

    _, (holder, *_), pool = setup
    blobs = [b"a" * 1000, bytes(range(256)) * (CHUNK_BYTES // 256 * 2 + 3), b"c" * 10, b"d" * (CHUNK_BYTES + 1)]
    for blob in blobs:
        holder.store.put_blob(hashlib.sha256(blob).hexdigest(), 0, blob)
    holder.store.put_blob(hashlib.sha256(b"wanted").hexdigest(), 0, b"served instead")  # corrupt
    wanted = [Wanted(max_size=len(b), sha256=hashlib.sha256(b).hexdigest()) for b in blobs]
    wanted.insert(2, Wanted(max_size=100, sha256=hashlib.sha256(b"wanted").hexdigest()))
    got = fetch_items(pool, holder.endpoint, wanted)
    assert got[2] is None
    assert [g.data for g in got[:2] + got[3:]] == blobs
    assert all(isinstance(g.data, bytes) for g in got if g is not None)
