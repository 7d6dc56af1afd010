"""grpc.aio channels on one event-loop thread: the batched fetches of a phase (one stream per
counterpart, every counterpart at once) run as coroutines on it instead of a thread each.

With a thread per stream, each of a phase's streams polled gRPC's completion queue on its own
thread, and the threads took turns at the GIL and the poller (issue 24: at 8 peers x 1M floats on
2 cores, ~1,650 context switches per worker per round, 13% of the CPU in switching). Here one
thread runs every stream of the process; the caller blocks on the whole phase's result.

Created lazily, on the first fetch: after any fork (the DHT's), as gRPC requires. Channels are made
by `protocol.channels.create_async_channel` (options and TLS in one place), one per target.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Awaitable, Callable, TypeVar

import grpc

from protocol.channels import TlsConfig, create_async_channel

T = TypeVar("T")


class PoolClosed(ConnectionError):
    """A fetch after the pool was closed (the node is shutting down)."""


class AioChannels:
    def __init__(self, tls: TlsConfig | None = None) -> None:
        self.tls = tls
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._closed = False

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._closed:
                raise PoolClosed("the channel pool is closed: the node is shutting down")
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=self._loop.run_forever, name="swarmloco-fetch-loop", daemon=True)
                self._thread.start()
            return self._loop

    def run(self, work: Callable[[], Awaitable[T]], timeout: float | None = None) -> T:
        """Run the coroutine `work()` on the loop; block the calling thread for its result (or its
        exception). `timeout`: TimeoutError after that long (the coroutine is cancelled)."""
        loop = self._started()  # raises when closed, before the coroutine exists
        future = asyncio.run_coroutine_threadsafe(work(), loop)
        try:
            return future.result(timeout)
        except concurrent.futures.CancelledError:  # close() ended it
            raise PoolClosed("the channel pool was closed during the fetch: the node is shutting down") from None
        except BaseException:
            future.cancel()
            raise

    def channel(self, target: str) -> grpc.aio.Channel:
        """The channel to `target` (made on first use); call it on the loop."""
        channel = self._channels.get(target)
        if channel is None:
            channel = self._channels[target] = create_async_channel(target, tls=self.tls)
        return channel

    def close(self) -> None:
        """Close every channel (calls in flight end with CANCELLED) and stop the loop's thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return

        async def shut() -> None:
            channels, self._channels = list(self._channels.values()), {}
            await asyncio.gather(*(c.close() for c in channels), return_exceptions=True)
            # What is still running (a fetch whose streams were just cancelled) ends now, so no
            # caller blocked in run() waits on a loop that stopped.
            pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(shut(), loop).result(5.0)
        except Exception:  # noqa: BLE001 - closing is best effort: the loop stops either way
            pass
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5.0)
        if not thread.is_alive():
            loop.close()

