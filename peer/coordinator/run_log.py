"""The run log: one JSON line per event the coordinator sees, for plots and post-mortems.

Events: `start` (or `takeover`: this coordinator's term is higher than the log's last writer's,
or another coordinator wrote the log last; a takeover first writes the rounds it inherited, from the
checkpoint it took over from, that the log lacks, marked `inherited`, so the log holds the whole run),
`join`, `gone`, `ban` (with the evidence), `round` (loss, bytes, exclusions, close reason),
`peer_round` (a peer's own bytes and utilization for a round, from its heartbeat), `finished`
(after every round; the peers' `peer_round` of the last round may still follow it, as their
heartbeats arrive after the coordinator recorded that round).
The watcher derives them by comparing the coordinator's status view with the one it saw last,
twice a second, so the round path needs no hook and a missed poll loses nothing (history is a
list, bans and evidence stay). It also keeps the per-round series the dashboard draws.
`scripts/plot_run.py` turns a log into PNGs.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Callable

MAX_SERIES = 5000  # rounds kept in memory for the dashboard


def _events(path: Path):
    if not path.exists():
        return
    with path.open() as f:
        for line in f:
            try:
                yield json.loads(line)
            except ValueError:
                continue  # a line cut short by a crash


def last_writer(path: Path) -> dict[str, Any] | None:
    """The last start/takeover line of an existing log."""
    writer = None
    for event in _events(path):
        if event.get("event") in ("start", "takeover"):
            writer = event
    return writer


def logged_rounds(path: Path | None) -> set[int]:
    """The rounds an existing log already holds."""
    return {e["round"] for e in _events(path) if e.get("event") == "round" and isinstance(e.get("round"), int)} if path else set()


class RunWatcher:
    """Diffs successive status views into events; appends them to `path` when given."""

    def __init__(self, status: Callable[[], dict[str, Any]], path: str | Path | None = None,
                 term: Callable[[], int] = lambda: 0) -> None:
        self.status = status
        self.term = term  # the coordinator's term: bumped by every takeover
        self.path = Path(path) if path else None
        self.lock = threading.Lock()
        self.series: list[dict[str, Any]] = []  # one entry per closed round, for the dashboard
        self._rounds_seen = -1
        self._peers: dict[str, dict[str, Any]] = {}
        self._peer_rounds: dict[str, int] = {}
        self._peer_round_bytes: dict[int, dict[str, int]] = {}
        self._coordinator_bytes = (0, 0)
        self._finished = False
        self._file = None

    def _emit(self, event: str, **fields: Any) -> None:
        record = {"event": event, "time": round(time.time(), 3), **fields}
        if self._file is not None:
            self._file.write(json.dumps(record, sort_keys=True) + "\n")
            self._file.flush()

    def poll(self) -> None:
        s = self.status()
        with self.lock:
            if self._rounds_seen < 0:
                self._start(s)
            self._peers_changed(s)
            self._rounds_closed(s)
            # The clock marks the run finished when it closes the last round; that round enters the
            # history only once persisted (evaluated, checkpointed). "finished" waits for it, so the
            # log never says finished before its last round (a reader stopping there would miss it).
            last_recorded = s["history"][-1]["round"] if s["history"] else -1
            if s["finished"] and not self._finished and last_recorded >= s["round"] - 1:
                self._finished = True
                self._emit("finished", round=s["round"], val_loss=s["history"][-1]["val_loss"] if s["history"] else None)

    def _start(self, s: dict[str, Any]) -> None:
        previous = None
        if self.path is not None:
            previous = last_writer(self.path)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a")
        term = self.term()
        if previous is None:
            took_over = term > 0
        else:
            took_over = previous.get("coordinator_id") != s["coordinator_id"] or term > int(previous.get("term") or 0)
        self._emit("takeover" if took_over else "start", run_id=s["run_id"], coordinator_id=s["coordinator_id"], endpoint=s["endpoint"],
                   round=s["round"], term=term, previous_coordinator_id=(previous or {}).get("coordinator_id"), codec=s["codec"],
                   aggregator=s["aggregator"], outer=s["outer"], initial_val_loss=s["initial_val_loss"])
        # A resumed run's earlier rounds are in the log already: start from now. A takeover's are in
        # the previous coordinator's log, maybe on another machine: the ones this log lacks are
        # written from the history the takeover inherited (no bytes: this coordinator moved none).
        if took_over:
            have = logged_rounds(self.path)
            for h in s["history"]:
                if h["round"] not in have:
                    entry = self._entry(h, 0, 0)
                    self._emit("round", **entry, inherited=True)
                    self.series.append(entry)
        self._rounds_seen = len(s["history"])
        traffic = s["coordinator_traffic"]
        self._coordinator_bytes = (traffic["bytes_sent"], traffic["bytes_received"])

    @staticmethod
    def _entry(h: dict[str, Any], sent: int, received: int) -> dict[str, Any]:
        return {"round": h["round"], "val_loss": h["val_loss"], "updates": h["updates"], "excluded": h["excluded"],
                "seconds": round(h["seconds"], 3), "close_reason": h["close_reason"], "param_hash": h["param_hash"],
                "coordinator_bytes_sent": sent, "coordinator_bytes_received": received}

    def _peers_changed(self, s: dict[str, Any]) -> None:
        for p in s["peers"]:
            peer_id, before = p["peer_id"], self._peers.get(p["peer_id"])
            if before is None or (before["state"] == "gone" and p["state"] not in ("gone", "banned")):
                self._emit("join", peer_id=peer_id, endpoint=p["endpoint"], client_mode=p["client_mode"], round=s["round"])
            elif p["state"] == "gone" and before["state"] != "gone":
                self._emit("gone", peer_id=peer_id, round=s["round"], seconds_since_seen=p["seconds_since_seen"])
            if p["banned_reason"] and not (before or {}).get("banned_reason"):
                self._emit("ban", peer_id=peer_id, reason=p["banned_reason"], evidence=p["evidence"], round=s["round"])
            last = p.get("last_round_bytes") or {}
            if "round" in last and self._peer_rounds.get(peer_id) != last["round"]:
                self._peer_rounds[peer_id] = last["round"]
                totals = self._peer_round_bytes.setdefault(last["round"], {"sent": 0, "received": 0})
                totals["sent"] += last.get("sent", 0)
                totals["received"] += last.get("received", 0)
                self._emit("peer_round", peer_id=peer_id, round=last["round"], bytes_sent=last.get("sent", 0),
                           bytes_received=last.get("received", 0), utilization=p["utilization"], train_loss=p["loss"])
            self._peers[peer_id] = {"state": p["state"], "banned_reason": p["banned_reason"]}

    def _rounds_closed(self, s: dict[str, Any]) -> None:
        new = s["history"][self._rounds_seen:]
        if not new:
            return
        traffic = s["coordinator_traffic"]
        sent, received = traffic["bytes_sent"] - self._coordinator_bytes[0], traffic["bytes_received"] - self._coordinator_bytes[1]
        self._coordinator_bytes = (traffic["bytes_sent"], traffic["bytes_received"])
        for i, h in enumerate(new):
            # Several rounds closed between two polls: their coordinator bytes go to the last one.
            last = i == len(new) - 1
            entry = self._entry(h, sent if last else 0, received if last else 0)
            self._emit("round", **entry, peers={p["peer_id"]: {"bytes_sent": p["bytes_sent"], "bytes_received": p["bytes_received"],
                                                               "state": p["state"]} for p in s["peers"]})
            self.series.append(entry)
        del self.series[:-MAX_SERIES]
        self._rounds_seen = len(s["history"])

    def snapshot(self) -> list[dict[str, Any]]:
        """The per-round series with the peers' own bytes per round (reported after the round closes)."""
        with self.lock:
            return [{**e, "peer_bytes_sent": self._peer_round_bytes.get(e["round"], {}).get("sent", 0),
                     "peer_bytes_received": self._peer_round_bytes.get(e["round"], {}).get("received", 0)} for e in self.series]

    def last_round_bytes(self) -> dict[str, dict[str, int]] | None:
        with self.lock:
            if not self.series:
                return None
            e = self.series[-1]
            peers = self._peer_round_bytes.get(e["round"], {"sent": 0, "received": 0})
            return {"coordinator": {"sent": e["coordinator_bytes_sent"], "received": e["coordinator_bytes_received"]}, "peers": dict(peers)}

    def close(self) -> None:
        with self.lock:
            if self._file is not None:
                self._file.close()
                self._file = None
