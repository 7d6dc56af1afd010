"""What one chaos run leaves (scripts/chaos.py): round closes, peers' reported hashes, leases,
events and leftovers, and how the coordinators' run-log events and Status replies fold into it.
scripts/chaos.py does the reading (files, RPCs); scripts/chaos_report.py judges the result."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RunRecord:
    """What one run left: round closes, peers' reported hashes, events, leftovers."""

    label: str
    rounds: dict[int, dict] = field(default_factory=dict)  # round -> time, param_hash, hashes, val_loss, logged_by
    reports: dict[str, dict] = field(default_factory=dict)  # "peer|round|hash" -> first report
    events: list[dict] = field(default_factory=list)
    peer_ids: dict[str, str] = field(default_factory=dict)
    leases: list[list] = field(default_factory=list)  # [seconds since start, lease_s, endpoint] per status poll
    coordinator_hashes: list[str] = field(default_factory=list)  # every hash a coordinator's status held (θ_0 included)
    takeovers: list[dict] = field(default_factory=list)  # the standby's "took over" lines
    start: dict = field(default_factory=dict)
    finished: dict = field(default_factory=dict)
    final: dict = field(default_factory=dict)

    def add_log_event(self, name: str, event: dict, t0: float) -> bool:
        """One event of coordinator `name`'s run log; True when it is a round's first close."""
        kind = event.get("event")
        if kind in ("start", "takeover") and not self.start:
            self.start = {k: event.get(k) for k in ("initial_val_loss", "term", "coordinator_id")}
        elif kind == "finished":
            self.finished = {"round": event.get("round"), "val_loss": event.get("val_loss"), "by": name}
        elif kind == "round":
            r = event["round"]
            entry = self.rounds.setdefault(r, {"round": r, "time": None, "hashes": [], "logged_by": []})
            if event["param_hash"] not in entry["hashes"]:
                entry["hashes"].append(event["param_hash"])
            entry["logged_by"].append(name + (" (inherited)" if event.get("inherited") else ""))
            entry.setdefault("val_loss", event.get("val_loss"))
            if not event.get("inherited") and (entry["time"] is None or event["time"] - t0 < entry["time"]):
                first = entry["time"] is None
                entry["time"] = round(event["time"] - t0, 3)
                entry["updates"], entry["excluded"] = event.get("updates"), sorted(event.get("excluded", {}))
                return first
        return False

    def add_status(self, status: dict, endpoint: str, now_s: float) -> None:
        """An active coordinator's Status reply, `now_s` seconds into the run: its lease and hash,
        and each peer's reported hash for the round its heartbeat named."""
        lease = status["coordinator"].get("lease", {}).get("lease_s")
        if lease and (not self.leases or self.leases[-1][1:] != [lease, endpoint]):
            self.leases.append([now_s, lease, endpoint])
        if status.get("param_hash") and status["param_hash"] not in self.coordinator_hashes:
            self.coordinator_hashes.append(status["param_hash"])
        names = {v: k for k, v in self.peer_ids.items()}
        for p in status.get("peers", []):
            if p.get("last_round") is None or p.get("last_round") < 0 or not p.get("param_hash"):
                continue
            # The round the hash belongs to (its heartbeat's), not last_round (the last manifest listing the peer).
            at = p.get("param_hash_round", p["last_round"])
            self.reports.setdefault(f"{p['peer_id']}|{at}|{p['param_hash']}",
                                    {"peer": names.get(p["peer_id"], p["peer_id"][:8]), "round": at, "param_hash": p["param_hash"],
                                     "state": p.get("state"), "seen_s": now_s, "via": endpoint})
