"""A grpc.aio server on its own event-loop thread, behind the sync server's interface.

The coordinator parks peers' long-polls (GetManifest, GetSliceResults) until there is news. On a
sync gRPC server each parked call holds a worker thread, so the number of peers that may wait
was the number of threads set aside for it (8), and the rest were answered at once and came back
0.5 s later. On this server a handler written as `async def` waits as a coroutine on the loop,
holding no thread: 1,000 waiting peers are 1,000 small objects. Every other handler stays a plain
function and runs on the server's bounded thread pool (grpc.aio's migration pool), unchanged; the
same pool is the loop's default executor, so an async handler's blocking step
(`loop.run_in_executor(None, ...)`) borrows a pool thread for that step only.

`AsyncServer` offers what callers of a sync `grpc.Server` use here (the generated
`add_*Servicer_to_server`, start, stop(grace) -> Event, wait_for_termination), so the CLI, the
tests and the benches start and stop it as before. It is made by
`protocol.channels.create_async_server`, which owns the options, TLS and byte accounting.

"""

from __future__ import annotations

import asyncio
import threading
from concurrent import futures
from typing import Any, Callable

import grpc


class AsyncServer:
    """A grpc.aio server whose loop runs on a daemon thread started here. `build(loop)` runs on
    that loop and returns the aio server (bound, with interceptors; services are added later)."""

    def __init__(self, build: Callable[[], grpc.aio.Server], pool: futures.ThreadPoolExecutor) -> None:
        self._pool = pool
        self._loop = asyncio.new_event_loop()
        self._loop.set_default_executor(pool)
        self._stopped = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="swarmloco-rpc-loop", daemon=True)
        self._thread.start()
        try:
            self._server: grpc.aio.Server = self._call(self._async(build))
        except BaseException:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5.0)
            raise

    def _run(self) -> None:
        try:
            run_loop(self._loop)
        finally:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._stopped.set()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop this server runs on, for a channel pool of the same process to share
        (protocol/aio_channels.py, AioChannels.share_loop); closed once the server stopped."""
        return self._loop

    @staticmethod
    async def _async(fn: Callable[[], Any]) -> Any:
        return fn()

    def _call(self, coroutine: Any, timeout: float | None = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    # what the generated add_*Servicer_to_server call
    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self._server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(self, service_name: str, method_handlers: Any) -> None:
        self._server.add_registered_method_handlers(service_name, method_handlers)

    def start(self) -> None:
        self._call(self._server.start())

    def stop(self, grace: float | None) -> threading.Event:
        """Stop serving: calls in flight get `grace` seconds (None: cancelled at once, like 0), then
        are cancelled; parked long-polls end with CANCELLED. The returned Event is set once the
        server has stopped and its loop and thread are gone (`.wait(timeout)` as with grpc.Server)."""
        if self._stopping:
            return self._stopped
        self._stopping = True

        async def stop() -> None:
            try:
                await self._server.stop(grace)  # a handler's task still winding down is ended by run_loop
            finally:
                self._loop.stop()  # after this coroutine: _run closes the loop and sets the Event

        asyncio.run_coroutine_threadsafe(stop(), self._loop)
        return self._stopped

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        """True when the server stopped within `timeout` (None: wait for it)."""
        return not self._stopped.wait(timeout)


def run_loop(loop: asyncio.AbstractEventLoop) -> None:
    """A loop thread's life: run until stopped, then end what is left on it (its tasks, and work
    handed to it after the stop, such as a sharing pool's fetch) so that nothing is destroyed
    pending and no caller waits on it, then close it."""
    try:
        loop.run_forever()
    finally:
        try:
            loop.run_until_complete(end_other_tasks())
        except Exception:  # noqa: BLE001 - stopping is best effort; the loop closes either way
            pass
        loop.close()


async def end_other_tasks(timeout_s: float = 1.0) -> None:
    """Cancel every other task of the running loop and wait (up to timeout_s) for them to end:
    what a loop about to stop still runs ends here instead of being destroyed pending."""
    rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in rest:
        task.cancel()
    if rest:
        await asyncio.wait(rest, timeout=timeout_s)
