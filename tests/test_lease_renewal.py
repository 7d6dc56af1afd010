"""The active coordinator's lease renewals against a DHT with an unreachable node (issue 22's chaos
run: a partitioned peer's DHT node stalled the renewal in flight for 10 s, and the renewals, sent
one at a time, left the lease unheld for ~15 s, so round 77 closed 18 s after round 76).

Real hivemind DHT nodes on loopback, one of them frozen (SIGSTOP of its DHT process and p2pd: it
accepts connections and never answers, like a peer whose link went down). The renewal in flight
is held at a gate (a fault hook on the active's DHT store) for as long as the test wants, so what
is checked does not depend on how long anything takes: while one renewal is stuck, later ones are
sent and confirmed; the stuck one, when it returns, never moves the lease's confirmation back."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from peer.coordinator.lease import Lease, dht_rpc_wait_s
from protocol import discovery
from protocol.identity import Identity

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
FAILSAFE_S = 120.0  # only a failing test waits this long


class GatedDHT:
    """The active's real DHT; while `armed` (a count), the next stores wait at a gate until it is
    set (renewals stuck on an unreachable node for as long as the test wants)."""

    def __init__(self, dht) -> None:
        self.dht = dht
        self.armed = 0
        self.waiting = 0  # stores at the gate now
        self.held = threading.Event()  # a store is waiting at the gate
        self.gate = threading.Event()
        self.returned = threading.Event()  # a gated store returned
        self.held_at = 0.0  # monotonic: when the last gated store reached the gate (its renewal was sent before)
        self._lock = threading.Lock()

    def store(self, *args, **kwargs):
        with self._lock:
            gated = self.armed > 0
            if gated:
                self.armed -= 1
                self.waiting += 1
                self.held_at = time.monotonic()
        if gated:
            self.held.set()
            self.gate.wait(FAILSAFE_S)
            try:
                return self.dht.store(*args, **kwargs)
            finally:
                self.returned.set()
        return self.dht.store(*args, **kwargs)

    def get(self, *args, **kwargs):
        return self.dht.get(*args, **kwargs)


def _process_tree(pid: int) -> list[int]:
    """pid and its descendants (a hivemind DHT process and its p2pd)."""
    tree = [pid]
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            tree += _process_tree(int(child))
    return tree


def until(predicate, timeout_s: float = FAILSAFE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.02)


@pytest.fixture
def dht_with_a_frozen_node():
    """(identity, the active's DHT, freeze()) on three loopback nodes; freeze() stops the third."""
    identities = [Identity.generate() for _ in range(3)]
    nodes = [discovery.start_dht(identities[0], host_maddrs=LOOPBACK)]
    frozen: list[int] = []
    try:
        for identity in identities[1:]:
            nodes.append(discovery.start_dht(identity, initial_peers=discovery.visible_maddrs(nodes[0]), host_maddrs=LOOPBACK))

        def freeze() -> None:
            frozen.extend(_process_tree(nodes[2].pid))
            for pid in frozen:
                os.kill(pid, signal.SIGSTOP)

        yield identities[0], nodes[0], freeze
    finally:
        for pid in frozen:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        for node in reversed(nodes):
            discovery.stop_dht(node)


def test_a_renewal_stuck_on_an_unreachable_node_holds_up_no_later_renewal(dht_with_a_frozen_node):
    identity, dht, freeze = dht_with_a_frozen_node
    gated = GatedDHT(dht)
    lease = Lease(gated, identity, run_id="r", term=0, endpoint="127.0.0.1:1", coordinators=(identity.peer_id,), floor_s=3.0)
    lease.start()  # one renewal, confirmed, before anything is frozen
    try:
        assert lease.renewals == 1
        first_sent = lease._confirmed[0]
        freeze()
        gated.armed = 1
        until(gated.held.is_set)  # the next renewal is stuck
        stuck_sent = gated.held_at  # the lease's clock is time.monotonic
        # Old code: one renewal at a time, so nothing after the stuck one was ever sent.
        until(lambda: lease.renewals >= 2)
        newest = lease._confirmed[0]
        assert newest > stuck_sent > first_sent  # a renewal sent after the stuck one confirmed the lease
        assert not gated.returned.is_set()  # while the stuck one was still in flight
        assert lease.rival is None
    finally:
        lease.stop()  # no renewal is sent from here on; the ones in flight finish
        gated.gate.set()
    until(lambda: gated.returned.is_set() and lease._in_flight == 0)
    assert lease._confirmed[0] >= newest  # the stuck renewal, returning late, did not move it back
    records = discovery.run_records(dht, "r")
    assert [r.coordinator_id for r in records if r.role == "active"] == [identity.peer_id]


class StepClock:
    """The lease's clock, moved by the test: a renewal's measured latency is what the test says."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_renewals_stuck_while_later_ones_confirmed_do_not_lengthen_the_lease(dht_with_a_frozen_node):
    """Issue 22's chaos run: while a peer was cut off, three renewals waited ~5 s each on its DHT node
    while later ones confirmed, and the lease grew from 8 to 20 s (LATENCY_FACTOR x the 3rd slowest
    renewal). A renewal that returns after a later one was confirmed held nothing up: not measured.
    Real DHT nodes; each stuck renewal is held at a gate until 5 s (on the lease's clock) after it
    was sent, and a later one has been confirmed meanwhile. Old code: lease 20 s."""
    identity, dht, _ = dht_with_a_frozen_node
    gated, clock = GatedDHT(dht), StepClock()
    lease = Lease(gated, identity, run_id="r", term=0, endpoint="127.0.0.1:1", coordinators=(identity.peer_id,), floor_s=3.0,
                  clock=clock)
    assert lease.renew()
    stuck: list[threading.Thread] = []
    try:
        for i in range(3):
            gated.armed = 1
            stuck.append(threading.Thread(target=lease.renew, args=(clock.t,), daemon=True))
            stuck[-1].start()
            until(lambda: gated.waiting == i + 1)  # sent, and stuck
            clock.t += 1.0
            assert lease.renew()  # sent later, confirmed at once
            clock.t += 4.0  # the stuck one has waited 5 s when it returns
    finally:
        gated.gate.set()
        for thread in stuck:
            thread.join(FAILSAFE_S)
    # The stuck ones came back refused: the DHT holds the later renewals' records, which expire later.
    assert lease.renewals == 4 and lease.failures == 3
    assert lease.lease_s == 3.0  # the floor: old code 4 x 5 s = 20 s
    assert max(lease.latencies) == 0.0  # only the renewals that held the lease were measured
    assert discovery.run_records(dht, "r")[0].lease_s == 3.0
    clock.t += 2.0
    lease.renew(sent=clock.t - 2.0)  # slow, and the newest when it returns (as renewals slow as a rule are): measured
    assert 2.0 in lease.latencies


def test_a_coordinators_dht_node_waits_a_quarter_of_the_lease_floor_for_an_rpc():
    """hivemind waits 5 s for an unanswered DHT RPC; a coordinator's node waits a quarter of its lease
    floor (1-2 s): a renewal stuck on a cut-off node ends before the next one is sent."""
    assert dht_rpc_wait_s(8.0) == 2.0 and dht_rpc_wait_s(2.0) == 1.0 and dht_rpc_wait_s(6.0) == 1.5
    node = discovery.start_dht(Identity.generate(), host_maddrs=LOOPBACK, rpc_wait_s=dht_rpc_wait_s(8.0))
    try:
        assert discovery.rpc_wait_s(node) == 2.0
    finally:
        discovery.stop_dht(node)
