"""One Prometheus /metrics endpoint per process (coordinator or peer), read at scrape time.

A collector turns the process's own state (the coordinator's status view, a node's history and
byte counters) into metric families when Prometheus scrapes, so nothing on the round path has to
update a metric, and the numbers always agree with `swarmloco status`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

PREFIX = "swarmloco"


@dataclass(slots=True)
class MetricsServer:
    url: str
    _server: Any
    _thread: Any

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def serve_metrics(collector: Any, *, host: str, port: int) -> MetricsServer:
    """Serve `collector` (a prometheus_client Collector) on http://host:port/metrics (0 = a free port)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise OSError(f"cannot serve metrics on {host}:{port}: {exc}; pick another --metrics-port") from None
    return MetricsServer(url=f"http://{host}:{server.server_port}/metrics", _server=server, _thread=thread)


def label_slug(text: str, fallback: str = "other") -> str:
    """A short, bounded label value from free text (a reason): lower-case words, no numbers."""
    words = [w for w in "".join(ch if ch.isalpha() or ch == "-" else " " for ch in text.lower()).split() if w not in ("s", "ms")]
    return "_".join(words[:4]).replace("-", "_")[:48] or fallback
