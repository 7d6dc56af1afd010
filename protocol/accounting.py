"""Byte accounting on every RPC: bytes sent and received, per remote peer, per round.

Counts are the serialized protobuf message sizes of every request and response (a server counts
the bytes its (de)serializers make and read; a client the messages' sizes, or the bytes it reads
where it parses them itself: protocol/batched_fetch.py), taken on both sides, so a sender's "sent to B" equals B's "received from A"
exactly. HTTP/2 framing and TLS records (a few percent) are not included; everything the
application puts on the wire is. Callers identify themselves with the `x-swarmloco-peer`
metadata header so a server can attribute what it receives.
"""

from __future__ import annotations

import inspect
import threading
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Iterator

import grpc

PEER_HEADER = "x-swarmloco-peer"


@dataclass(slots=True)
class Traffic:
    sent: int = 0
    received: int = 0
    calls: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"bytes_sent": self.sent, "bytes_received": self.received, "calls": self.calls}


class ByteCounter:
    """Thread-safe counters keyed by (round, remote peer). `round` is set by the round loop."""

    def __init__(self, local_peer: str = "") -> None:
        self.local_peer = local_peer
        self.round = 0
        self._lock = threading.Lock()
        self._traffic: dict[tuple[int, str], Traffic] = defaultdict(Traffic)
        self._methods: dict[tuple[int, str], Traffic] = defaultdict(Traffic)
        self._calls: dict[tuple[str, str], int] = defaultdict(int)  # (rpc method, remote) -> calls, all rounds

    def add(self, remote: str, *, sent: int = 0, received: int = 0, call: bool = False, method: str = "") -> None:
        """Count traffic with `remote` in the current round; `method` (the RPC's short name, for
        the calls this process makes or serves) also tallies it per RPC."""
        with self._lock:
            entries = [self._traffic[(self.round, remote)]]
            if method:
                entries.append(self._methods[(self.round, method)])
            for entry in entries:
                entry.sent += sent
                entry.received += received
                entry.calls += int(call)
            if call and method:
                self._calls[(method, remote)] += 1

    def total(self) -> Traffic:
        with self._lock:
            return Traffic(
                sum(t.sent for t in self._traffic.values()),
                sum(t.received for t in self._traffic.values()),
                sum(t.calls for t in self._traffic.values()),
            )

    def by_peer(self) -> dict[str, Traffic]:
        """Totals over all rounds, per remote peer."""
        with self._lock:
            out: dict[str, Traffic] = defaultdict(Traffic)
            for (_, remote), t in self._traffic.items():
                out[remote].sent += t.sent
                out[remote].received += t.received
                out[remote].calls += t.calls
            return dict(out)

    def snapshot(self) -> dict[str, dict[str, dict[str, int]]]:
        """{round: {remote: {bytes_sent, bytes_received, calls}}} as JSON-friendly dicts."""
        with self._lock:
            out: dict[str, dict[str, dict[str, int]]] = defaultdict(dict)
            for (r, remote), t in sorted(self._traffic.items()):
                out[str(r)][remote] = t.as_dict()
            return dict(out)

    def calls_to(self, method: str) -> dict[str, int]:
        """{remote: calls of `method` made to it (or served to it: "served:X")} over all rounds: how
        many round trips a phase took per counterpart, counted where they happen."""
        with self._lock:
            return {remote: n for (m, remote), n in self._calls.items() if m == method}

    def by_method(self) -> dict[str, dict[str, dict[str, int]]]:
        """{round: {rpc method: {bytes_sent, bytes_received, calls}}}: the same bytes as
        snapshot(), split by the RPC that moved them (where does a round's control go)."""
        with self._lock:
            out: dict[str, dict[str, dict[str, int]]] = defaultdict(dict)
            for (r, method), t in sorted(self._methods.items()):
                out[str(r)][method] = t.as_dict()
            return dict(out)


def _method_name(method: Any) -> str:
    """'/swarmloco.Coordinator/GetManifest' (str or bytes) -> 'GetManifest'."""
    text = method.decode() if isinstance(method, bytes) else str(method or "")
    return text.rsplit("/", 1)[-1]


def _size(message: Any) -> int:
    return message.ByteSize() if hasattr(message, "ByteSize") else 0


class _CountedIterator:
    """Wraps a streamed response (or request) iterator and counts each message."""

    def __init__(self, inner: Any, on_message: Callable[[int], None]) -> None:
        self._inner = inner
        self._on_message = on_message

    def __iter__(self) -> "_CountedIterator":
        return self

    def __next__(self) -> Any:
        message = next(self._inner)
        self._on_message(_size(message))
        return message

    def __getattr__(self, name: str) -> Any:  # cancel(), code(), details(), ... of the call
        return getattr(self._inner, name)


class _CountedOutcome:
    """Wraps a unary response future so the response is counted once when read."""

    def __init__(self, inner: Any, on_message: Callable[[int], None]) -> None:
        self._inner = inner
        self._on_message = on_message
        self._counted = False

    def result(self, timeout: float | None = None) -> Any:
        response = self._inner.result(timeout)
        if not self._counted:
            self._counted = True
            self._on_message(_size(response))
        return response

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _ClientDetails(grpc.ClientCallDetails):
    def __init__(self, base: grpc.ClientCallDetails, metadata: list[tuple[str, str]]) -> None:
        self.method = base.method
        self.timeout = base.timeout
        self.metadata = metadata
        self.credentials = base.credentials
        self.wait_for_ready = getattr(base, "wait_for_ready", None)
        self.compression = getattr(base, "compression", None)


class _ClientCounter(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    def __init__(self, counter: ByteCounter, remote: str) -> None:
        self.counter = counter
        self.remote = remote

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        metadata = list(details.metadata or [])
        metadata.append((PEER_HEADER, self.counter.local_peer or "anonymous"))
        return _ClientDetails(details, metadata)

    def _start(self, details: grpc.ClientCallDetails, request: Any = None) -> tuple[Callable[[int], None], Callable[[int], None]]:
        """Count the call (and a unary request); -> (count sent, count received) for its messages."""
        method = _method_name(details.method)
        self.counter.add(self.remote, sent=_size(request), call=True, method=method)
        return (lambda n: self.counter.add(self.remote, sent=n, method=method),
                lambda n: self.counter.add(self.remote, received=n, method=method))

    def intercept_unary_unary(self, continuation, details, request):
        _, received = self._start(details, request)
        return _CountedOutcome(continuation(self._details(details), request), received)

    def intercept_unary_stream(self, continuation, details, request):
        _, received = self._start(details, request)
        return _CountedIterator(continuation(self._details(details), request), received)

    def intercept_stream_unary(self, continuation, details, request_iterator):
        sent, received = self._start(details)
        requests = _CountedIterator(iter(request_iterator), sent)
        return _CountedOutcome(continuation(self._details(details), requests), received)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        sent, received = self._start(details)
        requests = _CountedIterator(iter(request_iterator), sent)
        return _CountedIterator(continuation(self._details(details), requests), received)


def counting_interceptors(counter: ByteCounter, remote: str) -> list[Any]:
    return [_ClientCounter(counter, remote)]


def _counted_handler(handler: Any, counter: ByteCounter, handler_call_details: Any) -> Any:
    """`handler` with every message it receives and sends counted (a server interceptor's work,
    sync or aio). Each message is counted where gRPC (de)serializes it: the length of the bytes
    gRPC moves, made once (upb's ByteSize() encodes a message to size it: counting with it cost a
    second serialization of every payload chunk, ~0.2 ms per 250 KB message). A unary request
    counts the call as it is read; a request stream counts it when the handler starts. Handlers
    are left as they are otherwise: an `async def` unary one, or an async generator (a response
    stream the loop sends), stays one."""
    if handler is None:
        return None
    remote = "anonymous"
    for key, value in handler_call_details.invocation_metadata or ():
        if key == PEER_HEADER:
            remote = str(value)[:64]
    method = "served:" + _method_name(handler_call_details.method)
    unary_request = handler.unary_unary is not None or handler.unary_stream is not None

    def received(n: int) -> None:
        counter.add(remote, received=n, call=unary_request, method=method)

    def sent(n: int) -> None:
        counter.add(remote, sent=n, method=method)

    deserialize, serialize = _reading(handler.request_deserializer, received), _writing(handler.response_serializer, sent)
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(handler.unary_unary, deserialize, serialize)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(handler.unary_stream, deserialize, serialize)
    behaviour = handler.stream_unary or handler.stream_stream
    if inspect.iscoroutinefunction(behaviour):
        raise TypeError(f"{method}: an async request-stream handler here answers with a stream (an async generator) or is a plain function")

    if inspect.isasyncgenfunction(behaviour):  # both streams on the server's loop (SwapSlices)
        async def called(request_iterator, context):
            counter.add(remote, call=True, method=method)
            async for message in behaviour(request_iterator, context):
                yield message
    else:
        def called(request_iterator, context):
            counter.add(remote, call=True, method=method)
            return behaviour(request_iterator, context)

    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(called, deserialize, serialize)
    return grpc.stream_stream_rpc_method_handler(called, deserialize, serialize)


def _reading(deserialize: Callable[[bytes], Any] | None, count: Callable[[int], None]) -> Callable[[bytes], Any]:
    """`deserialize` that counts the bytes it reads (None: the message stays bytes)."""
    def read(data: bytes) -> Any:
        count(len(data))
        return data if deserialize is None else deserialize(data)

    return read


def _writing(serialize: Callable[[Any], bytes] | None, count: Callable[[int], None]) -> Callable[[Any], bytes]:
    """`serialize` that counts the bytes it makes (None: the message is bytes already)."""
    def write(message: Any) -> bytes:
        data = message if serialize is None else serialize(message)
        count(len(data))
        return data

    return write


class _ServerCounter(grpc.ServerInterceptor):
    def __init__(self, counter: ByteCounter) -> None:
        self.counter = counter

    def intercept_service(self, continuation, handler_call_details):
        return _counted_handler(continuation(handler_call_details), self.counter, handler_call_details)


class _AsyncServerCounter(grpc.aio.ServerInterceptor):
    def __init__(self, counter: ByteCounter) -> None:
        self.counter = counter

    async def intercept_service(self, continuation, handler_call_details):
        return _counted_handler(await continuation(handler_call_details), self.counter, handler_call_details)


def server_counting_interceptor(counter: ByteCounter) -> grpc.ServerInterceptor:
    return _ServerCounter(counter)


def async_server_counting_interceptor(counter: ByteCounter) -> grpc.aio.ServerInterceptor:
    """server_counting_interceptor for a grpc.aio server (protocol/aio_server.py)."""
    return _AsyncServerCounter(counter)
