"""The `Peer` service: serve update payloads by sha256, accept pushes from client-mode peers
(whole payloads at the coordinator: all-to-all; each slice at its owners: the sliced exchange).

Every node (peers and the coordinator) runs it. Payloads are content-addressed, so a copy held by
any node is as good as the author's: nodes re-serve what they verified (gossip, not a star).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from typing import Callable, Iterable, Iterator

import grpc

from protocol import merkle
from protocol._generated import swarm_pb2, swarm_pb2_grpc
from protocol.accounting import ByteCounter
from protocol.aio_server import AsyncServer
from protocol.channels import CHUNK_BYTES, PART_OVERHEAD, STALL_TIMEOUT, create_async_server
from protocol.envelope import EnvelopeError, UpdateHeader
from protocol.ratelimit import CallerLimits
from protocol.payload_store import PayloadStore, StoredPayload, StoredSlice
from protocol.reasons import Reason
from protocol.result_relay import ResultPieces, result_chunks
from protocol.rpc_errors import RpcAbort, guarded, refusal_for
from protocol.slice_push import PushedSlices
from protocol.swap_ticket import ticket_holds
from protocol.streaming import TransferError, iter_chunks, receive_chunks

MAX_FETCH_STREAMS = 1024  # FetchPayload streams a node serves at once (more: RESOURCE_EXHAUSTED, the fetcher falls back)
MAX_ITEMS = 4096  # objects in one batched fetch (exchange.slices' bound): a request names at most that many
PUSH_ROUND_SLACK = 2  # rounds a pushed header may be away from the node's own (overlapped peers run one ahead)


class PayloadServicer(swarm_pb2_grpc.PeerServicer):
    def __init__(
        self,
        store: PayloadStore,
        *,
        verify_header: Callable[[swarm_pb2.Signed], UpdateHeader],
        accept_pushes: bool = True,
        accept_slice_pushes: bool = False,
        on_reject: Callable[[str], None] | None = None,
        limits: CallerLimits | None = None,
        max_stream_s: float = 120.0,
        max_streams: int = MAX_FETCH_STREAMS,
        current_round: Callable[[], int] | None = None,
        own_peer_id: str = "",
    ) -> None:
        self.store = store
        # who we are: a SwapSlices stream carries results only under a ticket naming us (protocol/swap_ticket.py)
        self.own_peer_id = own_peer_id
        self.verify_header = verify_header
        # the round this node is at: a pushed header more than PUSH_ROUND_SLACK rounds away is refused
        # (its signature only says who signed it; a far-future round would move the store's rounds)
        self.current_round = current_round
        self.accept_pushes = accept_pushes
        self.accept_slice_pushes = accept_slice_pushes  # a serving peer: client-mode authors push it the slices it owns
        self.on_reject = on_reject or (lambda reason: None)
        self.limits = limits or CallerLimits(per_peer_rate=50.0, per_peer_burst=200.0)
        self.max_stream_s = max_stream_s  # server-side bound on one transfer (slowloris)
        # FetchPayload streams in flight at once: each may hold a message of up to CHUNK_BYTES that a
        # client does not read until its deadline frees it, so their memory is bounded here.
        self.max_streams = max_streams
        self.streaming = 0

    @guarded(lambda s: s.limits, lambda s, r: s.on_reject(r), streaming=True, max_stream_s=lambda s: s.max_stream_s)
    async def FetchPayload(self, request: swarm_pb2.FetchRequest, context: grpc.aio.ServicerContext):
        """Served from the server's event loop (every server of the Peer service is a grpc.aio one,
        protocol.channels.create_async_server): the messages are built from held bytes and never
        wait on anything but the client, so a stream holds no thread, and its sends take no hand-off
        between a handler thread and gRPC's (issue 24: the data plane's CPU)."""
        if self.streaming >= self.max_streams:
            raise RpcAbort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{self.streaming} transfers in flight here, at most "
                                                               f"{self.max_streams}: try another holder or retry shortly")
        self.streaming += 1  # on the loop's thread only: no lock
        try:
            for message in self._fetch_messages(request):
                yield message
        finally:
            self.streaming -= 1

    def _fetch_messages(self, request: swarm_pb2.FetchRequest):
        if request.items:
            yield from self._serve_items(request)
            return
        if request.HasField("slice"):  # slice `slice` of the update under `slices_root`, with its proof
            found = self._slice(request.slices_root, request.slice, request.proof_levels)
            if found is None:
                raise RpcAbort(grpc.StatusCode.NOT_FOUND, f"no slice {request.slice} of update root {request.slices_root.hex()[:16]}… "
                                                          "here; try another holder", swarm_pb2.NOT_HELD)
            (data, proof), sha = found, None  # no digest declared: the receiver hashes the bytes
        else:
            address = request.digest.hex() if request.digest else request.sha256
            held = self.store.lookup(address)
            if held is None:
                raise RpcAbort(grpc.StatusCode.NOT_FOUND, f"no payload {address[:16]}… here; try another holder", swarm_pb2.NOT_HELD)
            data, sha, proof = held.payload, None if request.omit_sha256 else address, ()
        if not 0 <= request.offset <= len(data):
            self.on_reject("bad-offset")
            raise RpcAbort(grpc.StatusCode.OUT_OF_RANGE, f"offset {request.offset} outside 0..{len(data)}", swarm_pb2.MALFORMED)
        # no round in the chunks: a fetcher asks for an object it already placed (only checkpoints need one)
        yield from iter_chunks(data, offset=request.offset, sha256=sha, proof=proof)

    def _slice(self, root: bytes, index: int, levels: int) -> tuple[bytes, tuple[bytes, ...]] | None:
        """Slice `index` under `root` and its proof cut below `levels`, or None when not held."""
        item = self.store.get_slice(root, index)
        if item is None:
            return None
        return item.payload, tuple(merkle.truncate(item.proof, index, item.count, levels))

    def _serve_items(self, request: swarm_pb2.FetchRequest):
        """A batched request: every item in its order, each whole (chunks naming it) or marked missing.
        Neither the digest nor the item's size is repeated: the receiver checks the bytes itself.
        `packed`: consecutive chunks travel together, up to CHUNK_BYTES of data per message."""
        if len(request.items) > MAX_ITEMS:
            self.on_reject("malformed")
            raise RpcAbort(grpc.StatusCode.INVALID_ARGUMENT, f"{len(request.items)} items in one fetch; at most {MAX_ITEMS}",
                           swarm_pb2.MALFORMED)
        chunks = self._item_chunks(request.items)
        yield from pack_chunks(chunks) if request.packed else chunks

    def _item_chunks(self, items):
        root = b""
        for k, item in enumerate(items):
            root = item.slices_root or root
            if item.HasField("slice"):
                found = self._slice(root, item.slice, item.proof_levels)
            else:
                held = self.store.lookup(item.digest.hex())
                found = None if held is None else (held.payload, ())
            if found is None:
                yield swarm_pb2.Chunk(item=k, missing=True)
                continue
            for chunk in iter_chunks(found[0], sha256=None, proof=found[1]):
                chunk.item = k
                yield chunk

    @guarded(lambda s: s.limits, lambda s, r: s.on_reject(r), cost=5.0, max_stream_s=lambda s: s.max_stream_s)
    def PushPayload(self, request_iterator, context: grpc.ServicerContext):
        if not self.accept_pushes:
            raise RpcAbort(grpc.StatusCode.FAILED_PRECONDITION, "this node does not relay payloads; push to the coordinator", swarm_pb2.NO_RELAY)
        iterator = iter(request_iterator)
        try:
            first = next(iterator)
        except StopIteration:
            self.on_reject("malformed")
            raise RpcAbort(grpc.StatusCode.INVALID_ARGUMENT, "empty push: the first message must carry the signed header", swarm_pb2.MALFORMED)
        try:
            header = self.verify_header(first.header)
        except EnvelopeError as exc:  # refused as a commitment would be: in the reply, typed
            self.on_reject(exc.reason)
            return swarm_pb2.PushReply(accepted=False, reason=f"{exc.reason}: {exc}", refusal=refusal_for(exc.reason))

        def chunks():
            offset = 0
            message = first
            while True:
                yield swarm_pb2.Chunk(
                    data=message.data, offset=offset, total_size=header.payload_size, sha256=header.payload_sha256
                )
                offset += len(message.data)
                try:
                    message = next(iterator)
                except StopIteration:
                    return

        try:
            payload, _ = receive_chunks(
                chunks(),
                max_size=header.payload_size,
                expected_size=header.payload_size,
                expected_sha256=header.payload_sha256,
            )
            item = StoredPayload(header=header, signed_header=first.header, payload=payload)
            self.store.put(item, verified=True)  # receive_chunks matched the signed size and sha256
        except (TransferError, EnvelopeError) as exc:
            self.on_reject(getattr(exc, "reason", "bad-transfer"))
            raise RpcAbort(grpc.StatusCode.INVALID_ARGUMENT, f"push refused: {exc}", swarm_pb2.INVALID_UPDATE)
        return swarm_pb2.PushReply(accepted=True, sha256=header.payload_sha256)


    @guarded(lambda s: s.limits, lambda s, r: s.on_reject(r), cost=5.0, max_stream_s=lambda s: s.max_stream_s)
    def PushSlices(self, request_iterator, context: grpc.ServicerContext):
        """A client-mode author's slices (we own them this round): each kept when its Merkle proof
        puts its bytes under the signed header's root; at most the header's payload_size in all."""
        if not self.accept_slice_pushes:
            raise RpcAbort(grpc.StatusCode.FAILED_PRECONDITION, "this node takes no slice pushes (client mode)", swarm_pb2.NO_RELAY)
        iterator = iter(request_iterator)
        first = next(iterator, None)
        if first is None or not first.HasField("header"):
            self.on_reject("malformed")
            raise RpcAbort(grpc.StatusCode.INVALID_ARGUMENT, "the first message must carry the signed header", swarm_pb2.MALFORMED)
        try:
            header = self._pushed_header(first.header)
        except EnvelopeError as exc:
            self.on_reject(exc.reason)
            return swarm_pb2.PushReply(accepted=False, reason=f"{exc.reason}: {exc}", refusal=refusal_for(exc.reason))
        pushed = PushedSlices(header)
        try:
            for message in [first, *iterator]:
                pushed.take(message)
        except RpcAbort:
            self.on_reject("malformed")
            raise
        kept, refused = self._keep(pushed)
        if refused:
            return swarm_pb2.PushReply(accepted=False, sha256=header.payload_sha256, refusal=swarm_pb2.INVALID_UPDATE,
                                       reason=f"slices {refused} do not prove under the signed root; {kept} kept")
        return swarm_pb2.PushReply(accepted=True, sha256=header.payload_sha256)

    @guarded(lambda s: s.limits, lambda s, r: s.on_reject(r), streaming=True, cost=5.0, max_stream_s=lambda s: s.max_stream_s)
    async def SwapSlices(self, request_iterator, context: grpc.aio.ServicerContext):
        """Two owners trade (issue 24: one stream a pair in the reduce-scatter, where each fetched
        from the other): the caller's first message carries its signed header and `want`, answered
        as FetchPayload answers it, while its slices that we own come in and are kept as PushSlices
        keeps them (each proven under its signed root), all on the server's loop. Then the stream's
        tail (protocol/result_relay.py): after the caller's `inputs_done`, its aggregated slices we
        gather from it; after our answer, if it `takes_results`, ours it gathers from us."""
        if not self.accept_slice_pushes:
            raise RpcAbort(grpc.StatusCode.FAILED_PRECONDITION, "this node takes no slice pushes (it owns no slices)", swarm_pb2.NO_RELAY)
        if self.streaming >= self.max_streams:
            raise RpcAbort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{self.streaming} transfers in flight here, at most "
                                                               f"{self.max_streams}: fetch instead, or retry shortly")
        self.streaming += 1  # on the loop's thread only, before any await: the bound holds for calls arriving together
        taking: asyncio.Future | None = None
        try:
            incoming = request_iterator.__aiter__()
            try:
                first = await incoming.__anext__()
            except StopAsyncIteration:
                first = None
            if first is None or not first.HasField("header") or not first.HasField("want"):
                self.on_reject("malformed")
                raise RpcAbort(grpc.StatusCode.INVALID_ARGUMENT, "the first message must carry the signed header and the request",
                               swarm_pb2.MALFORMED)
            try:
                header = self._pushed_header(first.header)
            except EnvelopeError as exc:
                self.on_reject(exc.reason)
                raise RpcAbort(grpc.StatusCode.INVALID_ARGUMENT, f"{exc.reason}: {exc}", refusal_for(exc.reason)) from None
            pushed = PushedSlices(header)
            relay, partner = self.store.results, header.peer_id
            # Results ride only the partner's own stream: its ticket names us (a header is public: a stream
            # under a replayed one brings slices that prove themselves, no more), and the first such
            # stream this round takes them (a second is a replay of the ticket).
            own = ticket_holds(first.ticket if first.HasField("ticket") else None, header, self.own_peer_id)
            claimed = own and relay.started(header.round, partner)

            def keep(count_refused: bool = True) -> None:
                """Store what proved; the partner's own push ending stops the waits for the rest (a
                replayer's end does not: the partner's own push may still bring it)."""
                self._keep(pushed, count_refused=count_refused)
                if own:
                    self.store.push_ended(header.root_bytes(), header.round)

            def finish(*, kept: bool, whole: bool) -> None:
                """A take's end, however it ended: what proved is kept even from a broken stream
                (whoever waits for the rest fetches it), and the wait for the partner's results ends."""
                if not kept:
                    keep(count_refused=whole)
                if claimed:
                    relay.ended(header.round, partner)

            async def take() -> None:  # beside the answer: both directions of the link at once
                whole = kept = False
                tail: ResultPieces | None = None
                message: swarm_pb2.SlicePush | None = first
                try:
                    while message is not None:
                        if tail is not None:  # after inputs_done: the caller's results we gather from it
                            if message.parts or message.data or message.inputs_done:
                                raise RpcAbort(grpc.StatusCode.INVALID_ARGUMENT, "slices after inputs_done", swarm_pb2.MALFORMED)
                            for chunk in message.results:
                                tail.take(chunk)
                        else:
                            pushed.take(message)
                            if message.inputs_done:  # its slices end here: keep them now (our reduce may wait on them)
                                kept = True
                                keep()
                                plan = await relay.plan(header.round, STALL_TIMEOUT.total_seconds()) if claimed else None
                                expected = {} if plan is None else plan.receive.get(partner, {})
                                tail = ResultPieces(expected, lambda j, data: self.store.take_result(header.round, partner, j, data))
                        message = await anext(incoming, None)
                    whole = True
                except RpcAbort:
                    self.on_reject("malformed")
                    raise
                finally:
                    finish(kept=kept, whole=whole)

            def finish_unstarted() -> None:
                """The answer failed before take() first ran (a task cancelled then never runs its
                body, finally included): what the first message brought is kept if it proves."""
                with contextlib.suppress(RpcAbort):
                    pushed.take(first)
                finish(kept=False, whole=False)

            taking_body = take()
            taking = asyncio.ensure_future(taking_body)
            for message in self._serve_items(first.want):
                yield message
            if first.takes_results and own:  # then our aggregated slices it gathers from us, once reduced (protocol/result_relay.py)
                async for ready in relay.outgoing(header.round, partner, STALL_TIMEOUT.total_seconds()):
                    for message in pack_chunks(result_chunks(ready)):
                        yield message
            await taking
        finally:
            self.streaming -= 1
            if taking is not None:
                if taking.done() and not taking.cancelled():
                    taking.exception()  # retrieved: a failed push already ended the call (or is moot once the answer failed)
                taking.cancel()
                if inspect.getcoroutinestate(taking_body) == inspect.CORO_CREATED:
                    finish_unstarted()

    def _pushed_header(self, signed: swarm_pb2.Signed) -> UpdateHeader:
        """A pushed update's header, verified, and of a round near ours; EnvelopeError otherwise."""
        header = self.verify_header(signed)
        if self.current_round is not None and abs(header.round - self.current_round()) > PUSH_ROUND_SLACK:
            raise EnvelopeError(Reason.WRONG_ROUND, f"slices of round {header.round} pushed to a node at round "
                                                    f"{self.current_round()}: at most {PUSH_ROUND_SLACK} rounds apart")
        return header

    def _keep(self, pushed: PushedSlices, *, count_refused: bool = True) -> tuple[int, list[int]]:
        """Store the pushed slices whose proofs hold. -> (how many were kept, the refused indices).
        `count_refused`: a refusal is the pusher's fault (False for a broken stream, whose last
        slice may just be cut short)."""
        header = pushed.header
        kept, refused = pushed.proven()
        for index, digest, proof, data in kept:
            self.store.put_slice(header.root_bytes(), index, StoredSlice(header.round, digest, proof, header.num_slices, data))
        if refused and count_refused:
            self.on_reject("bad-proof")
        return len(kept), refused


def serve_payloads(servicer: PayloadServicer, counter: ByteCounter | None, *, host: str, port: int) -> tuple[AsyncServer, int]:
    """The Peer service of a peer (or a test's holder), started on a grpc.aio server whose loop sends
    every FetchPayload stream (the pushes run on its thread pool). -> (server, bound port); OSError
    with advice when the port cannot be bound. The coordinator adds the service to its own server."""
    server, bound = create_async_server(counter, host=host, port=port)
    swarm_pb2_grpc.add_PeerServicer_to_server(servicer, server)
    server.start()
    return server, bound


def pack_chunks(chunks: Iterable[swarm_pb2.Chunk]) -> Iterator[swarm_pb2.Chunk]:
    """Consecutive chunks of a batched stream in as few messages as fit: each message's parts hold
    at most CHUNK_BYTES of data, proofs and framing, so it stays under the channel's message limit
    (MAX_MESSAGE_BYTES) whatever the items' sizes; a chunk is never split across messages (a chunk
    is itself at most CHUNK_BYTES of data). Every part keeps its own item, offset and size."""
    message, used = swarm_pb2.Chunk(), 0
    for chunk in chunks:
        size = len(chunk.data) + sum(len(h) + 2 for h in chunk.proof) + PART_OVERHEAD
        if message.parts and used + size > CHUNK_BYTES:
            yield message
            message, used = swarm_pb2.Chunk(), 0
        message.parts.append(chunk)
        used += size
    if message.parts:
        yield message


def push_chunks(signed_header: swarm_pb2.Signed, payload: bytes):
    """Client side of PushPayload: header in the first message, data in every message."""
    from protocol.channels import CHUNK_BYTES

    first = True
    for start in range(0, max(len(payload), 1), CHUNK_BYTES):
        yield swarm_pb2.PushChunk(header=signed_header if first else None, data=payload[start : start + CHUNK_BYTES])
        first = False
