"""PushSlices and SwapSlices over real gRPC on loopback: a client-mode author pushes its slices to
their owner, and two owners trade theirs in one stream (each answered as a batched fetch is). The
owner keeps each pushed slice only when its Merkle proof puts it under the author's signed root,
never more than the signed payload size, and wakes whoever waits for them (issue 24)."""

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
from protocol.batched_fetch import Push, PushProgress, Wanted, fetch_streams
from protocol.payload_service import MAX_ITEMS, PayloadServicer, serve_payloads
from protocol.payload_store import PayloadStore, StoredSlice
from protocol.result_relay import RelayPlan
from protocol.slice_push import push_slices
from protocol.swap_ticket import sign_swap_ticket, ticket_holds
from protocol.wire import swarm_pb2

SLICES = [bytes([i]) * (100 + 37 * i) for i in range(5)]
DIGESTS = [hashlib.sha256(s).digest() for s in SLICES]
PROOFS = merkle.proofs(DIGESTS)


def _item(j: int, data: bytes | None = None, proof=None) -> tuple[int, StoredSlice]:
    data = SLICES[j] if data is None else data
    return j, StoredSlice(0, hashlib.sha256(data).hexdigest(), tuple(PROOFS[j] if proof is None else proof), len(SLICES), data)


# The owner's own update, whose slices a trading caller wants: other bytes, another tree.
THEIRS = [bytes([200 + i]) * (80 + 11 * i) for i in range(5)]
THEIR_DIGESTS = [hashlib.sha256(s).digest() for s in THEIRS]
THEIR_ROOT = merkle.root(THEIR_DIGESTS)


@pytest.fixture
def owner():
    author = Identity.generate()
    header = build_update_header(run_id="run", round_=0, peer_id=author.peer_id, codec="fp16", numel=1, layout_hash="L",
                                 base_param_hash="B", payload=b"".join(SLICES), slices=[d.hex() for d in DIGESTS])
    signed = sign_update(author, header)
    store = PayloadStore()
    for j, (data, proof) in enumerate(zip(THEIRS, merkle.proofs(THEIR_DIGESTS))):
        store.put_slice(THEIR_ROOT, j, StoredSlice(0, THEIR_DIGESTS[j].hex(), tuple(proof), len(THEIRS), data))
    me = Identity.generate()  # the owner serving here
    server, port = serve_payloads(PayloadServicer(store, verify_header=lambda s: header, accept_slice_pushes=True,
                                                  own_peer_id=me.peer_id), ByteCounter("owner"), host="127.0.0.1", port=0)
    pool = ChannelPool(ByteCounter("caller"))
    stub = pool.peer_stub(f"127.0.0.1:{port}")
    stub.endpoint = f"127.0.0.1:{port}"
    stub.pool = pool
    stub.author, stub.owner_id = author, me.peer_id  # the header's signer, who opens trades with the owner
    yield header, signed, store, stub
    pool.close()
    server.stop(0)


def _authors_ticket(stub):
    """The header's signer's ticket for its trade with the owner, round 0 (protocol/swap_ticket.py)."""
    return sign_swap_ticket(stub.author, run_id="run", round_=0, to=stub.owner_id)


def _trade(stub, signed, pushed, wanted=(1, 3), ticket="author's"):
    """A SwapSlices stream: `pushed` to the owner, its slices `wanted` back, under `ticket` (default:
    the header's signer's for the owner, round 0). -> what came back."""
    ticket = _authors_ticket(stub) if ticket == "author's" else ticket
    proven = merkle.ProvenNodes(THEIR_ROOT, len(THEIRS))
    plan = {stub.endpoint: [Wanted(max_size=1000, slice=j, proven=proven) for j in wanted]}
    return fetch_streams(stub.pool, plan, pushes={stub.endpoint: Push(signed, pushed, ticket=ticket)})[stub.endpoint]


def test_a_trade_keeps_the_pushed_slices_and_answers_the_request_in_one_stream(owner):
    header, signed, store, stub = owner
    root = header.root_bytes()
    came = _trade(stub, signed, [_item(0), _item(2)])
    assert [item.data for item in came] == [THEIRS[1], THEIRS[3]]  # answered, each checked against its root
    for j in (0, 2):
        held = store.get_slice(root, j)
        assert (held.payload, held.digest, list(held.proof)) == (SLICES[j], DIGESTS[j].hex(), PROOFS[j])
    assert store.get_slice(root, 1) is None
    assert stub.pool.counter.calls_to("SwapSlices") == {stub.endpoint: 1} and not stub.pool.counter.calls_to("FetchPayload")


def test_a_trade_refuses_a_pushed_slice_whose_proof_does_not_hold_and_still_answers(owner):
    header, signed, store, stub = owner
    forged = _item(2, data=b"x" * len(SLICES[2]))
    came = _trade(stub, signed, [_item(0), forged])
    assert [item.data for item in came] == [THEIRS[1], THEIRS[3]]
    assert store.get_slice(header.root_bytes(), 0).payload == SLICES[0]
    assert store.get_slice(header.root_bytes(), 2) is None  # the owner fetches it itself


def test_a_trade_pushing_more_than_the_signed_payload_is_cut_off_there(owner):
    header, signed, store, stub = owner
    padded = [_item(j) for j in range(4)] + [_item(4, data=SLICES[4] + b"more")]  # 4 bytes past the signed size
    came = _trade(stub, signed, padded, wanted=(0,))
    assert len(came) == 1  # what the broken stream did not bring is None: the caller's fallback fetches it
    root = header.root_bytes()
    assert [store.get_slice(root, j) is not None for j in range(len(SLICES))] == [True] * 4 + [False]  # what proved, kept


def test_a_trade_without_its_request_is_refused(owner):
    header, signed, store, stub = owner
    with pytest.raises(grpc.RpcError) as failed:
        list(stub.SwapSlices(iter([swarm_pb2.SlicePush(header=signed)]), timeout=30))
    assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "request" in failed.value.details()


def test_garbage_in_a_trade_ends_that_stream_with_an_error_and_the_owner_trades_on(owner):
    """Bytes that are no SlicePush, or a push naming no slice, end that one stream with a status
    (never a hang or a dead server); the next trade goes through."""
    header, signed, store, stub = owner

    async def garbage(messages):
        call = stub.pool.aio.raw_swap(stub.endpoint)(iter(messages), timeout=30)
        try:
            return [data async for data in call], None
        except grpc.aio.AioRpcError as exc:
            return None, exc.code()

    for messages in ([b"\xff\xff\xff not a message"],
                     [swarm_pb2.SlicePush(header=signed, want=swarm_pb2.FetchRequest()).SerializeToString(),
                      swarm_pb2.SlicePush(data=b"no slice started").SerializeToString()]):
        answered, code = stub.pool.aio.run(lambda: garbage(messages))
        assert answered is None and code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT), code
    assert [item.data for item in _trade(stub, signed, [_item(0)])] == [THEIRS[1], THEIRS[3]]
    assert store.get_slice(header.root_bytes(), 0).payload == SLICES[0]


def test_a_node_that_takes_no_pushes_refuses_a_trade_and_the_caller_gets_nothing_from_it():
    store = PayloadStore()
    server, port = serve_payloads(PayloadServicer(store, verify_header=lambda s: None), ByteCounter("coordinator"),
                                  host="127.0.0.1", port=0)
    pool = ChannelPool()
    try:
        proven = merkle.ProvenNodes(THEIR_ROOT, len(THEIRS))
        target = f"127.0.0.1:{port}"
        came = fetch_streams(pool, {target: [Wanted(max_size=1000, slice=0, proven=proven)]},
                             pushes={target: Push(swarm_pb2.Signed(), [_item(0)])})
        assert came == {target: [None]}  # refused (FAILED_PRECONDITION): the caller fetches it elsewhere
        assert store.get_slice(merkle.root(DIGESTS), 0) is None
    finally:
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


def test_a_push_that_ended_without_a_slice_ends_the_wait_for_it(owner):
    """A waiting owner stops waiting for a slice once the push that could bring it has ended
    without it (here: its proof failed), and fetches it at once instead of at its timeout."""
    header, signed, store, stub = owner
    root = header.root_bytes()
    waited = threading.Thread(target=store.wait_slices, args=([(root, 0), (root, 2)], 600.0), kwargs={"until_push_ended": True},
                              daemon=True)
    waited.start()
    _trade(stub, signed, [], ticket=None)  # a replayer's trade under the public header: its end ends no wait
    waited.join(0.5)
    assert waited.is_alive()
    _trade(stub, signed, [_item(0), _item(2, data=b"x" * len(SLICES[2]))])  # the author's own
    waited.join(60)
    assert not waited.is_alive()  # old code: waited its 600 s
    assert store.get_slice(root, 0) is not None and store.get_slice(root, 2) is None


def test_a_trade_that_ended_does_not_end_the_wait_for_a_client_mode_authors_push(owner):
    """Anyone may replay an author's signed header in a push of its own. A trade that ends under
    it (the author serves its slices: fetching them is the fallback) ends a trade's wait; a
    client-mode author's slices are served by nobody else, so its owner waits for them whole."""
    header, signed, store, stub = owner
    root = header.root_bytes()
    waited = threading.Thread(target=store.wait_slices, args=([(root, 1)], 600.0), daemon=True)
    waited.start()
    _trade(stub, signed, [])  # the header alone, nothing pushed: the trade ends
    waited.join(0.5)
    assert waited.is_alive()  # still waiting for the author's own push
    assert stub.PushSlices(push_slices(signed, [_item(1)]), timeout=30).accepted
    waited.join(60)
    assert not waited.is_alive()


def test_a_broken_trade_keeps_the_slices_that_proved_before_it_broke(owner):
    header, signed, store, stub = owner
    bad = _item(3, proof=[b"x" * 32] * 9)  # a proof longer than a 5-leaf tree is deep: the stream is refused there
    _trade(stub, signed, [_item(0), _item(2), bad], wanted=(1,))
    root = header.root_bytes()
    assert store.get_slice(root, 0).payload == SLICES[0] and store.get_slice(root, 2).payload == SLICES[2]
    assert store.get_slice(root, 3) is None


@pytest.mark.parametrize("pieces, why", [
    ([(1, True, b"a"), (1, True, b"b")], "pushed twice"),
    ([(7, True, b"a")], "not one of the update's"),
    ([(1, True, b"a"), (1, False, b"b")], "short of CHUNK_BYTES"),
    ([(1, True, b"a"), (1, False, b"")], "short of CHUNK_BYTES"),
])
def test_a_push_that_could_not_be_honest_is_refused(owner, pieces, why):
    """What a pusher may make an owner hold is bounded by what an honest push holds: each slice of
    the update started once, continued only after a full CHUNK_BYTES piece."""
    header, signed, store, stub = owner
    messages = [swarm_pb2.SlicePush(header=signed)] + [
        swarm_pb2.SlicePush(slice=j, start=start, proof=PROOFS[j % len(SLICES)] if start else (), data=data)
        for j, start, data in pieces]
    with pytest.raises(grpc.RpcError) as failed:
        stub.PushSlices(iter(messages), timeout=30)
    assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT and why in failed.value.details()


def test_push_progress_keeps_a_trade_alive_while_its_upload_moves():
    """A trade's answer may be long done while our push still uploads: the stream is alive while
    gRPC keeps taking our messages, and stalled once it stops taking them (or never had any)."""
    now = [100.0]
    progress = PushProgress(clock=lambda: now[0])
    assert not progress.moved_within(5.0)  # no push
    progress.moved()
    now[0] += 4.0
    assert progress.moved_within(5.0)
    now[0] += 2.0
    assert not progress.moved_within(5.0)  # nothing taken for 6 s: cut off as stalled
    progress.moved()
    progress.done = True
    assert not progress.moved_within(5.0)  # the push is all out: only the holder's answer counts


def test_a_push_of_a_round_far_from_ours_is_refused_and_moves_nothing():
    """A pushed header is only signed: one of a far-future round (any key can sign one) would move
    the store's newest round and drop what it holds. A node refuses pushes more than
    PUSH_ROUND_SLACK rounds from its own, and keeps what it held."""
    author = Identity.generate()
    far = build_update_header(run_id="run", round_=10**9, peer_id=author.peer_id, codec="fp16", numel=1, layout_hash="L",
                              base_param_hash="B", payload=b"".join(SLICES), slices=[d.hex() for d in DIGESTS])
    store = PayloadStore()
    held = _item(0)[1]
    store.put_slice(THEIR_ROOT, 0, StoredSlice(3, held.digest, held.proof, held.count, held.payload))  # ours, round 3
    server, port = serve_payloads(PayloadServicer(store, verify_header=lambda s: far, accept_slice_pushes=True,
                                                  current_round=lambda: 3), ByteCounter("owner"), host="127.0.0.1", port=0)
    pool = ChannelPool(ByteCounter("caller"))
    try:
        signed = sign_update(author, far)
        reply = pool.peer_stub(f"127.0.0.1:{port}").PushSlices(push_slices(signed, [_item(1)]), timeout=30)
        assert not reply.accepted and "round 1000000000" in reply.reason
        target = f"127.0.0.1:{port}"
        fetch_streams(pool, {target: [Wanted(max_size=1000, slice=0, proven=merkle.ProvenNodes(THEIR_ROOT, len(THEIRS)))]},
                      pushes={target: Push(signed, [_item(1)])})
        assert store.get_slice(far.root_bytes(), 1) is None  # neither push kept anything
        assert store.get_slice(THEIR_ROOT, 0) is not None  # and what the node held is still there
    finally:
        pool.close()
        server.stop(0)


def test_waiting_for_slices_nobody_pushes_ends_at_its_timeout():
    store = PayloadStore()
    store.wait_slices([(b"r" * 32, 0)], 0.05)  # returns; the caller then counts the author unreachable
    assert store.get_slice(b"r" * 32, 0) is None


def _tail_trade(stub, signed, sent: list[tuple[int, bytes]], expect: dict[int, int], ticket="author's"):
    """A trade with a tail (protocol/result_relay.py): our slice 0 pushed, their slice 1 wanted;
    then `sent` (our results) and what they owe us (`expect`), under `ticket` (default: the
    header's signer's for the owner, round 0). -> (answer, results we got, ended)."""
    ticket = _authors_ticket(stub) if ticket == "author's" else ticket
    got: list[tuple[int, bytes]] = []
    ended = threading.Event()

    async def ours():
        yield sent

    proven = merkle.ProvenNodes(THEIR_ROOT, len(THEIRS))
    push = Push(signed, [_item(0)], results=ours, expect=expect, on_result=lambda j, data: got.append((j, data)),
                on_end=ended.set, tail_s=5.0, ticket=ticket)
    came = fetch_streams(stub.pool, {stub.endpoint: [Wanted(max_size=1000, slice=1, proven=proven)]},
                         pushes={stub.endpoint: push})[stub.endpoint]
    return came, got, ended


def test_a_trade_carries_both_owners_results_back_once_reduced(owner):
    """After the inputs, the same stream carries each side's aggregated slices the other gathers
    from it: the caller's once its slices are sent, the owner's once its reduce puts them. The
    caller is back as soon as the answer is in; the bytes are stored under their sha256."""
    header, signed, store, stub = owner
    author = header.peer_id
    store.results.open(0, RelayPlan(send={author: [7]}, receive={author: {9: 100}}, wait_s=5.0))
    came, got, ended = _tail_trade(stub, signed, [(9, b"nine" * 20)], {7: 100})
    assert [item.data for item in came] == [THEIRS[1]]  # the answer, before the owner reduced anything
    # the answer and the take of our push run side by side at the owner: wait for the take, not a clock
    store.wait_slices([(header.root_bytes(), 0)], 30.0)
    assert store.get_slice(header.root_bytes(), 0).payload == SLICES[0]  # kept at inputs_done, not at the stream's end
    assert not ended.is_set() and got == []
    store.results.put(0, 7, b"seven" * 10)  # the owner's reduce
    assert ended.wait(5.0) and got == [(7, b"seven" * 10)]
    assert store.results.wait_inbound(0, 5.0)  # the caller's result came in
    assert store.get_blob(hashlib.sha256(b"nine" * 20).hexdigest()) == b"nine" * 20


def test_a_stream_under_a_replayed_header_carries_no_results_and_leaves_the_partner_its_place(owner):
    """A header is public (every manifest carries it): anyone can open a trade under a partner's.
    Without the partner's ticket for this owner, run and round (protocol/swap_ticket.py) such a stream
    still pushes slices that prove themselves and gets its answer, but neither takes the partner's
    results nor gets the owner's, even when the owner's are ready; the partner's own stream, after
    five of them, still carries both."""
    header, signed, store, stub = owner
    author, stranger = stub.author, Identity.generate()
    store.results.open(0, RelayPlan(send={author.peer_id: [7]}, receive={author.peer_id: {9: 100}}, wait_s=5.0))
    store.results.put(0, 7, b"seven" * 10)  # the owner's result for the author: ready before any stream comes
    replays = {
        "no ticket": None,
        "a stranger's": sign_swap_ticket(stranger, run_id="run", round_=0, to=stub.owner_id),
        "the author's for another owner": sign_swap_ticket(author, run_id="run", round_=0, to=stranger.peer_id),
        "the author's for another round": sign_swap_ticket(author, run_id="run", round_=1, to=stub.owner_id),
        "the author's for another run": sign_swap_ticket(author, run_id="other", round_=0, to=stub.owner_id),
    }
    for what, ticket in replays.items():
        mine = b"%d" % len(what) * 30  # this replayer's "result" for slice 9
        came, got, ended = _tail_trade(stub, signed, [(9, mine)], {7: 100}, ticket=ticket)
        assert [item.data for item in came] == [THEIRS[1]], what  # the answer, as any fetch gets it
        assert ended.wait(5.0) and got == [], what  # the owner's ready result did not go to it
        assert store.get_blob(hashlib.sha256(mine).hexdigest()) is None, what  # nor was its result taken
    assert store.get_slice(header.root_bytes(), 0).payload == SLICES[0]  # the pushed slice proved itself: kept
    came, got, ended = _tail_trade(stub, signed, [(9, b"nine" * 20)], {7: 100})  # the author's own stream
    assert ended.wait(5.0) and got == [(7, b"seven" * 10)]
    assert store.results.wait_inbound(0, 5.0) and store.get_blob(hashlib.sha256(b"nine" * 20).hexdigest()) == b"nine" * 20


def test_a_swap_ticket_holds_only_for_its_signer_callee_run_and_round():
    author, owner_id = Identity.generate(), Identity.generate().peer_id
    header = build_update_header(run_id="run", round_=4, peer_id=author.peer_id, codec="fp16", numel=1, layout_hash="L",
                                 base_param_hash="B", payload=b"".join(SLICES), slices=[d.hex() for d in DIGESTS])
    ticket = sign_swap_ticket(author, run_id="run", round_=4, to=owner_id)
    assert ticket_holds(ticket, header, owner_id)
    assert not ticket_holds(ticket, header, "")  # a servicer that does not know who it is takes no ticket
    assert not ticket_holds(None, header, owner_id)
    assert not ticket_holds(ticket, header, Identity.generate().peer_id)
    forged = swarm_pb2.Signed()
    forged.CopyFrom(ticket)
    forged.body = forged.body.replace(b'"round":4', b'"round":5')
    assert not ticket_holds(forged, header, owner_id)  # its signature no longer holds
    for other in (sign_swap_ticket(author, run_id="run", round_=3, to=owner_id),
                  sign_swap_ticket(Identity.generate(), run_id="run", round_=4, to=owner_id)):
        assert not ticket_holds(other, header, owner_id)
    assert not ticket_holds(sign_update(author, header), header, owner_id)  # a header is no ticket (its tag differs)


def test_a_result_nobody_owes_ends_the_stream_and_keeps_the_inputs(owner):
    """A caller that sends a result the plan does not route from it (or larger than the run's
    bound) has its stream cut there; the slices it pushed before still count, nothing of the
    result is stored, and the owner stops waiting for that caller's results."""
    header, signed, store, stub = owner
    author = header.peer_id
    store.results.open(0, RelayPlan(send={}, receive={author: {9: 100}}, wait_s=5.0))
    for sent in ([(8, b"x" * 50)], [(9, b"y" * 101)]):
        came, got, ended = _tail_trade(stub, signed, sent, {})
        assert [item.data for item in came] == [THEIRS[1]] and ended.wait(5.0)
        assert store.results.wait_inbound(0, 5.0)  # its stream ended: the gather fetches slice 9
        assert store.get_blob(hashlib.sha256(sent[0][1]).hexdigest()) is None
        assert store.get_slice(header.root_bytes(), 0).payload == SLICES[0]
        store.results.open(0, RelayPlan(send={}, receive={author: {9: 100}}, wait_s=5.0))


def test_a_trade_wanting_nothing_returns_at_once_and_its_tail_goes_on(owner):
    """A trade whose caller wants none of the owner's slices (it holds them) is back as soon as its
    push is on its way, not after the owner's reduce or a stall timeout; the tail still brings the
    owner's result once reduced."""
    header, signed, store, stub = owner
    store.results.open(0, RelayPlan(send={header.peer_id: [7]}, receive={}, wait_s=5.0))
    got, ended = [], threading.Event()
    push = Push(signed, [_item(0)], expect={7: 100}, on_result=lambda j, data: got.append((j, data)), on_end=ended.set, tail_s=5.0,
                ticket=_authors_ticket(stub))
    assert fetch_streams(stub.pool, {}, pushes={stub.endpoint: push}) == {stub.endpoint: []}
    assert not ended.is_set()
    store.results.put(0, 7, b"seven")
    assert ended.wait(5.0) and got == [(7, b"seven")]
    assert store.get_slice(header.root_bytes(), 0).payload == SLICES[0]


def test_a_trade_whose_answer_fails_at_once_still_ends_the_owners_waits_and_keeps_what_it_pushed(owner):
    """The owner's answer fails before the stream's take of the push first runs (here: a request for
    more items than one fetch may name). The take's clean-up still happens: the proven slice of
    the first message is kept, the owner's wait for the rest of the push ends (it fetches it), and
    so does the gather's wait for the partner's results (old code: the cancelled take never ran its
    clean-up, and both waits ran to their timeouts)."""
    header, signed, store, stub = owner
    author, root = header.peer_id, header.root_bytes()
    store.results.open(0, RelayPlan(send={author: [7]}, receive={author: {9: 100}}, wait_s=600.0))
    waited = threading.Thread(target=store.wait_slices, args=([(root, 0), (root, 2)], 600.0), kwargs={"until_push_ended": True},
                              daemon=True)
    waited.start()
    _, held = _item(0)
    first = next(push_slices(signed, [(0, held)], ticket=_authors_ticket(stub), takes_results=True,
                             want=swarm_pb2.FetchRequest(items=[swarm_pb2.FetchItem(slice=1, slices_root=THEIR_ROOT)] * (MAX_ITEMS + 1))))
    with pytest.raises(grpc.RpcError) as err:
        list(stub.SwapSlices(iter([first]), timeout=30))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "items in one fetch" in err.value.details()
    waited.join(60)
    assert not waited.is_alive()
    assert store.get_slice(root, 0).payload == SLICES[0] and store.get_slice(root, 2) is None
    assert store.results.wait_inbound(0, 5.0)
