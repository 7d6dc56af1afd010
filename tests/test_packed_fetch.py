"""Several slices per message (issue 24): a batched fetch asks the holder to pack consecutive chunks
into one message (Chunk.parts, at most CHUNK_BYTES of data and proofs each), so the ~62 KB slices of
a 1M-float round are not a gRPC message each. Over real gRPC on loopback: the holder packs, the
fetcher reads packed and unpacked streams alike (a holder that does not know `packed`), every part
is still checked as its own item, and a packed message that breaks the rules stops the stream."""

from __future__ import annotations

import hashlib

import pytest

from protocol import merkle
from protocol.accounting import ByteCounter
from protocol.channels import CHUNK_BYTES, MAX_MESSAGE_BYTES
from protocol.batched_fetch import Wanted, fetch_items
from protocol.payload_fetch import ChannelPool
from protocol.payload_service import PayloadServicer, pack_chunks, serve_payloads
from protocol.payload_store import PayloadStore, StoredSlice
from protocol.streaming import iter_chunks
from protocol.wire import swarm_pb2, swarm_pb2_grpc
from tests.helpers import assert_closing_releases_a_fetch_in_flight

SLICES = [bytes([i]) * (62_500 + 7 * i) for i in range(11)]  # 11 slices of ~62 KB: 1M fp16 floats / 32, odd tree
DIGESTS = [hashlib.sha256(s).digest() for s in SLICES]
PROOFS = merkle.proofs(DIGESTS)
ROOT = merkle.root(DIGESTS)


class CountingServicer(PayloadServicer):
    """The real servicer; counts the messages it streams. `packs=False`: a holder from before
    `packed` (it never reads the field)."""

    def __init__(self, store: PayloadStore, *, packs: bool = True) -> None:
        super().__init__(store, verify_header=lambda s: None)
        self.packs, self.messages = packs, []

    def _fetch_messages(self, request):
        if not self.packs:
            request = swarm_pb2.FetchRequest(items=request.items)
        for message in super()._fetch_messages(request):
            self.messages.append(message.ByteSize())
            yield message


@pytest.fixture
def holders():
    made = []

    def make(servicer_of):
        store = PayloadStore()
        for j, (data, proof) in enumerate(zip(SLICES, PROOFS)):
            store.put_slice(ROOT, j, StoredSlice(0, DIGESTS[j].hex(), tuple(proof), len(SLICES), data))
        servicer = servicer_of(store)
        server, port = serve_payloads(servicer, ByteCounter("holder"), host="127.0.0.1", port=0)
        made.append(server)
        return servicer, f"127.0.0.1:{port}"

    pool = ChannelPool()
    yield make, pool
    pool.close()
    for server in made:
        server.stop(0)


def wanted(indices) -> list[Wanted]:
    proven = merkle.ProvenNodes(ROOT, len(SLICES))
    return [Wanted(max_size=70_000, slice=j, proven=proven) for j in indices]


def test_eleven_slices_of_62_kb_come_in_one_message_and_each_checks(holders):
    make, pool = holders
    servicer, endpoint = make(CountingServicer)
    got = fetch_items(pool, endpoint, wanted(range(11)))
    assert [g.data for g in got] == SLICES  # each part checked against the root on its own
    assert all(g.proof == tuple(PROOFS[j]) for j, g in enumerate(got))  # whole proofs, to serve them on
    assert len(servicer.messages) == 1 and CHUNK_BYTES // 2 < servicer.messages[0] <= MAX_MESSAGE_BYTES  # was 11


def test_a_holder_that_does_not_pack_is_read_as_before(holders):
    make, pool = holders
    servicer, endpoint = make(lambda store: CountingServicer(store, packs=False))
    got = fetch_items(pool, endpoint, wanted([3, 4, 9]))
    assert [g.data for g in got] == [SLICES[3], SLICES[4], SLICES[9]]
    assert len(servicer.messages) == 3


def test_packed_messages_stay_under_the_message_limit_whatever_the_items():
    """Chunks of 1 MiB go one per message; thousands of tiny items with whole proofs share
    messages, none over the channel's limit; every chunk comes out once, in order."""
    big = bytes(range(256)) * (CHUNK_BYTES // 256)
    proof = [bytes([k]) * 32 for k in range(16)]  # the longest proof (MAX_LEAVES)
    chunks = [c for data in (big + b"x", b"y" * 10, big) for c in iter_chunks(data, sha256=None, proof=proof)]
    chunks += [swarm_pb2.Chunk(item=5 + k, data=b"z" * 10, total_size=10, proof=proof) for k in range(4096)]
    chunks.append(swarm_pb2.Chunk(item=5000, missing=True))
    messages = list(pack_chunks(iter(chunks)))
    assert [p for m in messages for p in m.parts] == chunks
    assert all(m.ByteSize() <= MAX_MESSAGE_BYTES and sum(len(p.data) for p in m.parts) <= CHUNK_BYTES for m in messages)
    assert len(messages[0].parts) == 1 and len(messages) < 20  # a full chunk alone; tiny ones ~1,700 a message


class LyingServicer(swarm_pb2_grpc.PeerServicer):
    """Sends slice 0 packed correctly, then `bad` (a message that breaks the packing rules)."""

    def __init__(self, bad: swarm_pb2.Chunk) -> None:
        self.bad = bad

    def FetchPayload(self, request, context):
        yield swarm_pb2.Chunk(parts=[swarm_pb2.Chunk(item=0, data=SLICES[0], total_size=len(SLICES[0]), proof=PROOFS[0])])
        yield self.bad


@pytest.mark.parametrize("bad", [
    # a chunk of its own beside its parts
    swarm_pb2.Chunk(item=1, data=SLICES[1], total_size=len(SLICES[1]), parts=[swarm_pb2.Chunk(item=2, data=SLICES[2],
                    total_size=len(SLICES[2]), proof=PROOFS[2])]),
    # parts packed inside a part
    swarm_pb2.Chunk(parts=[swarm_pb2.Chunk(parts=[swarm_pb2.Chunk(item=1, data=SLICES[1], total_size=len(SLICES[1]),
                                                                  proof=PROOFS[1])])]),
    # a part over the item's bound
    swarm_pb2.Chunk(parts=[swarm_pb2.Chunk(item=1, data=b"x" * 70_001, total_size=70_001, proof=PROOFS[1])]),
])
def test_a_packed_message_that_breaks_the_rules_stops_the_stream_after_what_checked(holders, bad):
    make, pool = holders
    _, endpoint = make(lambda store: LyingServicer(bad))
    got = fetch_items(pool, endpoint, wanted([0, 1, 2]))
    assert got[0] is not None and got[0].data == SLICES[0]
    assert got[1] is None and got[2] is None  # left to the fallback fetch from the next holders


def test_a_message_that_is_not_a_chunk_stops_the_stream_after_what_checked():
    """The batched fetch parses each message's bytes itself (it counts their length first): bytes
    that are not a Chunk end the stream like a message that breaks the packing rules, keeping what
    checked before them."""
    from concurrent import futures

    import grpc

    first = swarm_pb2.Chunk(parts=[swarm_pb2.Chunk(item=0, data=SLICES[0], total_size=len(SLICES[0]), proof=PROOFS[0])])

    def stream(request, context):
        yield first.SerializeToString()
        yield b"\x0a\xff"  # field 1, a length that runs past the end

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "swarmloco.v1.Peer", {"FetchPayload": grpc.unary_stream_rpc_method_handler(stream)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    counter = ByteCounter("asker")
    pool = ChannelPool(counter)
    try:
        got = fetch_items(pool, f"127.0.0.1:{port}", wanted([0, 1]))
        assert got[0] is not None and got[0].data == SLICES[0] and got[1] is None
        assert counter.total().received == first.ByteSize() + 2  # the bytes as they came, both messages
    finally:
        pool.close()
        server.stop(0)


def test_a_batched_fetch_after_the_pool_closed_brings_nothing_and_raises_nothing(holders):
    """A node shutting down closes its pool while a phase may still ask: every object comes back
    None (left to the caller's fallback), as from a broken stream, instead of an error mid-round."""
    make, pool = holders
    _, endpoint = make(CountingServicer)
    assert fetch_items(pool, endpoint, wanted([0]))[0] is not None  # the pool's loop started
    pool.close()
    assert fetch_items(pool, endpoint, wanted([0, 1])) == [None, None]


def test_closing_the_pool_ends_a_batched_fetch_in_flight(holders):
    """A fetch blocked on a holder that answers nothing, and the pool closed meanwhile (shutdown):
    the caller is released at once with nothing fetched, not left waiting on a stopped loop."""
    _, pool = holders
    assert_closing_releases_a_fetch_in_flight(pool, wanted([0]))


def test_an_object_over_a_mebibyte_is_hashed_off_the_loop_and_still_checked(holders):
    """Objects of 1 MiB and more are hashed on the fetch loop's executor (several streams' large
    items in parallel); they are checked against their sha256 all the same, beside small ones."""
    import hashlib

    from protocol.batched_fetch import HASH_OFF_LOOP_BYTES

    big = bytes(range(256)) * (3 * HASH_OFF_LOOP_BYTES // 256)  # 3 MiB: several chunks, one item
    small = b"small object"
    make, pool = holders
    servicer, endpoint = make(CountingServicer)
    servicer.store.put_blob(hashlib.sha256(big).hexdigest(), 0, big)
    servicer.store.put_blob(hashlib.sha256(small).hexdigest(), 0, small)
    lie = hashlib.sha256(b"another object").hexdigest()
    servicer.store.put_blob(lie, 0, big)  # served under a digest its bytes do not have
    got = fetch_items(pool, endpoint, [Wanted(max_size=len(big), sha256=hashlib.sha256(big).hexdigest()),
                                       Wanted(max_size=64, sha256=hashlib.sha256(small).hexdigest()),
                                       Wanted(max_size=len(big), sha256=lie)])
    assert got[0] is not None and got[0].data == big and got[1] is not None and got[1].data == small
    assert got[2] is None  # its bytes are not what the digest says: left to the fallback
