"""Aggregated slices riding the reduce-scatter's trade streams (issue 24: fewer stream ends a round).

Every two slice owners already hold one SwapSlices stream in the reduce-scatter (slice_plan.
swap_partners). Once an owner has reduced its slices, the results its partner will gather go back
over that same stream (each gatherer gets slice j from ONE of j's owners, slice_plan.result_routes),
so the all-gather needs no stream of its own for them, and they arrive while the coordinator is
still collecting the signed results:

  sending    the exchange opens a round's plan (what we send each partner, what each sends us) and
             puts each of our results as it is reduced; each trade stream, at either end, sends
             the partner its slices in ONE batch once the last of them is in (`outgoing`; a message
             per slice cost both ends more loop passes than the streams it saved)
  receiving  a result piece is taken only for a slice the plan expects from that partner, once, at
             most the run's result size, never empty (`ResultPieces`); the bytes are stored under
             their own sha256 while the partner owes them (PayloadStore.take_result): nothing is
             believed until the gather finds that sha256 signed by the slice's owners, exactly as
             for bytes it fetched itself. Only the partner's own stream, the first under its header
             with its ticket naming us (protocol/swap_ticket.py: anyone may replay a signed header),
             takes its results or gets ours
  gather     waits (bounded) until the results of the partners whose stream started are in or
             those streams ended (`wait_inbound`), then fetches whatever is still missing as before

Nothing here decides what the swarm applies: a lying partner's bytes simply match no signed hash.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable, Collection, Mapping, Sequence

import grpc

from protocol._generated import swarm_pb2
from protocol.channels import CHUNK_BYTES
from protocol.rpc_errors import RpcAbort
from protocol.streaming import iter_chunks


@dataclass(frozen=True, slots=True)
class RelayPlan:
    """One round's routes at one owner: partner peer_id -> the slices we send it, and partner
    peer_id -> {slice: its result's size bound} that it sends us."""

    send: Mapping[str, Sequence[int]]
    receive: Mapping[str, Mapping[int, int]]
    wait_s: float  # how long a stream waits for our results (then the partner fetches them)


@dataclass(slots=True)
class _Outbox:
    """Our results of one round for one partner: those ready and not yet taken by its stream."""

    ready: list[tuple[int, bytes]] = field(default_factory=list)
    left: int = 0  # still to be reduced
    claimed: bool = False  # a stream is sending these: another with the same partner's header gets nothing
    woken: tuple[asyncio.AbstractEventLoop, asyncio.Future] | None = None  # its stream, waiting


@dataclass(slots=True)
class _Round:
    plan: RelayPlan | None = None
    outboxes: dict[str, _Outbox] = field(default_factory=dict)
    routes: dict[int, list[str]] = field(default_factory=dict)  # slice -> the partners it goes to
    due: dict[str, set[int]] = field(default_factory=dict)  # partner -> the slices still due from it
    # partners one of whose streams with us takes their results now (ours we open ourselves; theirs
    # once it came in; one at a time): only those are waited for (a trade that never reached us, or
    # ended, owes nothing more that will come)
    taking: set[str] = field(default_factory=set)
    abandoned: bool = False


class ResultRelay:
    """A node's routes of aggregated slices over its trade streams, for the last few rounds.
    Thread-safe: the exchange puts from its slice threads, the streams read on an event loop. A
    stream is woken once, by the put that completes its batch (or the abandon that ends it)."""

    def __init__(self, keep_rounds: int = 2) -> None:
        self.keep_rounds = keep_rounds
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._rounds: dict[int, _Round] = {}
        self._plan_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []

    # --- the exchange's side -------------------------------------------------------------

    def open(self, round_: int, plan: RelayPlan) -> None:
        """Round `round_`'s routes, known once the manifest is (before the trades start)."""
        with self._lock:
            entry = self._round(round_)
            entry.plan = plan
            entry.outboxes = {partner: _Outbox(left=len(slices)) for partner, slices in plan.send.items()}
            entry.routes = {}
            for partner, slices in plan.send.items():
                for j in slices:
                    entry.routes.setdefault(j, []).append(partner)
            entry.due = {partner: set(slices) for partner, slices in plan.receive.items() if slices}
            self._changed.notify_all()
            waiters, self._plan_waiters = self._plan_waiters, []
        for waiter in waiters:
            _wake(waiter)

    def put(self, round_: int, j: int, data: bytes) -> None:
        """Our aggregated slice j of `round_`, reduced: the streams that owe it to a partner send it."""
        woken = []
        with self._lock:
            entry = self._rounds.get(round_)
            if entry is None or entry.abandoned:
                return
            for partner in entry.routes.pop(j, ()):
                box = entry.outboxes[partner]
                box.ready.append((j, data))
                box.left -= 1
                if box.left <= 0 and box.woken is not None:  # its stream sends one batch: woken once, when complete
                    woken.append(box.woken)
                    box.woken = None
        for waiter in woken:
            _wake(waiter)

    def abandon(self, round_: int) -> None:
        """Our results of `round_` that are not in by now never will be (the reduce failed or the
        round was left): the streams stop waiting for them."""
        with self._lock:
            entry = self._round(round_)
            entry.abandoned = True
            woken = [box.woken for box in entry.outboxes.values() if box.woken is not None]
            for box in entry.outboxes.values():
                box.woken = None
            waiters, self._plan_waiters = self._plan_waiters, []
        for waiter in woken + waiters:
            _wake(waiter)

    def started(self, round_: int, partner: str) -> bool:
        """A stream with `partner` that will carry its results to us began (ours when we open it,
        its own when it comes in, under the partner's ticket). -> False when one already does (a
        second ticketed stream: a replay, whose results we do not take)."""
        with self._lock:
            entry = self._round(round_)
            if partner in entry.taking:
                return False
            entry.taking.add(partner)
            return True

    def is_due(self, round_: int, partner: str, j: int) -> bool:
        """Whether `partner` still owes us its result for slice j (what it sends beyond that is
        dropped: what a partner makes us hold is what it owes)."""
        with self._lock:
            entry = self._rounds.get(round_)
            return entry is not None and j in entry.due.get(partner, ())

    def received(self, round_: int, partner: str, j: int) -> None:
        """`partner`'s result for slice j is in (stored)."""
        with self._lock:
            entry = self._rounds.get(round_)
            if entry is not None and j in entry.due.get(partner, ()):
                entry.due[partner].discard(j)
                self._changed.notify_all()

    def ended(self, round_: int, partner: str) -> None:
        """`partner`'s stream with us ended: what it did not bring is fetched by the gather."""
        with self._lock:
            entry = self._rounds.get(round_)
            if entry is not None and partner in entry.taking:
                entry.taking.discard(partner)
                if entry.due.pop(partner, None):
                    self._changed.notify_all()

    def wait_inbound(self, round_: int, timeout_s: float, partners: Collection[str] | None = None) -> bool:
        """Block until the results of `round_` due from `partners` (default: all) whose streams
        started are in or those streams ended, or `timeout_s` passed (False). True at once when
        nothing is due to us."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while True:
                entry = self._rounds.get(round_)
                if entry is None or not any(due for p, due in entry.due.items()
                                            if p in entry.taking and (partners is None or p in partners)):
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)

    # --- the streams' side (on an event loop) ----------------------------------------------

    async def plan(self, round_: int, wait_s: float) -> RelayPlan | None:
        """Round `round_`'s plan, waiting up to wait_s for the exchange to open it (a partner's
        stream may come in before our own manifest did); None when it never did."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            with self._lock:
                entry = self._rounds.get(round_)
                if entry is not None and (entry.plan is not None or entry.abandoned):
                    return entry.plan
                waiter = (loop, loop.create_future())
                self._plan_waiters.append(waiter)
            try:
                if not await _woken_by(waiter[1], deadline):
                    return None
            finally:
                with self._lock:
                    if waiter in self._plan_waiters:
                        self._plan_waiters.remove(waiter)

    async def outgoing(self, round_: int, partner: str, plan_wait_s: float) -> AsyncIterator[list[tuple[int, bytes]]]:
        """Our results of `round_` that `partner` gathers from us, all in one batch once the last
        is reduced (an owner's reduces end close together, and each message costs both ends a
        write, a read and several loop passes: one batch, not one per slice); the plan waited for
        up to plan_wait_s, the results for up to its wait_s in all: then what is ready goes, and
        the partner fetches the rest."""
        plan = await self.plan(round_, plan_wait_s)
        if plan is None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + plan.wait_s
        mine: bool | None = None
        while True:
            with self._lock:
                entry = self._rounds.get(round_)
                box = None if entry is None else entry.outboxes.get(partner)
                if box is None or box.claimed and mine is None:
                    return  # not our partner this round, or another stream under its header sends them
                if mine is None:
                    box.claimed = mine = True
                if box.left <= 0 or entry.abandoned:
                    ready, box.ready = box.ready, []
                    break
                box.woken = (loop, loop.create_future())
                woken = box.woken[1]
            if not await _woken_by(woken, deadline):
                with self._lock:
                    ready, box.ready = box.ready, []
                break
        if ready:
            yield ready

    # --- under the lock ---------------------------------------------------------------------

    def _round(self, round_: int) -> _Round:
        entry = self._rounds.get(round_)
        if entry is None:
            entry = self._rounds[round_] = _Round()
            newest = max(self._rounds)
            for old in [r for r in self._rounds if r < newest - self.keep_rounds]:
                del self._rounds[old]
        return entry


async def _woken_by(woken: asyncio.Future, deadline: float) -> bool:
    """Wait for `woken` until the loop time `deadline`: False when it passed first."""
    try:
        async with asyncio.timeout_at(deadline):
            await woken
        return True
    except TimeoutError:
        return False


def _wake(waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future]) -> None:
    loop, woken = waiter
    try:
        loop.call_soon_threadsafe(_set_once, woken)
    except RuntimeError:  # that loop closed: nobody waits there any more
        pass


def _set_once(woken: asyncio.Future) -> None:
    if not woken.done():
        woken.set_result(None)


class ResultPieces:
    """The receiving end of a partner's results on one stream: Chunk pieces (result, offset,
    total_size, data) of the slices `expected` ({slice: at most bytes}) allows, each slice once
    and in order; `whole(j, data)` for each slice whose bytes are all in. RpcAbort on a piece
    that breaks those rules (the caller ends the stream with it)."""

    def __init__(self, expected: Mapping[int, int], whole: Callable[[int, bytes], None]) -> None:
        self.expected, self.whole = expected, whole
        self.seen: set[int] = set()
        self.current: int | None = None
        self.size = 0
        self.buffer: bytes | bytearray = b""  # the slice in progress; a bytearray only once it spans pieces

    def take(self, chunk: swarm_pb2.Chunk) -> None:
        j, data = chunk.result, chunk.data  # (read once: each read of a bytes field copies)
        if not data:  # an honest sender never sends an empty piece: each would cost a pass for nothing
            raise RpcAbort(grpc.StatusCode.INVALID_ARGUMENT, f"an empty result piece (slice {j})", swarm_pb2.MALFORMED)
        if self.current is None:
            if j not in self.expected or j in self.seen or chunk.offset != 0:
                raise RpcAbort(grpc.StatusCode.INVALID_ARGUMENT, f"result of slice {j} sent twice, not from its start, or not "
                                                                 "one this stream owes", swarm_pb2.MALFORMED)
            if not 0 < chunk.total_size <= self.expected[j]:
                raise RpcAbort(grpc.StatusCode.INVALID_ARGUMENT, f"result of slice {j}: {chunk.total_size} bytes declared, "
                                                                 f"at most {self.expected[j]}", swarm_pb2.MALFORMED)
            self.seen.add(j)
            self.current, self.size, self.buffer = j, chunk.total_size, data
        elif j != self.current or chunk.total_size != self.size or chunk.offset != len(self.buffer):
            raise RpcAbort(grpc.StatusCode.INVALID_ARGUMENT, f"result piece of slice {j} at offset {chunk.offset} out of order",
                           swarm_pb2.MALFORMED)
        else:
            self.buffer = self.buffer if isinstance(self.buffer, bytearray) else bytearray(self.buffer)
            self.buffer.extend(data)
        if len(self.buffer) > self.size:
            raise RpcAbort(grpc.StatusCode.INVALID_ARGUMENT, f"result of slice {j}: more than its declared {self.size} bytes",
                           swarm_pb2.MALFORMED)
        if len(self.buffer) == self.size:
            whole, self.current, self.buffer = bytes(self.buffer) if isinstance(self.buffer, bytearray) else self.buffer, None, b""
            self.whole(j, whole)


def result_chunks(results: Sequence[tuple[int, bytes]], chunk_bytes: int = CHUNK_BYTES) -> list[swarm_pb2.Chunk]:
    """Our results as Chunk pieces of at most chunk_bytes each (Chunk.result names the slice)."""
    chunks = []
    for j, data in results:
        for chunk in iter_chunks(data, sha256=None, chunk_bytes=chunk_bytes):
            chunk.result = j
            chunks.append(chunk)
    return chunks
