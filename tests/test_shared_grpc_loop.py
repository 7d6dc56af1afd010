"""A serving node's batched fetches run on its own Peer server's event loop (AioChannels.share_loop):
one gRPC loop per process, so gRPC does not hand completions from one loop's thread to another's.
Over real gRPC on loopback: fetches from the node's own server and from another come back checked,
no fetch-loop thread is started, closing the pool leaves the server serving, a fetch after the
server stopped brings nothing (PoolClosed inside, None to the caller), and a fetch in flight when
the pool closes is released at once."""

from __future__ import annotations

import hashlib
import threading

import pytest

from protocol.accounting import ByteCounter
from protocol.aio_channels import PoolClosed
from protocol.batched_fetch import Wanted, fetch_items
from protocol.payload_fetch import ChannelPool
from protocol.payload_service import PayloadServicer, serve_payloads
from protocol.payload_store import PayloadStore
from tests.helpers import assert_closing_releases_a_fetch_in_flight

BLOBS = [bytes([i]) * (40_000 + i) for i in range(5)]


def _holder():
    store = PayloadStore()
    for blob in BLOBS:
        store.put_blob(hashlib.sha256(blob).hexdigest(), 0, blob)
    return serve_payloads(PayloadServicer(store, verify_header=lambda s: None), ByteCounter("holder"), host="127.0.0.1", port=0)


def _wanted() -> list[Wanted]:
    return [Wanted(max_size=len(b), sha256=hashlib.sha256(b).hexdigest()) for b in BLOBS]


@pytest.fixture
def node():
    """A node's pair: its Peer server and its pool on that server's loop; plus another holder."""
    (own, own_port), (other, other_port) = _holder(), _holder()
    pool = ChannelPool(ByteCounter("node"))
    pool.aio.share_loop(own.loop)
    yield pool, own, f"127.0.0.1:{own_port}", f"127.0.0.1:{other_port}"
    pool.close()
    for server in (own, other):
        server.stop(0).wait(5)


def _fetch_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name == "swarmloco-fetch-loop"]


def test_fetches_run_on_the_servers_loop_and_check(node):
    pool, _, own, other = node
    before = _fetch_threads()
    for endpoint in (own, other):
        got = fetch_items(pool, endpoint, _wanted())
        assert [g.data if g is not None else None for g in got] == BLOBS
    assert _fetch_threads() == before  # no loop thread of the pool's own
    assert pool.counter.total().received > sum(map(len, BLOBS)) * 2  # both fetches counted


def test_closing_the_pool_leaves_the_server_serving(node):
    pool, _, own, _ = node
    assert fetch_items(pool, own, _wanted()[:1])[0] is not None
    pool.close()
    assert fetch_items(pool, own, _wanted()[:1]) == [None]  # a closed pool fetches nothing
    other_pool = ChannelPool()  # but the server still answers everyone else
    try:
        assert fetch_items(other_pool, own, _wanted())[4].data == BLOBS[4]
    finally:
        other_pool.close()


def test_after_the_server_stopped_a_fetch_brings_nothing_and_raises_nothing(node):
    pool, server, _, other = node
    server.stop(0).wait(5)
    with pytest.raises(PoolClosed, match="has stopped"):
        pool.aio.run(lambda: _nothing())
    assert fetch_items(pool, other, _wanted()[:2]) == [None, None]  # the caller's fallback takes over
    pool.close()  # and closing after it is quiet


async def _nothing() -> None:
    return None


def test_closing_the_pool_releases_a_fetch_in_flight(node):
    """On the server's loop too: close() cancels the pool's own fetches; the loop goes on."""
    pool, _, own, _ = node
    assert_closing_releases_a_fetch_in_flight(pool, _wanted()[:1])
    other_pool = ChannelPool()
    try:
        assert fetch_items(other_pool, own, _wanted()[:1])[0] is not None  # the server still answers
    finally:
        other_pool.close()


def test_work_left_on_a_loop_closed_under_it_ends_with_pool_closed():
    """The window a server's stop leaves: the loop has stopped but is not yet closed, a fetch is
    scheduled on it, and the close then drops it. The caller gets PoolClosed instead of waiting
    forever (here: a loop that never runs, closed while the caller waits)."""
    import asyncio

    loop = asyncio.new_event_loop()  # stopped: what it is handed is never run
    pool = ChannelPool()
    pool.aio.share_loop(loop)
    outcome: list = []

    def call() -> None:
        try:
            pool.aio.run(lambda: _nothing())
        except PoolClosed as exc:
            outcome.append(str(exc))

    caller = threading.Thread(target=call)
    caller.start()
    try:
        caller.join(1.0)
        assert caller.is_alive()  # scheduled on the loop, nothing ran it
        loop.close()
        caller.join(10)
        assert not caller.is_alive() and outcome and "stopped during the fetch" in outcome[0]
    finally:
        if not loop.is_closed():
            loop.close()
        pool.close()


def test_run_refuses_to_block_its_own_loop(node):
    """Called from a coroutine on the shared loop, run() would wait on that very loop (and freeze the
    server on it): it says so instead."""
    pool, own_server, _, _ = node
    import asyncio

    async def inside() -> str:
        try:
            pool.aio.run(lambda: _nothing())
        except RuntimeError as exc:
            return str(exc)
        return "ran"

    said = asyncio.run_coroutine_threadsafe(inside(), own_server.loop).result(10)
    assert "its own loop's thread" in said
