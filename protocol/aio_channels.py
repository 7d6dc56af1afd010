"""grpc.aio channels on one event-loop thread: the batched fetches of a phase (one stream per
counterpart, every counterpart at once) run as coroutines on it instead of a thread each.

With a thread per stream, each of a phase's streams polled gRPC's completion queue on its own
thread, and the threads took turns at the GIL and the poller (issue 24: at 8 peers x 1M floats on
2 cores, ~1,650 context switches per worker per round, 13% of the CPU in switching). Here one
thread runs every stream of the process; the caller blocks on the whole phase's result.

Created lazily, on the first fetch: after any fork (the DHT's), as gRPC requires. A node that
serves shares its Peer server's loop instead (share_loop): one loop for everything gRPC-async in
the process. Channels are made
by `protocol.channels.create_async_channel` (options and TLS in one place), one per target.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from typing import Any, Awaitable, Callable, TypeVar

import grpc

from protocol._generated import swarm_pb2, swarm_pb2_grpc
from protocol.aio_server import run_loop
from protocol.channels import TlsConfig, create_async_channel

T = TypeVar("T")
HASH_THREADS = 4  # large items hashed at once (hashlib releases the GIL)
FETCH_PAYLOAD = "/swarmloco.v1.Peer/FetchPayload"  # as the generated PeerStub names them
SWAP_SLICES = "/swarmloco.v1.Peer/SwapSlices"
CLOSED_LOOP_CHECK_S = 0.5  # how often a caller waiting on a shared loop checks that the loop still exists


class PoolClosed(ConnectionError):
    """A fetch after the pool was closed (the node is shutting down)."""

    def __init__(self, message: str = "the channel pool is closed: the node is shutting down") -> None:
        super().__init__(message)


class AioChannels:
    def __init__(self, tls: TlsConfig | None = None) -> None:
        self.tls = tls
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, swarm_pb2_grpc.PeerStub] = {}  # building a stub costs ms: one per channel
        self._raw_fetches: dict[str, Any] = {}  # target -> FetchPayload with undecoded responses (raw_fetch)
        self._raw_swaps: dict[str, Any] = {}  # target -> SwapSlices, bytes both ways (raw_swap)
        self._running: set[concurrent.futures.Future] = set()  # what callers of run() wait on
        self._closed = False
        self._borrowed = False  # the loop is another's (share_loop): not ours to stop
        self._hashing: concurrent.futures.ThreadPoolExecutor | None = None

    @property
    def hashing(self) -> concurrent.futures.ThreadPoolExecutor:
        """The threads that hash large fetched items beside the loop (protocol/batched_fetch.py): the
        pool's own, so that on a shared loop they never queue behind the server's handler threads
        (a checkpoint stream holds one for up to its max_stream_s), nor take threads from them."""
        with self._lock:
            if self._closed:
                raise PoolClosed()
            if self._hashing is None:
                self._hashing = concurrent.futures.ThreadPoolExecutor(max_workers=HASH_THREADS, thread_name_prefix="swarmloco-hash")
            return self._hashing

    def share_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run this pool's streams on `loop`, the running loop of this process's own grpc.aio
        server (AsyncServer.loop), instead of on a thread of its own. gRPC hands every completion
        of the process to one of the loops bound to it and passes the others' on with a wake-up
        of their thread: with the server and the fetches on two loops, a served peer's round was
        ~70 such hand-overs (one system call, a GIL switch and a loop pass each, measured at 8
        peers x S = 32), and both threads woke for every event. Once the server has stopped,
        run() says PoolClosed. A no-op once this pool has started a loop of its own."""
        with self._lock:
            if self._loop is None and not self._closed:
                self._loop, self._borrowed = loop, True

    def run(self, work: Callable[[], Awaitable[T]], timeout: float | None = None) -> T:
        """Run the coroutine `work()` on the loop; block the calling thread for its result (or its
        exception). PoolClosed when the pool is closed, before or while it runs. `timeout`:
        TimeoutError after that long (the coroutine is cancelled)."""
        if self._loop is not None and asyncio._get_running_loop() is self._loop:
            raise RuntimeError("AioChannels.run called on its own loop's thread: it would block that loop (and, shared, "
                               "the server on it) forever; await the coroutine there instead")
        with self._lock:  # scheduled under the lock: close() either sees this future or refuses it
            if self._closed:
                raise PoolClosed()
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=run_loop, args=(self._loop,), name="swarmloco-fetch-loop", daemon=True)
                self._thread.start()
            coroutine = work()
            try:
                future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
            except RuntimeError:  # a shared loop whose server stopped (the node is shutting down)
                coroutine.close()
                raise PoolClosed("the gRPC server whose loop this pool shares has stopped: the node is shutting down") from None
            self._running.add(future)
            loop, borrowed = self._loop, self._borrowed
        try:
            return self._result(future, loop, timeout) if borrowed else future.result(timeout)
        except concurrent.futures.CancelledError:  # close() ended it
            raise PoolClosed("the channel pool was closed during the fetch: the node is shutting down") from None
        except PoolClosed:  # its loop is gone: nothing to cancel there, and the work was dropped with it
            coroutine.close()
            raise
        except BaseException:
            future.cancel()
            raise
        finally:
            with self._lock:
                self._running.discard(future)

    @staticmethod
    def _result(future: concurrent.futures.Future, loop: asyncio.AbstractEventLoop, timeout: float | None) -> Any:
        """future.result(timeout) for a coroutine on a shared loop, which its server may stop and
        close at any time: work scheduled just before the close is dropped with the loop and would
        never resolve. Waits in short steps; the loop closed with the work not done: cancelled."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            step = CLOSED_LOOP_CHECK_S if deadline is None else min(CLOSED_LOOP_CHECK_S, max(0.0, deadline - time.monotonic()))
            try:
                return future.result(step)
            except concurrent.futures.TimeoutError:
                if loop.is_closed() and not future.done():  # (not cancelled: that would call into the closed loop)
                    raise PoolClosed("the gRPC server whose loop this pool shares stopped during the fetch: "
                                     "the node is shutting down") from None
                if deadline is not None and time.monotonic() >= deadline:
                    raise

    def peer_stub(self, target: str) -> swarm_pb2_grpc.PeerStub:
        """The Peer service at `target`, over one channel per target (made on first use); call it on the loop."""
        stub = self._stubs.get(target)
        if stub is None:
            stub = self._stubs[target] = swarm_pb2_grpc.PeerStub(self._channel(target))
        return stub

    def _channel(self, target: str) -> grpc.aio.Channel:
        """The one channel to `target` (made on first use); call it on the loop."""
        channel = self._channels.get(target)
        if channel is None:
            channel = self._channels[target] = create_async_channel(target, tls=self.tls)
        return channel

    def raw_fetch(self, target: str) -> Any:
        """FetchPayload at `target` (a grpc.aio unary-stream callable) whose responses come as the
        bytes gRPC received: the caller counts their length and parses them itself, so a chunk is
        not serialized again to be counted (protocol/batched_fetch.py); call it on the loop."""
        call = self._raw_fetches.get(target)
        if call is None:
            call = self._raw_fetches[target] = self._channel(target).unary_stream(
                FETCH_PAYLOAD, request_serializer=swarm_pb2.FetchRequest.SerializeToString, response_deserializer=None)
        return call

    def raw_swap(self, target: str) -> Any:
        """SwapSlices at `target` (a grpc.aio stream-stream callable) taking and giving bytes: the
        caller serializes (and counts) its requests and parses the responses, as for raw_fetch."""
        call = self._raw_swaps.get(target)
        if call is None:
            call = self._raw_swaps[target] = self._channel(target).stream_stream(
                SWAP_SLICES, request_serializer=None, response_deserializer=None)
        return call

    def close(self) -> None:
        """Close every channel (calls in flight end with CANCELLED), end this pool's fetches, and
        stop the loop's thread when the loop is the pool's own (a shared one goes on serving)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            loop, thread, running = self._loop, self._thread, list(self._running)
        if self._hashing is not None:
            self._hashing.shutdown(wait=False, cancel_futures=True)
        if loop is None:
            return
        if not loop.is_closed():  # (closed: each caller finds it so and stops by itself)
            for future in running:
                future.cancel()
        _best_effort(loop, self._close_channels())
        if not self._borrowed and thread is not None:
            loop.call_soon_threadsafe(loop.stop)  # run_loop then ends what is left and closes the loop
            thread.join(5.0)

    async def _close_channels(self) -> None:
        channels, self._channels, self._stubs = list(self._channels.values()), {}, {}
        self._raw_fetches, self._raw_swaps = {}, {}
        await asyncio.gather(*(c.close() for c in channels), return_exceptions=True)


def _best_effort(loop: asyncio.AbstractEventLoop, coroutine: Any, timeout_s: float = 5.0) -> None:
    """Run `coroutine` on `loop` from another thread and wait up to timeout_s; a loop already
    closed (a shared loop whose server stopped first took the channels with it) runs nothing."""
    try:
        done = asyncio.run_coroutine_threadsafe(coroutine, loop)
    except RuntimeError:
        coroutine.close()
        return
    try:
        done.result(timeout_s)
    except Exception:  # noqa: BLE001 - closing is best effort
        pass
