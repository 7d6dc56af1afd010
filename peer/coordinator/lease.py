"""The active coordinator's lease: its DHT run record, renewed on threads of its own, and the check
the round clock makes right before it signs or records anything.

Safety does not rest on timing. The record is written with a TTL of the lease; a standby takes over
once it has lapsed (peer/coordinator/standby.py). The active acts (signs a manifest, adopts a
round and signs its state, records a round) only while it holds a *confirmed* renewal younger than
lease · (1 − MARGIN), timed on its own monotonic clock from the moment it *sent* that renewal: the
record it wrote then cannot have lapsed yet, whatever happened to the process since (SIGSTOP, a
swap storm, a descheduled thread). A renewal is confirmed when the store succeeded and the run's
records, read beside it (at once, so a renewal costs one DHT round trip), show no rival: a live active record with a higher term, or the same
term and a lower key (protocol.run_state.newer). A rival ends the lease for good: `holds()` raises
Demoted and the coordinator steps down to a standby (peer/coordinator/main.py).

Renewals overlap: one is sent every RENEW_FRACTION of the lease (every RETRY_S while the lease is
not held or the last one to finish failed), whether or not the ones before it have returned, up to
MAX_IN_FLIGHT at once. A DHT call can stall on one unreachable node for hivemind's RPC wait (5 s)
once per step: in the traversal to the key's nearest nodes, and in the store to each of them.
Issue 22's chaos run measured it: a peer's network cut, the renewal in flight took 10.0 s and failed
(the traversal's wait, then the store's), the next one 8-10 s; the lease, renewed one call at a time,
went unheld for about 15 s and round 77 closed 18.0 s after round 76 (bound: 14.0 s), and the lease
grew to 40 s from that one slow call. Now a stalled renewal holds nothing up: hivemind blacklists the
node that did not answer, the renewals sent after that return in milliseconds, and the store returns
once one replica holds the record (`discovery.announce_run(first_replica=True)`: hivemind's
await_all_replicas=False with await_all_tasks=False, so the stores to the other replicas finish in
the background; it returned False after 10 s with a replica frozen, True after 5 s now).

Why overlapping renewals keep the same safety, whatever their timing: `holds()` looks only at the
newest *send time* among the renewals confirmed so far, and a confirmation that arrives late or out
of order never moves that back. Each confirmed renewal wrote, when it was sent, a record whose TTL
runs from a moment no earlier than its send; the clock acts until send + lease · (1 − MARGIN) of the
newest one, before that record can lapse. A renewal still in flight confirms nothing; one that
returns after the stop writes at most a record that expires by itself. So an active that cannot
renew (a partition, a frozen DHT) stops acting a margin before its last record lapses, and a
standby that reads no live record acts only after that; two actives that still overlap (a standby's
lookup missed a live record: the DHT is no consensus log) are fenced by term and by the standbys'
acks (docs/threat-model.md, "The lease is a DHT record").

Adaptive: every renewal's round trip (the store and the read, side by side) is measured, and the lease is the largest of
the configured floor (`control.lease_s`) and LATENCY_FACTOR × the LATENCY_RANK-th slowest of the last
LATENCIES_KEPT renewals: one or two calls that waited on an unreachable node do not lengthen it
(overlapping renewals make a single slow one harmless), renewals that are slow as a rule do. A
renewal that returns after one sent later has been confirmed is not measured: the later one held
the lease meanwhile, so its wait cost nothing; renewals slow as a rule are each the newest
confirmed when they return, and still measured. And a coordinator's DHT node waits at most
`dht_rpc_wait_s` (a quarter of the floor, 1-2 s) for one RPC, not hivemind's 5 s. Issue 22's chaos
run measured why: while a peer was cut off, hivemind retried its DHT node each time its blacklist
expired; each time, the renewal in flight and often the next one (sent before the first gave up)
waited ~5 s on it, the lease went unheld for 1.7 s ("renewed 1.7s after it ran out") and grew from
8 to 20 s (a takeover then would have waited 20 s). With a 2 s wait the stall ends before the next
renewal is sent, the node is blacklisted by then, and 4 x the stall stays within an 8 s floor. It
only grows within a process: a machine that was slow once is assumed slow again, and a standby that
read a longer lease from the record must never be outrun by a shorter one. With renewals every
RENEW_FRACTION of the lease, the lease stays held while the typical renewal takes less than
(1 − MARGIN − RENEW_FRACTION) of it, 1.7x the LATENCY_RANK-th slowest measured.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Callable, Protocol

from protocol import discovery
from protocol.identity import Identity
from protocol.run_state import rank

log = logging.getLogger("swarmloco.coordinator")
MARGIN = 0.25  # of the lease: the active stops acting this long before its record can lapse
RENEW_FRACTION = 1 / 3  # renew every third of the lease
LATENCY_FACTOR = 4.0  # lease >= this x the slowest recent renewal round trip
LATENCIES_KEPT = 8
LATENCY_RANK = 3  # the lease follows the 3rd slowest of the renewals kept: two outliers are set aside
MAX_IN_FLIGHT = 4  # renewals at once (each a thread waiting on the DHT)
MAX_LEASE_S = 120.0  # a DHT that slow is broken: waiting longer only delays a failover
RETRY_S = 0.5  # after a renewal that was not confirmed
STOP_WAIT_S = 1.0  # stop(): how long a renewal in flight is waited for
RPC_WAIT_MIN_S, RPC_WAIT_MAX_S = 1.0, 2.0  # a coordinator's DHT node: one RPC's wait for an answer (peers: 5 s)


def dht_rpc_wait_s(floor_s: float) -> float:
    """How long one DHT RPC of a coordinator's node waits for an answer: a quarter of the lease
    floor, within 1-2 s (see the module docstring)."""
    return min(RPC_WAIT_MAX_S, max(RPC_WAIT_MIN_S, floor_s / 4))


class Demoted(RuntimeError):
    """Another coordinator holds the run (a higher term, or the same term and a lower key)."""

    def __init__(self, rival: discovery.RunRecord, term: int) -> None:
        super().__init__(f"coordinator {rival.coordinator_id[:8]} holds run {rival.run_id} with term {rival.term} (ours: {term})")
        self.rival = rival


class Halted(RuntimeError):
    """The coordinator stopped while it waited for its lease: the round in hand is left unapplied."""


class ActGuard(Protocol):
    """What the round clock asks before it signs or records: `holds()` (raises Demoted), and
    `wait_held(timeout_s)` while it does not; `lease_s` is the lease now (0: none)."""

    lease_s: float

    def holds(self) -> bool: ...

    def wait_held(self, timeout_s: float) -> bool: ...

    def status(self) -> dict: ...


class AlwaysHeld:
    """A coordinator without a DHT (in-process tests, `--no-dht`): nobody else can take the run."""

    lease_s = 0.0

    def holds(self) -> bool:
        return True

    def wait_held(self, timeout_s: float) -> bool:
        return True

    def status(self) -> dict:
        return {"lease_s": None}


ALWAYS_HELD = AlwaysHeld()


class Lease:
    """The active coordinator's run record as its lease. `start()` renews once (the coordinator may
    act from then on) and starts the renewal thread; `stop()` ends it."""

    def __init__(self, dht, identity: Identity, *, run_id: str, term: int, endpoint: str, coordinators: tuple[str, ...],
                 floor_s: float, on_records: Callable[[list[discovery.RunRecord]], None] = lambda records: None,
                 on_lapse: Callable[[float], None] = lambda lapsed_at: None, clock: Callable[[], float] = time.monotonic) -> None:
        self.dht, self.identity = dht, identity
        self.run_id, self.term, self.endpoint, self.coordinators = run_id, term, endpoint, tuple(coordinators)
        self.floor_s = floor_s
        self.lease_s = floor_s  # the current lease: the TTL the next renewal writes
        self.on_records = on_records  # every read of the run's records (standby endpoints for peers' failover)
        self.on_lapse = on_lapse  # a renewal confirmed after the last one had run out: when it ran out (followers.revive)
        self.lapses = 0
        self.clock = clock
        self.latencies: deque[float] = deque(maxlen=LATENCIES_KEPT)
        self.rival: discovery.RunRecord | None = None
        self.renewals = self.failures = 0
        self._confirmed: tuple[float, float] | None = None  # (monotonic send time, its lease) of the newest confirmed renewal
        self._last_attempt = (clock(), False)  # (send time, confirmed) of the last renewal to finish
        self._last_sent = clock()  # the newest renewal's send time
        self._in_flight = 0
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- what the clock asks -------------------------------------------------------------------

    def holds(self) -> bool:
        """Whether the coordinator may act now: its last confirmed renewal is younger than that
        renewal's lease minus the margin. Raises Demoted once a rival holds the run."""
        with self._changed:
            if self.rival is not None:
                raise Demoted(self.rival, self.term)
            return self._held_locked()

    def _held_locked(self) -> bool:
        if self._confirmed is None:
            return False
        sent, lease_s = self._confirmed
        return self.clock() - sent < lease_s * (1 - MARGIN)

    def wait_held(self, timeout_s: float) -> bool:
        """Wait up to timeout_s for the lease to be held (a renewal confirmed); raises Demoted."""
        deadline = self.clock() + timeout_s
        with self._changed:
            while not self.holds():
                remaining = deadline - self.clock()
                if remaining <= 0:
                    return False
                self._changed.wait(remaining)
            return True

    def status(self) -> dict:
        with self._changed:
            age = None if self._confirmed is None else round(self.clock() - self._confirmed[0], 2)
            return {"lease_s": round(self.lease_s, 2), "floor_s": self.floor_s, "renewal_age_s": age,
                    "renewal_latency_s": round(max(self.latencies), 3) if self.latencies else None,
                    "renewals": self.renewals, "failed_renewals": self.failures, "lapses": self.lapses}

    # --- renewal -------------------------------------------------------------------------------

    def renew(self, sent: float | None = None) -> bool:
        """Write the record and read the run's records back: True when confirmed (no rival).
        `sent`: its send time, when the renewal thread counted it already."""
        with self._changed:
            if sent is None:
                sent = self._last_sent = max(self._last_sent, self.clock())
            lease_s = self.lease_s
        # The read runs beside the store, not after it: a renewal costs one DHT round trip, not two,
        # and the lease (LATENCY_FACTOR x a slow renewal) stays near its floor on a loaded
        # machine. The read is for rivals only (a record that outranks ours, written by another);
        # what the clock may do rests on the send time and the store, as before.
        read: dict[str, list[discovery.RunRecord] | None] = {"records": None}

        def read_records() -> None:
            try:
                read["records"] = discovery.vouched(discovery.run_records(self.dht, self.run_id))
            except Exception as exc:  # noqa: BLE001 - a DHT hiccup: the next renewal tries again
                log.info("lease renewal: reading the run's records failed: %s", exc)

        reader = threading.Thread(target=read_records, name="swarmloco-lease-read", daemon=True)
        reader.start()
        try:
            stored = discovery.announce_run(self.dht, self.identity, run_id=self.run_id, endpoint=self.endpoint, role="active",
                                            term=self.term, coordinators=self.coordinators, ttl_s=lease_s, first_replica=True)
        except Exception as exc:  # noqa: BLE001 - a DHT hiccup: the next renewal tries again
            log.info("lease renewal failed: %s", exc)
            stored = False
        reader.join()
        records = read["records"]
        latency = self.clock() - sent
        rival = self._rival(records or [])
        lapsed_at: float | None = None
        with self._changed:
            # Adaptive, and only ever longer (see the module docstring). A renewal that returns after
            # one sent later was confirmed is not measured: the lease was held by that one meanwhile.
            if self._confirmed is None or sent >= self._confirmed[0]:
                self.latencies.append(latency)
            if self.latencies:
                typical = sorted(self.latencies, reverse=True)[min(LATENCY_RANK, len(self.latencies)) - 1]
                self.lease_s = min(MAX_LEASE_S, max(self.lease_s, self.floor_s, LATENCY_FACTOR * typical))
            confirmed = rival is None and stored and records is not None
            if rival is not None:
                self.rival = rival
            elif confirmed:
                if self._confirmed is None or sent > self._confirmed[0]:  # never moved back by a late, older one
                    if self._confirmed is not None and not self._held_locked():
                        # Confirmed only after the newest one before it ran out (sent after that, or late).
                        lapsed_at = self._confirmed[0] + self._confirmed[1] * (1 - MARGIN)
                    self._confirmed = (sent, lease_s)
                self.renewals += 1
            else:
                self.failures += 1
            if lapsed_at is not None:
                self.lapses += 1
            if sent >= self._last_attempt[0]:
                self._last_attempt = (sent, confirmed)
            self._changed.notify_all()
        if lapsed_at is not None:
            # It was not held for a while (this process was frozen, or the DHT unreachable): whatever
            # the clock counted meanwhile was not the standbys' silence.
            log.warning("lease: renewed %.1fs after it ran out", self.clock() - lapsed_at)
            self.on_lapse(lapsed_at)
        if records is not None:
            self.on_records(records)
        if self.lease_s > lease_s:
            log.info("lease: renewal took %.2fs; lease now %.1fs", latency, self.lease_s)
        return confirmed

    def _rival(self, records: list[discovery.RunRecord]) -> discovery.RunRecord | None:
        """The live active record that wins over ours by the one rule, if any."""
        ours = rank(self.term, self.identity.peer_id)
        rivals = [r for r in records if r.role == "active" and r.coordinator_id != self.identity.peer_id
                  and rank(r.term, r.coordinator_id) > ours]
        return max(rivals, key=lambda r: rank(r.term, r.coordinator_id)) if rivals else None

    def start(self, first: threading.Thread | None = None) -> None:
        """Renew once, or wait for `first`, a thread already sending the first renewal (a takeover
        sends it while the coordinator is built); then renew on the lease's own thread."""
        if first is None:
            self.renew()
        else:
            first.join()
        self._thread = threading.Thread(target=self._run, name="swarmloco-lease", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        """Send a renewal every RENEW_FRACTION of the lease (RETRY_S while not held or after a failure),
        each on a thread of its own: one stalled on an unreachable DHT node holds up none after it."""
        while self.rival is None and not self._stop.is_set():
            with self._changed:
                while self._in_flight >= MAX_IN_FLIGHT and not self._stop.is_set():
                    self._changed.wait()
                interval = self.lease_s * RENEW_FRACTION
                fresh = self._held_locked() and self._last_attempt[1]
                next_at = self._last_sent + (interval if fresh else min(interval, RETRY_S))
            if self._stop.wait(max(0.0, next_at - self.clock())):
                return
            with self._changed:
                if self._in_flight >= MAX_IN_FLIGHT:
                    continue
                sent = self._last_sent = self.clock()
                self._in_flight += 1
            threading.Thread(target=self._renew_in_flight, args=(sent,), name="swarmloco-lease-renew", daemon=True).start()

    def _renew_in_flight(self, sent: float) -> None:
        try:
            self.renew(sent)
        except Exception:  # noqa: BLE001 - never lose the in-flight count; the next renewal goes on
            log.exception("lease renewal failed")
        finally:
            with self._changed:
                self._in_flight -= 1
                self._changed.notify_all()

    def stop(self) -> None:
        self._stop.set()
        with self._changed:
            self._changed.notify_all()
        if self._thread is not None:
            # Renewals in flight end with their DHT calls, or fail once the DHT stops: not waited for
            # (they write nothing the clock acts on: holds() counts from confirmed renewals only).
            self._thread.join(timeout=STOP_WAIT_S)

    def close_run(self, endpoint: str) -> None:
        """The run is over: a "finished" record (standbys stop following; newcomers learn it)."""
        discovery.announce_run(self.dht, self.identity, run_id=self.run_id, endpoint=endpoint, role="finished", term=self.term,
                               coordinators=self.coordinators, ttl_s=discovery.RECORD_TTL_S)
