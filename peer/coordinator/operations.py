"""What an operator watches on a coordinator: Prometheus metrics, the live dashboard, the run log.

`start_operations` is the coordinator process's one hook: it starts whichever of the three the
options ask for, plus the watcher thread that feeds the dashboard's series and the run log, and
returns a handle whose close() stops them all.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("swarmloco.coordinator")
POLL_S = 0.5


@dataclass(kw_only=True, slots=True)
class OperationsOptions:
    metrics_port: int | None = None  # Prometheus /metrics (0 = a free port)
    metrics_host: str = "127.0.0.1"
    dashboard_port: int | None = None  # the live dashboard (0 = a free port)
    dashboard_host: str = "127.0.0.1"  # loopback unless told otherwise: the page shows endpoints and evidence
    run_log: str | None = None  # JSON lines, one per event

    def __post_init__(self) -> None:
        for name in ("metrics_port", "dashboard_port"):
            port = getattr(self, name)
            if port is not None and not 0 <= port < 65536:
                raise ValueError(f"--{name.replace('_', '-')} {port}: use a port in 0..65535 (0 = any free port)")

    @property
    def enabled(self) -> bool:
        return self.metrics_port is not None or self.dashboard_port is not None or self.run_log is not None


class Operations:
    def __init__(self, coordinator: Any, options: OperationsOptions) -> None:
        from peer.coordinator.run_log import RunWatcher

        self.stop = threading.Event()
        self.watcher = RunWatcher(coordinator.status, options.run_log, term=lambda: int(getattr(coordinator, "term", 0)))
        self.watcher.poll()  # the start line, before anything can close a round
        self.closers: list[Any] = [self.watcher]
        self.thread = threading.Thread(target=self._watch, name="swarmloco-run-log", daemon=True)
        self.thread.start()
        try:
            if options.metrics_port is not None:
                from peer.coordinator.metrics import CoordinatorCollector
                from peer.run.metrics_server import serve_metrics

                metrics = serve_metrics(CoordinatorCollector(coordinator, self.watcher), host=options.metrics_host, port=options.metrics_port)
                self.closers.insert(0, metrics)
                print(f"coordinator metrics: {metrics.url}", flush=True)
            if options.dashboard_port is not None:
                from peer.coordinator.dashboard import DashboardServer, dashboard_payload

                dashboard = DashboardServer(lambda: dashboard_payload(coordinator.status(), self.watcher.snapshot()),
                                            host=options.dashboard_host, port=options.dashboard_port)
                self.closers.insert(0, dashboard)
                print(f"coordinator dashboard: {dashboard.url}", flush=True)
        except BaseException:
            self.close()
            raise

    def _watch(self) -> None:
        while not self.stop.wait(POLL_S):
            try:
                self.watcher.poll()
            except Exception as exc:  # noqa: BLE001 - the log must never take the coordinator down
                log.warning("run log: %s", exc)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        try:
            self.watcher.poll()  # the last round and `finished`
        except Exception as exc:  # noqa: BLE001
            log.warning("run log: %s", exc)
        for closer in self.closers:
            closer.close()


def start_operations(coordinator: Any, options: OperationsOptions | None) -> Operations | None:
    """Metrics, dashboard and run log as `options` asks; None when it asks for none."""
    return Operations(coordinator, options) if options is not None and options.enabled else None
