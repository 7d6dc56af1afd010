"""A holder that answers nothing (its link cut, its process frozen: issue 22's partition) is cut off
after the stall bound, and the fallback asks the next holder instead of waiting on it again
(protocol/stall_watch.py). Real gRPC on loopback; the frozen holder is a TCP listener that accepts
and never speaks, as a SIGSTOPped process's kernel does."""

from __future__ import annotations

import hashlib
import socket
import time
from datetime import timedelta

import pytest

from protocol.accounting import ByteCounter
from protocol.identity import Identity
from protocol.batched_fetch import Wanted, fetch_items
from protocol.payload_fetch import ChannelPool, FetchError, fetch_blob
from protocol.payload_service import PayloadServicer, serve_payloads
from protocol.payload_store import PayloadStore
from protocol.stall_watch import STALLS

STALL = timedelta(seconds=1)
BOUND_S = 15.0  # generous: the stall bound is 1 s (without it: the 120 s transfer deadline)


@pytest.fixture
def holders():
    frozen = socket.socket()
    frozen.bind(("127.0.0.1", 0))
    frozen.listen(16)  # the kernel completes the handshake; nobody ever reads or answers
    store = PayloadStore()
    data = bytes(range(256)) * 40
    sha = hashlib.sha256(data).hexdigest()
    store.put_blob(sha, 0, data)
    server, port = serve_payloads(PayloadServicer(store, verify_header=lambda s: None, accept_pushes=False), ByteCounter("holder"),
                                  host="127.0.0.1", port=0)
    counter = ByteCounter(Identity.generate().peer_id)
    pool = ChannelPool(counter)
    yield f"127.0.0.1:{frozen.getsockname()[1]}", f"127.0.0.1:{port}", data, sha, counter, pool
    pool.close()
    server.stop(0)
    frozen.close()


def test_a_silent_holder_is_cut_off_and_the_fallback_asks_the_next_one(holders):
    frozen, live, data, sha, counter, pool = holders
    started = time.monotonic()
    got = fetch_items(pool, frozen, [Wanted(max_size=len(data), sha256=sha)], stall=STALL)
    assert got == [None] and time.monotonic() - started < BOUND_S
    assert STALLS.stalled(frozen) and not STALLS.stalled(live)
    # The fallback right after: the frozen holder is not asked again, the live one serves it.
    assert fetch_blob(pool, [frozen, live], sha, len(data), stall=STALL) == data
    assert counter.calls_to("FetchPayload") == {frozen: 1, live: 1}
    with pytest.raises(FetchError, match="not asked again"):
        fetch_blob(pool, [frozen], sha, len(data), stall=STALL)
    assert time.monotonic() - started < BOUND_S


def test_after_its_bound_a_cut_off_holder_is_asked_again(holders):
    frozen, live, data, sha, counter, pool = holders
    with pytest.raises(FetchError, match="sent nothing for 1 s"):
        fetch_blob(pool, [frozen], sha, len(data), stall=STALL)
    deadline = time.monotonic() + BOUND_S
    while STALLS.stalled(frozen):  # for its stall bound only: a holder that comes back is asked again
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert fetch_blob(pool, [frozen, live], sha, len(data), stall=STALL) == data
    assert counter.calls_to("FetchPayload") == {frozen: 2, live: 1}
