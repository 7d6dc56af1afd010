"""The coordinator's Prometheus metrics, built from its status view at scrape time.

Names follow Prometheus conventions: `_total` counters, `_seconds` and `_bytes` units, `_ratio`
for 0..1 shares. Per-peer series carry `peer` (the first 16 hex digits of the peer id); reasons
are reduced to short label values (peer/run/metrics_server.label_slug) so the label sets stay bounded.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily

from peer.run.metrics_server import PREFIX, label_slug

if TYPE_CHECKING:
    from peer.coordinator.run_log import RunWatcher

PEER_STATES = ("joined", "restored", "training", "committing", "waiting", "syncing", "finished", "stopped", "starting", "gone", "banned")


def close_reason_label(why: str) -> str:
    """'deadline 30s passed; missing 1 peer(s)' -> 'deadline'; the few reasons the round clock gives, named."""
    text = why.lower()
    for needle, label in (("every expected peer committed", "all_committed"), ("every live peer gathered", "all_gathered"),
                          ("did not gather", "gather_timeout"), ("deadline", "deadline")):
        if needle in text:
            return label
    return label_slug(text.split(";")[0])


def ban_reason_label(peer: dict[str, Any]) -> str:
    """The evidence's kind when there is one ('equivocation', 'false-slice-result'), else the reason's first words."""
    for evidence in reversed(peer.get("evidence") or []):
        if isinstance(evidence, dict) and isinstance(evidence.get("kind"), str):
            return label_slug(evidence["kind"])
    return label_slug(peer.get("banned_reason", "").split(" in round")[0])


def short(peer_id: str) -> str:
    return peer_id[:16]


class CoordinatorCollector:
    """A prometheus_client collector over a Coordinator (and the run watcher's per-round bytes)."""

    def __init__(self, coordinator: Any, watcher: "RunWatcher | None" = None) -> None:
        self.coordinator = coordinator
        self.watcher = watcher

    def collect(self) -> Iterator[Any]:
        s = self.coordinator.status()
        yield from _run_metrics(s)
        yield from _round_metrics(s, self.watcher)
        yield from _peer_metrics(s)


def _gauge(name: str, doc: str, value: float | None = None, labels: list[str] | None = None) -> GaugeMetricFamily:
    if labels is None:
        return GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=value)
    return GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=labels)


def _counter(name: str, doc: str, labels: list[str], counts: dict[str, float]) -> CounterMetricFamily:
    family = CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=labels)
    for key, value in sorted(counts.items()):
        family.add_metric([key], value)
    return family


def _run_metrics(s: dict[str, Any]) -> Iterator[Any]:
    yield _gauge("round", "the round currently open (0-based; rounds closed so far)", s["round"])
    yield _gauge("rounds_planned", "rounds this run does in all", s["rounds"])
    yield _gauge("run_finished", "1 once the run has done all its rounds", float(s["finished"]))
    phase = _gauge("round_phase", "phase of the open round (1 for the current one)", labels=["phase"])
    for name in ("committing", "reducing"):
        phase.add_metric([name], float(s["open_round"]["phase"] == name))
    yield phase
    yield _gauge("round_committed_updates", "commitments received in the open round", len(s["open_round"]["committed"]))
    yield _gauge("round_deadline_seconds", "the adaptive commit deadline", s["deadline_s"])
    yield _gauge("initial_val_loss", "validation loss of the initial parameters", s["initial_val_loss"])
    traffic = s["coordinator_traffic"]
    yield CounterMetricFamily(f"{PREFIX}_coordinator_sent_bytes", "bytes the coordinator sent (serialized gRPC messages)", value=traffic["bytes_sent"])
    yield CounterMetricFamily(f"{PREFIX}_coordinator_received_bytes", "bytes the coordinator received", value=traffic["bytes_received"])
    yield _counter("rejections", "refused requests by reason (every RPC)", ["reason"], _by_label(s["rejections"]))
    yield _gauge("uptime_seconds", "seconds since this coordinator started", s["uptime_s"])


def _by_label(counts: dict[str, int]) -> Counter:
    """Counts keyed by free-text reasons, summed per label value."""
    merged: Counter = Counter()
    for key, value in counts.items():
        merged[label_slug(key)] += value
    return merged


def _round_metrics(s: dict[str, Any], watcher: "RunWatcher | None") -> Iterator[Any]:
    history = s["history"]
    if history:
        last = history[-1]
        yield _gauge("val_loss", "validation loss after the last closed round", last["val_loss"])
        yield _gauge("last_round_updates", "updates that counted in the last closed round", last["updates"])
        yield _gauge("last_round_duration_seconds", "wall time of the last closed round", last["seconds"])
    duration = SummaryMetricFamily(f"{PREFIX}_round_duration_seconds", "wall time of closed rounds",
                                   count_value=len(history), sum_value=sum(h["seconds"] for h in history))
    yield duration
    yield _counter("rounds_closed", "closed rounds by what closed them", ["reason"],
                   Counter(close_reason_label(h["close_reason"]) for h in history))
    yield _counter("exclusions", "updates left out of a round, by reason (over all closed rounds)", ["reason"],
                   Counter(label_slug(reason) for h in history for reason in h["excluded"].values()))
    if watcher is not None:
        last_bytes = watcher.last_round_bytes()
        if last_bytes is not None:
            family = _gauge("last_round_bytes", "bytes of the last closed round, by who and direction", labels=["who", "direction"])
            for who in ("coordinator", "peers"):
                for direction in ("sent", "received"):
                    family.add_metric([who, direction], last_bytes[who][direction])
            yield family


def _peer_metrics(s: dict[str, Any]) -> Iterator[Any]:
    peers = s["peers"]
    states = Counter(p["state"] for p in peers)
    count = _gauge("peers", "peers the coordinator knows, by state", labels=["state"])
    for state in sorted(set(PEER_STATES) | set(states)):
        count.add_metric([state], states.get(state, 0))
    yield count
    yield _counter("bans", "peers banned from the run, by the kind of evidence", ["reason"],
                   Counter(ban_reason_label(p) for p in peers if p["banned_reason"]))
    state = _gauge("peer_state", "1 for each peer's current state", labels=["peer", "state"])
    last_round = _gauge("peer_last_round", "last round whose update counted (-1: none yet)", labels=["peer"])
    sent = CounterMetricFamily(f"{PREFIX}_peer_sent_bytes", "bytes the peer sent, as its heartbeat reports", labels=["peer"])
    received = CounterMetricFamily(f"{PREFIX}_peer_received_bytes", "bytes the peer received, as its heartbeat reports", labels=["peer"])
    round_bytes = _gauge("peer_round_bytes", "the peer's bytes in its last completed round", labels=["peer", "direction"])
    utilization = _gauge("peer_utilization_ratio", "share of the peer's wall time in inner steps", labels=["peer"])
    loss = _gauge("peer_train_loss", "the peer's last inner-step loss", labels=["peer"])
    weight = _gauge("peer_aggregation_weight", "the peer's weight in the last aggregation (sliced: share of slices)", labels=["peer"])
    clip = _gauge("peer_clip_scale", "centered-clip scale applied to the peer's last update", labels=["peer"])
    steps = _gauge("peer_round_inner_steps", "inner steps the peer's last listed update signed", labels=["peer"])
    tokens = _gauge("peer_round_tokens", "tokens the peer's last listed update signed", labels=["peer"])
    share = _gauge("peer_work_share_ratio", "the peer's share of its last round's capped work (its weight)", labels=["peer"])
    for p in peers:
        peer = short(p["peer_id"])
        state.add_metric([peer, p["state"]], 1.0)
        last_round.add_metric([peer], p["last_round"])
        sent.add_metric([peer], p["bytes_sent"])
        received.add_metric([peer], p["bytes_received"])
        last = p.get("last_round_bytes") or {}
        for direction in ("sent", "received"):
            if direction in last:
                round_bytes.add_metric([peer, direction], last[direction])
        if p["utilization"] is not None:
            utilization.add_metric([peer], p["utilization"])
        if p["loss"] is not None:
            loss.add_metric([peer], p["loss"])
        agg = p.get("aggregation") or {}
        if "weight" in agg:
            weight.add_metric([peer], agg["weight"])
        if "clip_scale" in agg:
            clip.add_metric([peer], agg["clip_scale"])
        work = p.get("work") or {}
        if work:
            steps.add_metric([peer], work["inner_steps"])
            tokens.add_metric([peer], work["tokens"])
            share.add_metric([peer], work["weight"])
    yield from (state, last_round, sent, received, round_bytes, utilization, loss, weight, clip, steps, tokens, share)
