"""The coordinator's live dashboard: one static page that polls one JSON endpoint.

  GET /             dashboard.html (plain HTML + JS, no external resources: nothing is fetched
                    from the internet, so it works on an air-gapped cluster)
  GET /api/status   the status view (`swarmloco status --json`) plus the per-round series

Bound to loopback unless told otherwise (--dashboard-host): the page shows peer endpoints and
ban evidence; reach a remote coordinator's page through an SSH tunnel.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any, Callable

MAX_EVIDENCE = 3  # per peer: the page shows the latest few pieces of evidence


def dashboard_html() -> bytes:
    return resources.files("peer.coordinator").joinpath("dashboard.html").read_bytes()


def dashboard_payload(status: dict[str, Any], series: list[dict[str, Any]]) -> dict[str, Any]:
    for p in status["peers"]:
        p["evidence"] = p["evidence"][-MAX_EVIDENCE:]
    return {**status, "series": series}


class DashboardServer:
    def __init__(self, payload: Callable[[], dict[str, Any]], *, host: str, port: int) -> None:
        page = dashboard_html()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                path = self.path.split("?")[0]
                if path in ("/", "/index.html"):
                    self._reply(200, "text/html; charset=utf-8", page)
                elif path == "/api/status":
                    self._reply(200, "application/json", json.dumps(payload()).encode())
                else:
                    self._reply(404, "text/plain", b"not found: try / or /api/status\n")

            def _reply(self, code: int, kind: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:  # a poll a second: keep the console quiet
                pass

        try:
            self.httpd = ThreadingHTTPServer((host, port), Handler)
        except OSError as exc:
            raise OSError(f"cannot serve the dashboard on {host}:{port}: {exc}; pick another --dashboard-port") from None
        self.httpd.daemon_threads = True
        self.url = f"http://{host}:{self.httpd.server_port}/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="swarmloco-dashboard", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)
