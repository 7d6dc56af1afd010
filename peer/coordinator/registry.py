"""What the coordinator knows about each peer: liveness, progress, traffic, bans and evidence.

One key, one live process. Every Join and heartbeat names the process's session (a nonce it drew
at start, peer/node/local_state.py). A Join with another session while the recorded one still
heartbeats (within rounds.peer_timeout_s) is a second process of the key and is refused
(`session_conflict`), unless it names the recorded session as the one it `succeeds`: that one is
read from the key's lock file, which only the next holder of the key's flock can do, so its
writer is dead (a restart after a crash, admitted at once). A session that went silent past the
window (crashed, or frozen) may be taken over by any Join; once taken over, its heartbeats are
refused with DUPLICATE_SESSION and it stops (a frozen process that wakes up learns it there).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from protocol.reasons import Reason

# What a peer banned for signing two different updates (or result batches) in one round is told.
EQUIVOCATION_ADVICE = ("two processes signed different updates with this key (a second process on this machine, or a copy of "
                       "the key on another machine?): each peer needs its own --identity-path. This key stays banned for the "
                       "run: restart with --identity-path NEW.pem for a new identity")
EQUIVOCATION_KINDS = frozenset({"equivocation", "result-equivocation"})  # evidence kinds (commitments.py, sliced_coordinator.py)


def unreachable_advice(endpoint: str) -> str:
    """What a peer that announces an endpoint nobody can dial is told (at join, and in heartbeats)."""
    return f"nobody can reach {endpoint}: pass --announce-host <public IP>, open the port, or use --client-mode"


@dataclass(slots=True)
class PeerRecord:
    peer_id: str
    public_key: bytes
    endpoint: str
    client_mode: bool
    version: str
    joined_round: int
    last_seen: float = field(default_factory=time.monotonic)
    last_round: int = -1  # last round whose update made it into a manifest
    param_hash: str = ""  # of θ_hash_round, as its last heartbeat reported it
    hash_round: int = -1  # the round whose open state that hash is (not last_round: a heartbeat lags the manifests)
    state: str = "joined"
    step: int = 0
    loss: float | None = None
    bytes_sent: int = 0  # as reported by the peer's own transport counters
    bytes_received: int = 0
    round_bytes: dict[str, int] = field(default_factory=dict)  # last completed round: sent/received
    utilization: float | None = None
    excluded_reason: str = ""
    banned_reason: str = ""
    evidence: list[dict[str, Any]] = field(default_factory=list)
    aggregation: dict[str, float] = field(default_factory=dict)  # last round: weight, distance, clip
    work: dict[str, Any] = field(default_factory=dict)  # last listed round: inner_steps, tokens, weight, capped_by
    left_out: list[int] = field(default_factory=list)  # rounds whose manifest left the peer's valid commitment out without a reason (peer's word)
    session: str = ""  # the live process's session (its Join and heartbeats name it); "" when unknown (restored, older peer)
    dialed: str = ""  # the endpoint a Join's dial-back reached (a rejoin with it is not dialled again)
    unreachable: str = ""  # while set: the last round could not fetch its update from its endpoint (heartbeat replies say it)
    commit_from_round: int = 0  # a session that took over from one that already committed in the open round commits from the next

    def exclude(self, round_: int, reason: str, message: str) -> None:
        """Its update was left out of round_ (shown in status); unreachable: the peer is told what to do."""
        self.excluded_reason = f"round {round_}: {message}"
        if reason == Reason.UNREACHABLE and self.endpoint:
            self.unreachable = f"{unreachable_advice(self.endpoint)} (round {round_}: the coordinator could not fetch this peer's update there)"

    def ban_message(self) -> str:
        """The ban as the banned peer reads it: why, and (equivocation) what probably happened and what to do."""
        if any(e.get("kind") in EQUIVOCATION_KINDS for e in self.evidence if isinstance(e, dict)):
            return f"{self.banned_reason}: {EQUIVOCATION_ADVICE}"
        return self.banned_reason

    def duplicate_message(self, now: float, timeout_s: float) -> str:
        """Why a Join from a second live process of this key is refused, and what to do."""
        age = max(0.0, now - self.last_seen)
        return (f"another process with this identity is live in this run: it joined from {self.endpoint or 'client mode'} and was "
                f"last heard {age:.0f} s ago. Two processes with one key sign different updates and get the key banned for "
                f"equivocation. Stop the other process (if it crashed, this join succeeds once it has been silent for "
                f"{max(0.0, timeout_s - age):.0f} s more), or pass --identity-path NEW.pem to run a second peer with its own key")

    def superseded_message(self) -> str:
        """What a process of this key whose session another one took over is told (it stops)."""
        return (f"another process with this identity took this peer's place in the run (it joined from "
                f"{self.endpoint or 'client mode'}): this one stops. Two processes with one key sign different updates and get the "
                "key banned for equivocation: give each peer its own --identity-path")

    def as_status(self, now: float) -> dict[str, Any]:
        return {
            "peer_id": self.peer_id,
            "endpoint": self.endpoint,
            "client_mode": self.client_mode,
            "last_round": self.last_round,
            "param_hash": self.param_hash,
            "param_hash_round": self.hash_round,
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
            "last_round_bytes": self.round_bytes,
            "utilization": self.utilization,
            "state": "banned" if self.banned_reason else self.state,
            "step": self.step,
            "loss": self.loss,
            "seconds_since_seen": round(max(0.0, now - self.last_seen), 1),
            "excluded_reason": self.excluded_reason,
            "banned_reason": self.banned_reason,
            "evidence": self.evidence,
            "aggregation": self.aggregation,
            "work": self.work,
            "left_out_without_reason": self.left_out,
        }


class RegistryFull(RuntimeError):
    pass


# What a coordinator checkpoint keeps of each peer (the rest is live state, rebuilt by heartbeats).
_PERSISTED = ("peer_id", "endpoint", "client_mode", "version", "last_round", "banned_reason", "evidence")
MAX_PEERS = 1000  # bounds memory and the size of a `status` reply under a flood of fresh identities


class PeerRegistry:
    def __init__(self, peer_timeout_s: float, max_peers: int = MAX_PEERS) -> None:
        self.peer_timeout_s = peer_timeout_s
        self.max_peers = max_peers
        self.lock = threading.RLock()
        self.peers: dict[str, PeerRecord] = {}
        self.rejections: Counter[str] = Counter()  # reason -> count, over all RPCs

    def reject(self, reason: str) -> None:
        with self.lock:
            self.rejections[str(reason)] += 1  # a Reason counts under its text

    def record_aggregation(self, round_: int, verified: list[str], report: Any) -> None:
        """All-to-all: each verified author's weight, selection, distance and clip in round_ (report:
        the rule's AggregationReport, rows in `verified` order; None: the rounds only)."""
        for i, peer_id in enumerate(verified):
            record = self.get(peer_id)
            if record is None:
                continue
            record.last_round, record.excluded_reason, record.unreachable = round_, "", ""
            if report is None:
                continue
            record.aggregation = {
                "round": round_,
                "weight": float(report.weights[i]),
                "selected": bool(report.selected[i]),
                "distance_to_aggregate": float(report.distance_to_aggregate[i]),
                "clip_scale": float(report.clip_scale[i]),
            }

    def record_work(self, round_: int, work: dict[str, dict[str, Any]]) -> None:
        """Each listed author's signed work and its weight in round_ (peer/coordinator/work_ledger.py)."""
        for peer_id, entry in work.items():
            record = self.get(peer_id)
            if record is not None:
                record.work = {"round": round_, **entry}

    def record_slices(self, round_: int, verified: list[str], excluded: dict[int, dict[str, str]], slices: int) -> None:
        """Sliced: a peer's share is the slices its update took part in (an owner leaves an input
        out of a slice that is undecodable, non-finite or unreachable, with the reason)."""
        for peer_id in verified:
            record = self.get(peer_id)
            if record is None:
                continue
            record.last_round, record.excluded_reason = round_, ""
            reasons = [per_slice[peer_id] for per_slice in excluded.values() if peer_id in per_slice]
            for reason in set(reasons):
                self.reject(reason)  # once per peer and round, as the all-to-all exchange counts it
            record.aggregation = {"round": round_, "weight": (slices - len(reasons)) / slices, "slices": slices,
                                  "slices_excluded": {reason: reasons.count(reason) for reason in set(reasons)}}
            if reasons:
                record.excluded_reason = f"round {round_}: left out of {len(reasons)} of {slices} slices ({', '.join(sorted(set(reasons)))})"
            unreachable = reasons.count(Reason.UNREACHABLE)
            # One owner's bad link is its own problem; half the owners failing to fetch it is this peer's.
            record.unreachable = (f"{unreachable_advice(record.endpoint)} (round {round_}: the owners of {unreachable} of {slices} "
                                  "slices could not fetch this peer's update there)") if record.endpoint and 2 * unreachable >= slices else ""

    def records(self) -> list[PeerRecord]:
        with self.lock:
            return list(self.peers.values())

    def get(self, peer_id: str) -> PeerRecord | None:
        with self.lock:
            return self.peers.get(peer_id)

    def upsert(self, record: PeerRecord) -> PeerRecord:
        with self.lock:
            existing = self.peers.get(record.peer_id)
            if existing is None:
                if len(self.peers) >= self.max_peers:
                    self._evict_one()
                self.peers[record.peer_id] = record
                return record
            # A rejoin (restart, new port) keeps the history, bans and evidence.
            if record.endpoint != existing.endpoint:
                existing.unreachable = ""  # said of the old endpoint
            existing.endpoint = record.endpoint
            existing.session = record.session or existing.session
            existing.dialed = record.dialed or existing.dialed
            existing.client_mode = record.client_mode
            existing.version = record.version
            existing.joined_round = record.joined_round
            existing.last_seen = time.monotonic()
            existing.state = "joined"
            return existing

    def _evict_one(self) -> None:
        """Forget the longest-silent peer that is gone, never contributed and is not banned."""
        now = time.monotonic()
        candidates = [
            p for p in self.peers.values()
            if not p.banned_reason and p.last_round < 0 and now - p.last_seen >= self.peer_timeout_s
        ]
        if not candidates:
            raise RegistryFull(f"the run already tracks {self.max_peers} peers; retry later")
        del self.peers[min(candidates, key=lambda p: p.last_seen).peer_id]

    def to_dicts(self) -> list[dict[str, Any]]:
        with self.lock:
            return [
                {**{k: getattr(p, k) for k in _PERSISTED}, "public_key": p.public_key.hex()}
                for p in sorted(self.peers.values(), key=lambda p: p.peer_id)
            ]

    def restore(self, records: list[dict[str, Any]], joined_round: int, *, grace_s: float | None = None) -> None:
        """Peers from a checkpoint: awaited again (from now) in the restored round, bans intact,
        for `grace_s` (default two timeouts) unless heard from meanwhile."""
        grace_s = 2 * self.peer_timeout_s if grace_s is None else grace_s
        with self.lock:
            for r in records:
                record = PeerRecord(
                    peer_id=r["peer_id"], public_key=bytes.fromhex(r["public_key"]), endpoint=r["endpoint"],
                    client_mode=r["client_mode"], version=r["version"], joined_round=joined_round,
                    last_round=r["last_round"], banned_reason=r["banned_reason"], evidence=list(r["evidence"]),
                    state="restored", dialed=r["endpoint"],  # admitted with it before: a rejoin with it is not dialled again
                    # A restarted coordinator still has to start serving, and peers to notice and
                    # reconnect (with backoff): a grace of one more timeout. After a takeover, the
                    # live peers are already looking for it: a shorter one (TAKEOVER_GRACE_S).
                    last_seen=time.monotonic() + grace_s - self.peer_timeout_s,
                )
                self.peers[record.peer_id] = record

    def session_conflict(self, peer_id: str, session: str, succeeds: str) -> PeerRecord | None:
        """The record of another live process of this key that a Join with `session` would collide
        with, or None when it may join: no session known or given (an older peer), the same
        session (a rejoin of this process), the successor of the recorded one (it took over the
        key's lock: that process is dead), or a recorded session silent for the liveness window."""
        with self.lock:
            record = self.peers.get(peer_id)
            if record is None or not record.session or not session or record.session in (session, succeeds):
                return None
            return record if time.monotonic() - record.last_seen < self.peer_timeout_s else None

    def is_banned(self, peer_id: str) -> bool:
        with self.lock:
            record = self.peers.get(peer_id)
            return bool(record and record.banned_reason)

    def ban(self, peer_id: str, reason: str, evidence: dict[str, Any] | None = None) -> None:
        with self.lock:
            record = self.peers.get(peer_id)
            if record is None:
                return
            record.banned_reason = reason
            if evidence is not None:
                record.evidence.append(evidence)

    def active(self, round_: int) -> list[str]:
        """Peers expected in round `round_`: joined before it opened, alive, not banned."""
        now = time.monotonic()
        with self.lock:
            return sorted(
                p.peer_id
                for p in self.peers.values()
                if not p.banned_reason and p.joined_round <= round_ and now - p.last_seen < self.peer_timeout_s
            )

    def mark_gone(self) -> None:
        now = time.monotonic()
        with self.lock:
            for p in self.peers.values():
                if now - p.last_seen >= self.peer_timeout_s and p.state != "gone":
                    p.state = "gone"

    def status(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        with self.lock:
            return [p.as_status(now) for p in sorted(self.peers.values(), key=lambda p: p.peer_id)]
