"""The all-gather riding the trades (protocol/result_relay.py): routes, the relay's waits, and the
bounds on what a partner may make us hold."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter

import pytest

from peer.run import slice_plan
from protocol.result_relay import RelayPlan, ResultPieces, ResultRelay, result_chunks
from protocol.rpc_errors import RpcAbort
from protocol.wire import swarm_pb2


def collect(relay: ResultRelay, round_: int, partner: str, plan_wait_s: float = 1.0) -> list[tuple[int, bytes]]:
    async def run() -> list[tuple[int, bytes]]:
        return [item async for batch in relay.outgoing(round_, partner, plan_wait_s) for item in batch]

    return asyncio.run(run())


def test_result_routes_hand_every_gatherer_each_slice_it_does_not_own_from_one_owner_split_evenly():
    peers = [f"p{i}" for i in range(8)]
    owners = slice_plan.assign_owners(peers, 32, 2, b"seed")
    routes = {p: slice_plan.result_routes(owners, peers, p) for p in peers}
    for gatherer in peers:
        got = Counter(j for sender in peers for j in routes[sender][0].get(gatherer, []))
        assert sorted(got) == [j for j in range(32) if gatherer not in owners[j]] and set(got.values()) == {1}
        assert gatherer not in routes[gatherer][0]
        # both ends agree: what a sender routes to a gatherer is what the gatherer expects from it
        assert {s: sorted(js) for s, js in routes[gatherer][1].items()} == {
            s: sorted(routes[s][0][gatherer]) for s in peers if gatherer in routes[s][0]}
    for j, (a, b) in enumerate(owners):  # a slice's two owners each serve half of its 6 gatherers
        assert sum(j in js for js in routes[a][0].values()) == sum(j in js for js in routes[b][0].values()) == 3
    assert slice_plan.result_routes(owners, peers, "stranger") == ({}, {})


def test_outgoing_sends_each_planned_slice_once_as_it_is_reduced_and_waits_for_the_plan():
    relay = ResultRelay()
    plan = RelayPlan(send={"b": [3, 5, 7]}, receive={}, wait_s=5.0)

    def reduce_later() -> None:
        relay.open(4, plan)  # the partner's stream came before our manifest did
        relay.put(4, 7, b"seven")
        relay.put(4, 2, b"not routed to b")
        relay.put(4, 3, b"three")
        relay.put(4, 5, b"five")

    timer = threading.Timer(0.05, reduce_later)
    timer.start()
    try:
        sent = collect(relay, 4, "b")
    finally:
        timer.join()
    assert sorted(sent) == [(3, b"three"), (5, b"five"), (7, b"seven")]
    assert collect(relay, 4, "c") == []  # routed nothing


def test_a_waiting_stream_is_woken_once_when_its_batch_is_complete_not_per_result(monkeypatch):
    from protocol import result_relay

    wakes: list[object] = []
    real_wake = result_relay._wake
    monkeypatch.setattr(result_relay, "_wake", lambda waiter: (wakes.append(waiter), real_wake(waiter)))
    relay = ResultRelay()
    relay.open(4, RelayPlan(send={"b": [3, 5, 7]}, receive={}, wait_s=30.0))
    sent: list[tuple[int, bytes]] = []
    stream = threading.Thread(target=lambda: sent.extend(collect(relay, 4, "b")))
    stream.start()
    try:
        box = relay._rounds[4].outboxes["b"]
        for _ in range(2000):  # until the stream waits on its batch (bounded: 20 s)
            if box.woken is not None:
                break
            threading.Event().wait(0.01)
        assert box.woken is not None
        relay.put(4, 3, b"three")
        relay.put(4, 5, b"five")
        assert wakes == [] and box.woken is not None  # two of three: the stream sleeps on
        relay.put(4, 7, b"seven")
    finally:
        stream.join(timeout=30)
    assert len(wakes) == 1 and sorted(sent) == [(3, b"three"), (5, b"five"), (7, b"seven")]


def test_outgoing_stops_when_the_reduce_is_abandoned_or_no_plan_comes():
    relay = ResultRelay()
    relay.open(1, RelayPlan(send={"b": [0, 1]}, receive={}, wait_s=30.0))
    relay.put(1, 0, b"zero")
    threading.Timer(0.05, relay.abandon, args=(1,)).start()
    assert collect(relay, 1, "b") == [(0, b"zero")]  # slice 1 never comes: the stream ends, the partner fetches it
    assert collect(ResultRelay(), 9, "b", plan_wait_s=0.05) == []  # no manifest for that round here


def test_wait_inbound_ends_once_every_due_result_is_in_or_its_stream_ended():
    relay = ResultRelay()
    assert relay.wait_inbound(2, 0.0)  # nothing routed to us
    relay.open(2, RelayPlan(send={}, receive={"b": {1: 10, 4: 10}, "c": {6: 10}, "d": {7: 10}}, wait_s=5.0))
    assert relay.wait_inbound(2, 0.0)  # no stream with any of them yet: a trade that never reached us owes nothing
    assert relay.started(2, "b") and relay.started(2, "c") and relay.started(2, "d")
    assert not relay.started(2, "b")  # a second stream under b's header (a replay) takes nothing of b's
    assert not relay.wait_inbound(2, 0.05)
    assert relay.is_due(2, "b", 1) and not relay.is_due(2, "c", 5)  # not due from c: a receiver drops it
    relay.received(2, "b", 1)
    relay.received(2, "b", 4)
    assert not relay.is_due(2, "b", 1)  # once
    assert relay.wait_inbound(2, 0.0, {"b"}) and not relay.wait_inbound(2, 0.05)
    relay.ended(2, "d")
    threading.Timer(0.05, relay.ended, args=(2, "c")).start()  # c's stream broke: the gather fetches slice 6
    assert relay.wait_inbound(2, 5.0)


def test_a_second_stream_under_a_partners_header_gets_none_of_its_results():
    relay = ResultRelay()
    relay.open(3, RelayPlan(send={"b": [1, 2]}, receive={}, wait_s=5.0))
    relay.put(3, 1, b"one")
    relay.put(3, 2, b"two")

    async def both() -> tuple[list, list]:
        async def one() -> list:
            return [item async for batch in relay.outgoing(3, "b", 1.0) for item in batch]
        return await one(), await one()

    first, second = asyncio.run(both())
    assert sorted(first) == [(1, b"one"), (2, b"two")] and second == []


def test_old_rounds_are_dropped():
    relay = ResultRelay(keep_rounds=2)
    for r in range(6):
        relay.open(r, RelayPlan(send={}, receive={"b": {0: 1}}, wait_s=1.0))
        relay.started(r, "b")
    assert relay.wait_inbound(1, 0.0)  # dropped: nothing due any more
    assert not relay.wait_inbound(4, 0.0)


def test_result_pieces_take_what_is_owed_in_pieces_and_refuse_the_rest():
    whole: list[tuple[int, bytes]] = []
    pieces = ResultPieces({2: 10, 3: 4}, lambda j, data: whole.append((j, data)))
    for chunk in result_chunks([(2, b"0123456789")], 4):  # three pieces: 4 + 4 + 2
        pieces.take(chunk)
    assert whole == [(2, b"0123456789")]
    for bad, why in [((5, b"x"), "not one this stream owes"), ((2, b"again"), "twice"), ((3, b"12345"), "at most 4"),
                     ((3, b""), "empty")]:
        fresh = ResultPieces({2: 10, 3: 4}, lambda j, data: None)
        if why == "twice":
            fresh.take(result_chunks([(2, b"first")], 8)[0])
        with pytest.raises(RpcAbort, match=why):
            fresh.take(result_chunks([bad], 8)[0] if bad[1] else swarm_pb2.Chunk(result=bad[0], offset=0, total_size=4))
    chunks = result_chunks([(2, b"0123456789")], 4)
    skipping = ResultPieces({2: 10}, lambda j, data: None)
    skipping.take(chunks[0])
    with pytest.raises(RpcAbort, match="out of order"):
        skipping.take(chunks[2])  # offset 8 where 4 was next


def test_a_store_keeps_only_the_results_a_partner_owes_once():
    from protocol.payload_store import PayloadStore
    import hashlib

    store = PayloadStore()
    store.results.open(5, RelayPlan(send={}, receive={"b": {2: 100}}, wait_s=5.0))
    store.results.started(5, "b")
    store.take_result(5, "b", 3, b"not owed")
    store.take_result(5, "b", 2, b"owed")
    store.take_result(5, "b", 2, b"owed again, other bytes")
    store.take_result(5, "c", 2, b"not a partner")
    held = {sha for sha in (hashlib.sha256(x).hexdigest() for x in (b"not owed", b"owed", b"owed again, other bytes", b"not a partner"))
            if store.get_blob(sha) is not None}
    assert held == {hashlib.sha256(b"owed").hexdigest()} and store.results.wait_inbound(5, 0.0)
