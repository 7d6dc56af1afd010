"""Batched fetches: every object wanted from one holder in ONE FetchPayload stream, every holder of
a phase at once, all on one event loop (protocol/aio_channels.py) instead of a thread per stream.

One round trip per holder for all its objects (issue 24): the holder streams them in order, each
chunk naming its item, several items packed in one message (`packed`, payload_service.pack_chunks),
an item it lacks marked `missing`. Each object is checked as it completes (a slice against the
Merkle root its author signed, an object against its sha256) and handed to `on_item` at once,
while the stream's later objects still arrive. What did not come or did not check (missing, a
failed proof, a broken or lying stream) is None: the caller fetches it alone from the next holders
(protocol/payload_fetch.py). A holder that sends nothing for `stall` is cut off and remembered as
stalled (protocol/stall_watch.py), so that fallback asks the others first.

A stream may also carry what we push to the holder (`Push`: the reduce-scatter's trade between two
slice owners, SwapSlices): the same request and answer, our slices sent beside them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import logging
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import AsyncIterator, Callable, Mapping, Sequence

import grpc
from google.protobuf.message import DecodeError

from protocol import merkle
from protocol._generated import swarm_pb2
from protocol.accounting import PEER_HEADER, ByteCounter
from protocol.aio_channels import PoolClosed
from protocol.channels import STALL_TIMEOUT, TRANSFER_DEADLINE
from protocol.payload_fetch import ChannelPool, FetchedSlice
from protocol.payload_service import pack_chunks
from protocol.result_relay import ResultPieces, result_chunks
from protocol.rpc_errors import RpcAbort
from protocol.slice_push import HeldSlice, push_slices
from protocol.stall_watch import STALLS
from protocol.streaming import TransferError

log = logging.getLogger("swarmloco.fetch")
MAX_STREAMS = 64  # streams of one phase in flight at once (a larger phase queues the rest)
METHOD, SWAP_METHOD = "FetchPayload", "SwapSlices"
HASH_OFF_LOOP_BYTES = 1 << 20  # an item this large is hashed off the loop, in parallel with other streams'


@dataclass(frozen=True, slots=True)
class Wanted:
    """One object of a batched fetch: slice `slice` of the update whose proofs `proven` collects
    (checked against its root), or the object whose sha256 is `sha256`; at most `max_size` bytes."""

    max_size: int
    slice: int | None = None
    proven: merkle.ProvenNodes | None = None
    sha256: str = ""

    def __post_init__(self) -> None:
        a_slice = self.slice is not None and self.proven is not None and not self.sha256
        an_object = self.slice is None and self.proven is None and len(self.sha256) == 64
        if not (a_slice or an_object):
            raise ValueError("a wanted object is a slice with its ProvenNodes, or an object by its sha256 hex")


@dataclass(frozen=True, slots=True)
class Push:
    """What a stream sends beside its request (SwapSlices: a trade between two owners, issue 24):
    our signed header and the slices of our update the holder owns, (index, held slice)."""

    signed_header: swarm_pb2.Signed
    slices: Sequence[tuple[int, HeldSlice]]
    # The trade's tail (protocol/result_relay.py): our aggregated slices the holder gathers from us,
    # sent once they are reduced; the holder's for us (slice -> at most bytes), each handed to
    # `on_result` as it comes whole (on the loop), `on_end` once no more can come. With either,
    # fetch_streams returns as soon as the request's items are in and the stream goes on beside,
    # for at most `tail_s` more of silence.
    results: Callable[[], AsyncIterator[list[tuple[int, bytes]]]] | None = None
    expect: Mapping[int, int] = field(default_factory=dict)
    on_result: Callable[[int, bytes], None] | None = None
    on_end: Callable[[], None] | None = None
    tail_s: float = 0.0
    # Our signed word that the stream is ours with this holder this round (protocol/swap_ticket.py):
    # without it the holder takes our slices but neither sends nor takes results over the stream.
    ticket: swarm_pb2.Signed | None = None

    @property
    def has_tail(self) -> bool:
        return self.results is not None or bool(self.expect)


OnItem = Callable[[str, int, FetchedSlice], None]  # (holder, index in its wanted list, the checked object)


def fetch_items(pool: ChannelPool, holder: str, wanted: Sequence[Wanted], *, deadline: timedelta = TRANSFER_DEADLINE,
                stall: timedelta = STALL_TIMEOUT, on_item: Callable[[int, FetchedSlice], None] | None = None,
                ) -> list[FetchedSlice | None]:
    """fetch_streams from one holder: -> one entry per wanted object, None for what did not come."""
    each = None if on_item is None else (lambda _, k, item: on_item(k, item))
    return fetch_streams(pool, {holder: wanted}, deadline=deadline, stall=stall, on_item=each)[holder]


def fetch_streams(pool: ChannelPool, plan: Mapping[str, Sequence[Wanted]], *, deadline: timedelta = TRANSFER_DEADLINE,
                  stall: timedelta = STALL_TIMEOUT, on_item: OnItem | None = None,
                  pushes: Mapping[str, Push] | None = None) -> dict[str, list[FetchedSlice | None]]:
    """ONE stream per holder in `plan` (holder -> the objects wanted from it), every holder at once
    (at most MAX_STREAMS in flight), on the pool's event loop; blocks until every stream ended.
    -> holder -> one entry per wanted object, None for what did not come or did not check.
    `on_item(holder, k, item)`: each object as soon as it checked, ON THE LOOP's thread: it must be
    quick and must not block (store it, hand work to a pool). `pushes` (holder -> Push): that
    holder's stream is a SwapSlices trade, sending the Push beside the request (a holder with a
    Push and nothing wanted still gets its stream). Whether a push was kept is the holder's affair:
    one it refused or never got, it fetches itself."""
    pushes = pushes or {}
    plan = {holder: list(plan.get(holder, ())) for holder in {**plan, **pushes} if plan.get(holder) or holder in pushes}
    if not plan:
        return {}

    async def every_stream() -> dict[str, list[FetchedSlice | None]]:
        gate = asyncio.Semaphore(MAX_STREAMS)

        async def one(holder: str) -> list[FetchedSlice | None]:
            async with gate:
                push = pushes.get(holder)
                if push is None or not push.has_tail:
                    return await _stream(pool, holder, plan[holder], deadline, stall, on_item, push)
                # a trade with a tail: back as soon as the request's items are in, the stream going on beside
                items_in = asyncio.get_running_loop().create_future()
                _keep_running(asyncio.ensure_future(_stream(pool, holder, plan[holder], deadline, stall, on_item, push, items_in)))
                return await items_in

        holders = list(plan)
        return dict(zip(holders, await asyncio.gather(*(one(h) for h in holders))))

    try:
        return pool.aio.run(every_stream)
    except PoolClosed as exc:  # shutting down: nothing came (the caller's fallback finds the pool closed too: PoolClosed)
        log.info("batched fetch from %d holders not started: %s", len(plan), exc)
        return {holder: [None] * len(wanted) for holder, wanted in plan.items()}


def _request(wanted: list[Wanted]) -> swarm_pb2.FetchRequest:
    """The FetchRequest for `wanted`: later slices of a root count on the proofs the earlier ones
    bring (proof_levels), and a root is named only where it changes."""
    levels = [0] * len(wanted)
    by_root: dict[int, list[int]] = {}
    for k, w in enumerate(wanted):
        if w.slice is not None and w.proven is not None:
            by_root.setdefault(id(w.proven), []).append(k)
    for ks in by_root.values():
        for k, level in zip(ks, wanted[ks[0]].proven.plan([wanted[k].slice for k in ks])):  # type: ignore[union-attr]
            levels[k] = level
    items, root = [], b""
    for k, w in enumerate(wanted):
        if w.slice is not None and w.proven is not None:
            items.append(swarm_pb2.FetchItem(slice=w.slice, slices_root=b"" if w.proven.root == root else w.proven.root,
                                             proof_levels=levels[k]))
            root = w.proven.root
        else:
            items.append(swarm_pb2.FetchItem(digest=bytes.fromhex(w.sha256)))
    return swarm_pb2.FetchRequest(items=items, packed=True)


_RUNNING: set[asyncio.Task] = set()  # trades' tails going on after fetch_streams returned (a task needs a reference)


def _keep_running(task: asyncio.Task) -> None:
    _RUNNING.add(task)
    task.add_done_callback(_RUNNING.discard)


async def _stream(pool: ChannelPool, holder: str, wanted: list[Wanted], deadline: timedelta, stall: timedelta,
                  on_item: OnItem | None, push: Push | None = None,
                  items_in: asyncio.Future | None = None) -> list[FetchedSlice | None]:
    """One batched stream; `items_in` (a trade with a tail) gets the items as soon as they are all
    in, and the stream goes on for the tail (results both ways), each read allowed push.tail_s."""
    results = None
    if push is not None and push.expect:
        results = ResultPieces(push.expect, push.on_result or (lambda j, data: None))
    reader = ItemReader(wanted, None if on_item is None else (lambda k, item: on_item(holder, k, item)), results)
    request = _request(wanted)
    counter = pool.counter
    method = METHOD if push is None else SWAP_METHOD
    if counter is not None:  # a trade's requests are counted as they are serialized (_swap_messages)
        counter.add(holder, sent=request.ByteSize() if push is None else 0, call=True, method=method)
    # who we are, as the sync channels' counting interceptor says it (protocol/accounting.py); a pool
    # without a counter says nothing, as a sync channel without one does
    metadata = () if counter is None else ((PEER_HEADER, counter.local_peer or "anonymous"),)
    call = None
    pushing = PushProgress()
    hashing = pool.aio.hashing  # once per stream: PoolClosed here when the pool closed meanwhile
    try:
        if push is None:
            call = pool.aio.raw_fetch(holder)(request, timeout=deadline.total_seconds(), metadata=metadata)
        else:
            call = pool.aio.raw_swap(holder)(_swap_messages(push, request, counter, holder, pushing), timeout=deadline.total_seconds(),
                                             metadata=metadata)
        while True:
            if items_in is not None and not items_in.done() and reader.settled():  # the rest is the tail
                await _check(reader, hashing)  # the last item, finished by settled()
                items_in.set_result(list(reader.out))
            tail = items_in is not None and items_in.done()
            try:
                data = await asyncio.wait_for(call.read(), push.tail_s if tail else stall.total_seconds())
            except asyncio.TimeoutError:
                if pushing.moved_within(stall.total_seconds()):
                    continue  # the holder answered and is still taking our push (a slow uplink): alive
                if tail:
                    raise TransferError("its results did not come in time: the gather fetches them") from None
                STALLS.mark(holder, stall.total_seconds())
                raise TransferError(f"sent nothing for {stall.total_seconds():g} s: cut off (its link or process is down)") from None
            if data is grpc.aio.EOF:
                break
            if counter is not None:  # the bytes as they came (a message's ByteSize() would serialize it again)
                counter.add(holder, received=len(data), method=method)
            try:
                message = swarm_pb2.Chunk.FromString(data)
            except DecodeError:
                raise TransferError(f"a message of {len(data)} bytes that is not a Chunk") from None
            reader.message(message)
            await _check(reader, hashing)
        reader.close()
    except Exception as exc:  # noqa: BLE001 - a broken or lying stream: keep what checked, the caller refetches the rest
        if call is not None:
            call.cancel()
        reader.close()  # an item whose bytes all came before the fault still checks on its own
        log.info("batched fetch of %d objects from %s stopped: %s", len(wanted), holder,
                 exc.details() if isinstance(exc, grpc.aio.AioRpcError) else exc)
    await _check(reader, hashing)
    if items_in is not None and not items_in.done():
        items_in.set_result(list(reader.out))
    if push is not None and push.on_end is not None:
        try:
            push.on_end()
        except Exception:  # noqa: BLE001 - the caller's fault, not the holder's
            log.exception("ending a trade's tail failed")
    return reader.out


class PushProgress:
    """When a stream's push last moved: gRPC takes the next message once the last one is written
    (flow control passed it on), so a push that keeps being taken is a live holder even while it
    sends nothing back (a trade's answer may be long done while our upload goes on)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.last: float | None = None  # None: no push, or not started
        self.done = False

    def moved(self) -> None:
        self.last = self.clock()

    def moved_within(self, seconds: float) -> bool:
        """True while a push is under way and its last message was taken less than `seconds` ago."""
        return self.last is not None and not self.done and self.clock() - self.last < seconds


async def _swap_messages(push: Push, request: swarm_pb2.FetchRequest, counter: ByteCounter | None, holder: str,
                         progress: PushProgress):
    """A SwapSlices stream's requests, serialized and counted here (gRPC takes each as it sends)."""
    def counted(message: swarm_pb2.SlicePush) -> bytes:
        data = message.SerializeToString()
        if counter is not None:
            counter.add(holder, sent=len(data), method=SWAP_METHOD)
        return data

    # with a tail, the last message says our slices end there: our results follow once reduced
    for message in push_slices(push.signed_header, push.slices, want=request, takes_results=bool(push.expect),
                               inputs_done=push.results is not None, ticket=push.ticket):
        progress.moved()
        yield counted(message)
    progress.done = True  # the last message is written or being written: the holder's answer ends the stream
    if push.results is not None:
        async for ready in push.results():
            for packed in pack_chunks(result_chunks(ready)):
                yield counted(swarm_pb2.SlicePush(results=packed.parts))


async def _check(reader: "ItemReader", hashing: concurrent.futures.Executor) -> None:
    """Check the items whose bytes are all in. A large item's sha256 runs on the pool's `hashing`
    threads (hashlib releases the GIL: several streams' large items hash in parallel, as they did
    on a thread each); the proof and the hand-over stay on the loop."""
    while reader.complete:
        k, first, data = reader.complete.pop(0)
        if len(data) >= HASH_OFF_LOOP_BYTES:
            digest = await asyncio.get_running_loop().run_in_executor(hashing, _sha256, data)
        else:
            digest = _sha256(data)
        reader.verify(k, first, data, digest)


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


class ItemReader:
    """The items of one batched stream, message by message: each checked once its bytes are in."""

    def __init__(self, wanted: list[Wanted], on_item: Callable[[int, FetchedSlice], None] | None,
                 results: ResultPieces | None = None) -> None:
        self.wanted, self.on_item = wanted, on_item
        self.results = results  # a trade's tail: the holder's aggregated slices for us, after the items
        self.items_over = False  # every item is answered (settled), or a result piece came: no item may follow
        self.out: list[FetchedSlice | None] = [None] * len(wanted)
        # An item that came whole in one chunk (every slice under CHUNK_BYTES) is its chunk's bytes
        # as they are; a bytearray gathers only an item split over several chunks.
        self.current, self.first, self.buffer = -1, None, b""
        self.complete: list[tuple[int, swarm_pb2.Chunk, bytes]] = []  # items whose bytes are in, to check (_check)
        self.closed = False

    def message(self, message: swarm_pb2.Chunk) -> None:
        """One message of the stream; TransferError when it breaks the stream's rules."""
        if not message.parts:  # a holder that packs nothing sends each chunk alone
            self._take(message)
            return
        if message.item or message.data or message.missing or message.total_size or message.HasField("result"):
            raise TransferError("a packed message carries a chunk of its own besides its parts")
        for part in message.parts:  # several chunks, in stream order
            if part.parts:
                raise TransferError("a packed part packs parts of its own")
            self._take(part)

    def settled(self) -> bool:
        """Every wanted item answered (its bytes in, or marked missing): the rest of the stream can
        only be a trade's tail. Ends the items once the last one's bytes are in (the caller then
        checks it: _check)."""
        if not self.items_over and (not self.wanted or self.current == len(self.wanted) - 1 and self.first is not None and (
                self.first.missing or len(self.buffer) == self.first.total_size)):
            self._end_items()
        return self.items_over

    def _end_items(self) -> None:
        self._finish()
        self.first, self.buffer, self.items_over = None, b"", True

    def close(self) -> None:
        """The stream ended (or broke): the item in progress checks if its bytes are all in."""
        if not self.closed:
            self.closed = True
            self._finish()

    def _take(self, chunk: swarm_pb2.Chunk) -> None:
        if chunk.HasField("result"):  # a trade's tail: the holder's aggregated slice for us
            if self.results is None:
                raise TransferError(f"a result piece (slice {chunk.result}) where none is expected")
            if not self.items_over:
                self._end_items()
            try:
                self.results.take(chunk)
            except RpcAbort as exc:
                raise TransferError(exc.message) from None
            return
        if self.items_over:
            raise TransferError(f"item {chunk.item} after the items ended")
        if chunk.item != self.current:
            if not self.current < chunk.item < len(self.wanted):
                raise TransferError(f"item {chunk.item} out of order (after {self.current} of {len(self.wanted)})")
            self._finish()
            self.current, self.first, self.buffer = chunk.item, chunk, b""
            if chunk.missing:
                return
            if not 0 <= chunk.total_size <= self.wanted[self.current].max_size:
                raise TransferError(f"item {self.current}: {chunk.total_size} bytes declared, "
                                    f"at most {self.wanted[self.current].max_size}")
        elif self.first is None or self.first.missing or chunk.total_size != self.first.total_size:
            raise TransferError(f"item {self.current} changed its declared size midway")
        data = chunk.data  # read once: each read of a bytes field makes a new copy
        if chunk.offset != len(self.buffer) or len(self.buffer) + len(data) > self.first.total_size:
            raise TransferError(f"item {self.current}: chunk at offset {chunk.offset} of {self.first.total_size}, "
                                f"expected {len(self.buffer)}")
        if not self.buffer:
            self.buffer = data
        else:
            self.buffer = self.buffer if isinstance(self.buffer, bytearray) else bytearray(self.buffer)
            self.buffer.extend(data)

    def _finish(self) -> None:
        k, first, buffer = self.current, self.first, self.buffer
        if k < 0 or self.out[k] is not None or first is None or first.missing or len(buffer) != first.total_size:
            return
        self.complete.append((k, first, buffer if isinstance(buffer, bytes) else bytes(buffer)))

    def verify(self, k: int, first: swarm_pb2.Chunk, data: bytes, digest: bytes) -> None:
        """Item k's bytes, whose sha256 is `digest`: kept (and handed to on_item) if they check."""
        w = self.wanted[k]
        if w.slice is not None and w.proven is not None:
            if w.proven.accept(digest, w.slice, list(first.proof)):
                self.out[k] = FetchedSlice(data=data, digest=digest.hex(), proof=tuple(w.proven.proof_of(w.slice) or ()))
        elif digest.hex() == w.sha256:
            self.out[k] = FetchedSlice(data=data, digest=w.sha256, proof=())
        if self.on_item is not None and self.out[k] is not None:
            try:
                self.on_item(k, self.out[k])
            except Exception:  # noqa: BLE001 - the caller's fault, not the holder's: the stream goes on
                log.exception("handling item %d of a batched fetch failed", k)
