"""Handler errors as clean gRPC statuses, and typed refusals on both sides of the wire.

Handlers `raise RpcAbort(code, message, refusal)` for RPC-level errors; `guarded` turns those
into the status (the refusal's name in the trailing metadata key `swarmloco-refusal`),
rate-limits per caller and per host, bounds how long a stream may hold a server thread, and
turns anything unexpected into INTERNAL with a message while the server keeps serving. (grpc's
own `context.abort` raises a bare Exception, which would be indistinguishable from a bug, hence
this one type.)

Refusals of well-formed requests travel in the reply's `refusal` field instead. Either way a
client reads them with `refusal_of` (a gRPC error) or `Refused.check` (a reply) and branches on
the `swarm_pb2.Refusal` value, never on the human text.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import inspect
import itertools
import logging
import threading
import time
from datetime import timedelta
from typing import Any, AsyncIterator, Callable, Iterator

import grpc

from protocol._generated import swarm_pb2
from protocol.accounting import PEER_HEADER
from protocol.ratelimit import CallerLimits
from protocol.reasons import Reason

log = logging.getLogger("swarmloco.rpc")
REFUSAL_KEY = "swarmloco-refusal"  # trailing metadata: the swarm_pb2.Refusal name of a refused call
Refusal = int  # a swarm_pb2.Refusal value

# The reasons the servers count (registry rejections, EnvelopeError/SignatureError.reason) -> the
# typed refusal a client sees. A reason not listed is REFUSAL_UNSPECIFIED.
_REFUSAL_OF_REASON: dict[str, Refusal] = {
    Reason.UNKNOWN_PEER: swarm_pb2.UNKNOWN_PEER,
    Reason.WRONG_ENDPOINT: swarm_pb2.WRONG_ENDPOINT,
    Reason.STALE_ROUND: swarm_pb2.STALE_ROUND,
    Reason.WRONG_ROUND: swarm_pb2.STALE_ROUND,
    Reason.WRONG_BASE: swarm_pb2.WRONG_BASE,
    Reason.EQUIVOCATION: swarm_pb2.EQUIVOCATION,
    Reason.BANNED: swarm_pb2.BANNED,
    Reason.RUN_FINISHED: swarm_pb2.RUN_FINISHED,
    Reason.WRONG_RUN: swarm_pb2.WRONG_RUN,
    Reason.STALE_JOIN: swarm_pb2.CLOCK_SKEW,
    Reason.STALE_HEARTBEAT: swarm_pb2.CLOCK_SKEW,
    Reason.NOT_ALLOWED: swarm_pb2.NOT_ALLOWED,
    Reason.BAD_SIGNATURE: swarm_pb2.BAD_SIGNATURE,
    Reason.FORGED: swarm_pb2.BAD_SIGNATURE,
    Reason.BAD_KEY: swarm_pb2.BAD_SIGNATURE,
    Reason.WRONG_TAG: swarm_pb2.BAD_SIGNATURE,
    Reason.WRONG_CODEC: swarm_pb2.INVALID_UPDATE,
    Reason.WRONG_LAYOUT: swarm_pb2.INVALID_UPDATE,
    Reason.SIZE_MISMATCH: swarm_pb2.INVALID_UPDATE,
    Reason.HASH_MISMATCH: swarm_pb2.INVALID_UPDATE,
    Reason.BAD_TRANSFER: swarm_pb2.INVALID_UPDATE,
    Reason.MALFORMED: swarm_pb2.MALFORMED,
    Reason.OVERSIZED: swarm_pb2.MALFORMED,
    Reason.BAD_OFFSET: swarm_pb2.MALFORMED,
    Reason.RATE_LIMITED: swarm_pb2.RATE_LIMITED,
    Reason.ADMISSION_LIMITED: swarm_pb2.RATE_LIMITED,
    Reason.REGISTRY_FULL: swarm_pb2.REGISTRY_FULL,
    Reason.NOT_OWNER: swarm_pb2.NOT_OWNER,
    Reason.BUSY: swarm_pb2.BUSY,
}


def refusal_for(reason: str) -> Refusal:
    """The typed refusal for a counted reason such as 'stale-round' (REFUSAL_UNSPECIFIED if none)."""
    return _REFUSAL_OF_REASON.get(reason, swarm_pb2.REFUSAL_UNSPECIFIED)


class RpcAbort(Exception):
    """Fail the call with `code`; `refusal` travels in the trailing metadata for the client."""

    def __init__(self, code: grpc.StatusCode, message: str, refusal: Refusal = swarm_pb2.REFUSAL_UNSPECIFIED) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.refusal = refusal


def refusal_of(exc: grpc.RpcError) -> Refusal:
    """Client side: the typed refusal a failed call carries (REFUSAL_UNSPECIFIED when none, e.g.
    a transport error or a server that predates refusals)."""
    trailing = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    for key, value in trailing or ():
        if key == REFUSAL_KEY:
            try:
                return swarm_pb2.Refusal.Value(str(value))
            except ValueError:  # a refusal newer than this build
                return swarm_pb2.REFUSAL_UNSPECIFIED
    return swarm_pb2.REFUSAL_UNSPECIFIED


class Refused(Exception):
    """A request the other side refused: `refusal` (a swarm_pb2.Refusal) to branch on, `reason`
    the human text (what happened, what to do)."""

    def __init__(self, refusal: Refusal, reason: str, *, current_round: int | None = None) -> None:
        super().__init__(f"{swarm_pb2.Refusal.Name(refusal) if refusal in swarm_pb2.Refusal.values() else refusal}: {reason}")
        self.refusal = refusal
        self.reason = reason
        self.current_round = current_round

    @property
    def name(self) -> str:
        return swarm_pb2.Refusal.Name(self.refusal)

    @classmethod
    def from_rpc_error(cls, exc: grpc.RpcError) -> "Refused | None":
        """The refusal a gRPC error carries, or None for errors that are not refusals."""
        refusal = refusal_of(exc)
        if refusal == swarm_pb2.REFUSAL_UNSPECIFIED:
            return None
        return cls(refusal, exc.details() if hasattr(exc, "details") else str(exc))

    @classmethod
    def check(cls, reply):  # a JoinReply, CommitReply, PushReply, HeartbeatReply
        """Return `reply` if it was not refused, else raise Refused with its refusal and reason."""
        refused = reply.refusal != swarm_pb2.REFUSAL_UNSPECIFIED or (hasattr(reply, "accepted") and not reply.accepted)
        if refused:
            current = getattr(reply, "current_round", None)
            raise cls(reply.refusal, reply.reason or "refused", current_round=current)
        return reply


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
                    self.note_cut()
                    _cut_off(context)

    def note_cut(self) -> None:
        """Count a stream cut off at its limit (here, or from a grpc.aio loop: _abort_late)."""
        with self._cv:
            self.cancelled += 1


def _cut_off(context: Any) -> None:
    """End a call from another thread: cancel() on a sync server; on a grpc.aio server (whose plain
    handlers' contexts have no cancel(): protocol/aio_server.py) an abort with CANCELLED, which
    sends the status at once and makes the handler's next read of the stream raise."""
    if hasattr(context, "cancel"):
        context.cancel()
        return
    try:
        context.abort(grpc.StatusCode.CANCELLED, "the stream ran past the server's limit: cut off")
    except Exception:  # noqa: BLE001 - abort raises by design (and fails harmlessly on a call already over)
        pass


WATCHDOG = StreamWatchdog()


MAX_STREAM_DEADLINE = timedelta(minutes=10)  # the longest deadline a stream served from a grpc.aio loop may ask for
_ABORTS: set[asyncio.Task] = set()  # the late aborts in flight (a task nobody holds may be collected mid-way)


def _abort_late(context: grpc.aio.ServicerContext) -> None:
    """_cut_off for a stream a grpc.aio loop sends (guarded's async generators): the abort runs as
    a task of its own, since the call's own task may be parked in a send."""

    async def abort() -> None:
        try:
            await context.abort(grpc.StatusCode.CANCELLED, "the stream ran past the server's limit: cut off")
        except (Exception, asyncio.CancelledError):  # noqa: BLE001 - abort raises by design (and fails harmlessly on a call already over)
            pass

    WATCHDOG.note_cut()
    task = asyncio.ensure_future(abort())
    _ABORTS.add(task)
    task.add_done_callback(_ABORTS.discard)


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
        def failure(self: Any, context: grpc.ServicerContext, exc: Exception) -> tuple[grpc.StatusCode, str]:
            """The status to abort with (its refusal set in the trailing metadata)."""
            if isinstance(exc, RpcAbort):
                if exc.refusal != swarm_pb2.REFUSAL_UNSPECIFIED:
                    context.set_trailing_metadata(((REFUSAL_KEY, swarm_pb2.Refusal.Name(exc.refusal)),))
                return exc.code, exc.message
            on_reject(self, "internal-error")
            log.exception("handler %s failed", method.__name__)
            return grpc.StatusCode.INTERNAL, f"{method.__name__} failed: {type(exc).__name__}: {exc}"

        def refused(self: Any, context: grpc.ServicerContext) -> tuple[grpc.StatusCode, str] | None:
            """The status to abort with when the caller is over its rate limit, else None."""
            if limits(self).allow(caller_of(context), host_of(context), cost):
                return None
            on_reject(self, "rate-limited")
            context.set_trailing_metadata(((REFUSAL_KEY, "RATE_LIMITED"),))
            return grpc.StatusCode.RESOURCE_EXHAUSTED, "too many requests from this peer: slow down and retry"

        def admit(self: Any, context: grpc.ServicerContext) -> list[bool] | None:
            if (status := refused(self, context)) is not None:
                context.abort(*status)
            return WATCHDOG.watch(context, max_stream_s(self)) if max_stream_s is not None else None

        def finish(token: list[bool] | None) -> None:
            if token is not None:
                token[0] = True

        if inspect.isasyncgenfunction(method):  # a response stream sent from a grpc.aio loop, holding no thread
            assert streaming, "an async generator handler is a response stream"

            @functools.wraps(method)
            async def async_stream_wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                if (status := refused(self, context)) is not None:
                    await context.abort(*status)
                # The server-side bounds. A client that reads slowly is cut at max_stream_s by an
                # abort from a task of its own. One that stops reading parks the call in flow
                # control, where an abort cannot free it: only the call's deadline does (gRPC
                # cancels it server-side), so a stream must come with one, at most MAX_STREAM_DEADLINE.
                remaining = context.time_remaining()
                if remaining is None or remaining > MAX_STREAM_DEADLINE.total_seconds():
                    on_reject(self, "malformed")
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                        f"a stream needs a deadline of at most {MAX_STREAM_DEADLINE.total_seconds():.0f} s "
                                        "(pass timeout= on the call)")
                cut = None if max_stream_s is None else asyncio.get_running_loop().call_later(
                    max_stream_s(self), _abort_late, context)
                try:
                    async for message in method(self, request, context):
                        yield message
                except Exception as exc:  # noqa: BLE001 - every failure becomes a status
                    await context.abort(*failure(self, context, exc))
                finally:
                    if cut is not None:
                        cut.cancel()

            return async_stream_wrapper

        if inspect.iscoroutinefunction(method):  # a unary handler that waits on a grpc.aio loop (protocol/aio_server.py)
            assert not streaming and max_stream_s is None, "async handlers here are unary and hold no thread to watch"

            @functools.wraps(method)
            async def async_wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
                if (status := refused(self, context)) is not None:
                    await context.abort(*status)
                try:
                    return await method(self, request, context)
                except Exception as exc:  # noqa: BLE001 - every failure becomes a status
                    await context.abort(*failure(self, context, exc))

            return async_wrapper

        if streaming:

            @functools.wraps(method)
            def stream_wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                token = admit(self, context)
                try:
                    yield from method(self, request, context)
                except Exception as exc:  # noqa: BLE001 - every failure becomes a status
                    context.abort(*failure(self, context, exc))
                finally:
                    finish(token)

            return stream_wrapper

        @functools.wraps(method)
        def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
            token = admit(self, context)
            try:
                return method(self, request, context)
            except Exception as exc:  # noqa: BLE001
                context.abort(*failure(self, context, exc))
            finally:
                finish(token)

        return wrapper

    return decorate
