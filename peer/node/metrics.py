"""A peer's Prometheus metrics (`swarmloco peer --metrics-port`), built from the node at scrape time.

Reads what the node keeps anyway: its per-round history (train loss, bytes, phase times), its
transport byte counters, its phase and its utilization. Nothing on the training path updates a metric.
"""

from __future__ import annotations

import time

from collections import Counter
from typing import Any, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from peer.node.phase import RoundPhase
from peer.run.metrics_server import PREFIX, label_slug

PHASES = ("compute_s", "encode_s", "wait_s", "fetch_s", "aggregate_s", "exchange_s", "round_s")


class NodeCollector:
    """A prometheus_client collector over a PeerNode."""

    def __init__(self, node: Any) -> None:
        self.node = node

    def collect(self) -> Iterator[Any]:
        node = self.node
        history = list(node.history)  # appended by the round loop; a copy is consistent
        snapshot = node.snapshot  # frozen: one consistent view (peer/node/heartbeat.py NodeSnapshot)
        total = node.counter.total()
        yield g("round", "the round this peer is in (0-based)", snapshot.round)
        yield g("inner_step", "inner steps done by this peer", snapshot.step)
        if snapshot.loss is not None:
            yield g("train_loss", "loss of the last inner step", snapshot.loss)
        yield g("utilization_ratio", "share of wall time in inner steps since the first one", snapshot.utilization(time.monotonic()))
        yield CounterMetricFamily(f"{PREFIX}_sent_bytes", "bytes this peer sent (serialized gRPC messages)", value=total.sent)
        yield CounterMetricFamily(f"{PREFIX}_received_bytes", "bytes this peer received", value=total.received)
        yield CounterMetricFamily(f"{PREFIX}_rounds_completed", "rounds this peer finished", value=len(history))
        yield CounterMetricFamily(f"{PREFIX}_resyncs", "rounds after which this peer had to resynchronise",
                                  value=sum(not h["in_sync"] for h in history))
        phase = GaugeMetricFamily(f"{PREFIX}_phase", "1 for the phase the peer is in", labels=["phase"])
        for p in RoundPhase:
            phase.add_metric([p.value], float(snapshot.state == p.value))
        yield phase
        excluded = CounterMetricFamily(f"{PREFIX}_exclusions", "updates the rounds' manifests left out, by reason", labels=["reason"])
        for reason, count in sorted(Counter(label_slug(str(r)) for h in history for r in (h["excluded"] or {}).values()).items()):
            excluded.add_metric([reason], count)
        yield excluded
        yield from _round_metrics(node, history)



def g(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=value)


def _round_metrics(node: Any, history: list[dict[str, Any]]) -> Iterator[Any]:
    phases_total = CounterMetricFamily(f"{PREFIX}_phase_seconds", "seconds spent per round phase, all rounds", labels=["phase"])
    for name in PHASES:
        phases_total.add_metric([name[:-2]], sum(h.get(name) or 0.0 for h in history))
    yield phases_total
    if not history:
        return
    last = history[-1]
    phases = GaugeMetricFamily(f"{PREFIX}_last_round_phase_seconds", "seconds per phase in the last round", labels=["phase"])
    for name in PHASES:
        phases.add_metric([name[:-2]], last.get(name) or 0.0)
    yield phases
    round_bytes = GaugeMetricFamily(f"{PREFIX}_last_round_bytes", "bytes of the last round", labels=["direction"])
    round_bytes.add_metric(["sent"], last["bytes_sent"])
    round_bytes.add_metric(["received"], last["bytes_received"])
    yield round_bytes
    yield GaugeMetricFamily(f"{PREFIX}_last_round_payload_bytes", "size of this peer's encoded update", value=last["payload_bytes"])
    yield GaugeMetricFamily(f"{PREFIX}_last_round_train_loss", "mean inner loss of the last round", value=last["train_loss"])
    cfg = node.cfg
    steps, compute = cfg.inner.steps, last["compute_s"]
    yield GaugeMetricFamily(f"{PREFIX}_inner_step_seconds", "mean seconds per inner step, last round", value=compute / max(1, steps))
    tokens = steps * cfg.data.batch_size * cfg.model.seq_len
    yield GaugeMetricFamily(f"{PREFIX}_tokens_per_second", "training tokens per second of inner-step time, last round",
                            value=tokens / max(compute, 1e-9))


def serve_node_metrics(node: Any, *, host: str, port: int) -> Any:
    """Start the peer's /metrics endpoint and print where it is; close() the result to stop it."""
    from peer.run.metrics_server import serve_metrics

    server = serve_metrics(NodeCollector(node), host=host, port=port)
    print(f"peer {node.short} | metrics: {server.url}", flush=True)
    return server
