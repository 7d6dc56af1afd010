"""Handler errors as clean gRPC statuses: no request may raise out of a handler.

Handlers `raise RpcAbort(code, message)` for refusals; `guarded` turns those into the status,
counts the reason, rate-limits per caller, and turns anything unexpected into INTERNAL with a
message while the server keeps serving. (grpc's own `context.abort` raises a bare Exception,
which would be indistinguishable from a bug, hence this one type.)
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Iterator

import grpc

from protocol.accounting import PEER_HEADER
from protocol.ratelimit import RateLimiter

log = logging.getLogger("swarmloco.rpc")


class RpcAbort(Exception):
    def __init__(self, code: grpc.StatusCode, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason


def caller_of(context: grpc.ServicerContext) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == PEER_HEADER:
            return str(value)[:64]
    return context.peer() or "anonymous"


def guarded(
    limiter: Callable[[Any], RateLimiter], on_reject: Callable[[Any, str], None], *, streaming: bool = False, cost: float = 1.0
) -> Callable:
    """Decorator for servicer methods. `limiter(self)` and `on_reject(self, reason)` look up the
    servicer's own limiter and rejection counter. `streaming=True` for response-streaming methods."""

    def decorate(method: Callable) -> Callable:
        def fail(self: Any, context: grpc.ServicerContext, exc: Exception) -> None:
            if isinstance(exc, RpcAbort):
                if exc.reason:
                    on_reject(self, exc.reason)
                context.abort(exc.code, exc.message)
            on_reject(self, "internal-error")
            log.exception("handler %s failed", method.__name__)
            context.abort(grpc.StatusCode.INTERNAL, f"{method.__name__} failed: {type(exc).__name__}: {exc}")

        def admit(self: Any, context: grpc.ServicerContext) -> None:
            if not limiter(self).allow(caller_of(context), cost):
                on_reject(self, "rate-limited")
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "too many requests from this peer: slow down and retry")

        if streaming:

            @functools.wraps(method)
            def stream_wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                admit(self, context)
                try:
                    yield from method(self, request, context)
                except Exception as exc:  # noqa: BLE001 - every failure becomes a status
                    fail(self, context, exc)

            return stream_wrapper

        @functools.wraps(method)
        def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
            admit(self, context)
            try:
                return method(self, request, context)
            except Exception as exc:  # noqa: BLE001
                fail(self, context, exc)

        return wrapper

    return decorate
