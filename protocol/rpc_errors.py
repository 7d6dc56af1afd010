"""Handler errors as clean gRPC statuses: no request may raise out of a handler.

Handlers `raise RpcAbort(code, message)` for refusals; `guarded` turns those into the status,
counts the reason, rate-limits per caller and per host, bounds how long a stream may hold a
server thread, and turns anything unexpected into INTERNAL with a message while the server keeps
serving. (grpc's own `context.abort` raises a bare Exception, which would be indistinguishable
from a bug, hence this one type.)
"""

from __future__ import annotations

import functools
import heapq
import itertools
import logging
import threading
import time
from typing import Any, Callable, Iterator

import grpc

from protocol.accounting import PEER_HEADER
from protocol.ratelimit import CallerLimits

log = logging.getLogger("swarmloco.rpc")


class RpcAbort(Exception):
    def __init__(self, code: grpc.StatusCode, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason


def caller_of(context: grpc.ServicerContext) -> str:
    """The peer id the caller claims in its metadata (self-declared: see CallerLimits)."""
    for key, value in context.invocation_metadata() or ():
        if key == PEER_HEADER:
            return str(value)[:64]
    return context.peer() or "anonymous"


def host_of(context: grpc.ServicerContext) -> str:
    """The caller's address without its port: 'ipv4:10.0.0.5:41234' -> 'ipv4:10.0.0.5'."""
    peer = context.peer() or "unknown"
    return peer.rsplit(":", 1)[0] if peer.count(":") >= 2 else peer


class StreamWatchdog:
    """Cancels streaming calls that run past their server-side limit.

    A client that sends a push header and then nothing (or never reads a checkpoint stream) would
    otherwise hold a server worker thread for as long as *its own* deadline says, which may be
    forever: slowloris. One daemon thread keeps a heap of (deadline, call) and cancels the late ones.
    """

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._heap: list[tuple[float, int, grpc.ServicerContext, list[bool]]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self.cancelled = 0

    def watch(self, context: grpc.ServicerContext, seconds: float) -> list[bool]:
        token = [False]  # set to [True] when the call ends on its own
        with self._cv:
            heapq.heappush(self._heap, (time.monotonic() + seconds, next(self._seq), context, token))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="swarmloco-stream-watchdog", daemon=True)
                self._thread.start()
            self._cv.notify()
        return token

    def _run(self) -> None:
        with self._cv:
            while True:
                while self._heap and self._heap[0][3][0]:
                    heapq.heappop(self._heap)  # finished calls: drop without waiting for their deadline
                if not self._heap:
                    self._cv.wait()
                    continue
                deadline, _, context, token = self._heap[0]
                remaining = deadline - time.monotonic()
                if remaining > 0:
                    self._cv.wait(min(remaining, 1.0))
                    continue
                heapq.heappop(self._heap)
                if not token[0]:
                    self.cancelled += 1
                    context.cancel()


WATCHDOG = StreamWatchdog()


def guarded(
    limits: Callable[[Any], CallerLimits],
    on_reject: Callable[[Any, str], None],
    *,
    streaming: bool = False,
    cost: float = 1.0,
    max_stream_s: Callable[[Any], float] | None = None,
) -> Callable:
    """Decorator for servicer methods. `limits(self)` and `on_reject(self, reason)` look up the
    servicer's own limits and rejection counter. `streaming=True` for response-streaming methods;
    `max_stream_s(self)` bounds, server-side, how long a (request or response) stream may run."""

    def decorate(method: Callable) -> Callable:
        def fail(self: Any, context: grpc.ServicerContext, exc: Exception) -> None:
            if isinstance(exc, RpcAbort):
                if exc.reason:
                    on_reject(self, exc.reason)
                context.abort(exc.code, exc.message)
            on_reject(self, "internal-error")
            log.exception("handler %s failed", method.__name__)
            context.abort(grpc.StatusCode.INTERNAL, f"{method.__name__} failed: {type(exc).__name__}: {exc}")

        def admit(self: Any, context: grpc.ServicerContext) -> list[bool] | None:
            if not limits(self).allow(caller_of(context), host_of(context), cost):
                on_reject(self, "rate-limited")
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "too many requests from this peer: slow down and retry")
            return WATCHDOG.watch(context, max_stream_s(self)) if max_stream_s is not None else None

        def finish(token: list[bool] | None) -> None:
            if token is not None:
                token[0] = True

        if streaming:

            @functools.wraps(method)
            def stream_wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                token = admit(self, context)
                try:
                    yield from method(self, request, context)
                except Exception as exc:  # noqa: BLE001 - every failure becomes a status
                    fail(self, context, exc)
                finally:
                    finish(token)

            return stream_wrapper

        @functools.wraps(method)
        def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
            token = admit(self, context)
            try:
                return method(self, request, context)
            except Exception as exc:  # noqa: BLE001
                fail(self, context, exc)
            finally:
                finish(token)

        return wrapper

    return decorate
