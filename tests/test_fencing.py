"""The split brain's defences, in process (issue 22): the active coordinator's lease (it acts only
within lease − margin of the renewal it sent, a rival demotes it, the lease grows with slow
renewals), the round clock that signs and records nothing without it, the record of a round that
waits for the standbys it counts, and fencing by term (a peer refuses what a superseded coordinator
signs, keeps two actives in one term as evidence, and moves on). The real-process split brain is
tests/test_failover.py."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest

from peer.coordinator import standby
from peer.coordinator.followers import ACK_WAIT_LEASES, GRACE_LEASES, Followers
from peer.coordinator.lease import LATENCY_FACTOR, LATENCY_RANK, MARGIN, Demoted, Lease
from peer.coordinator.state import Coordinator
from peer.exchange.outcome import Applied, Resync
from peer.node.round_exchange import RoundExchange
from peer.node.errors import PeerExit
from peer.node.trust import RunAuthority
from peer.run import checkpoint
from peer.run.timeouts import PeerTimeouts
from protocol import discovery
from protocol.accounting import ByteCounter
from protocol.envelope import MANIFEST_TAG, EnvelopeError, RoundManifest, open_manifest, sign_manifest
from protocol.identity import Identity
from protocol.run_state import CoordinatorKeys, RunState, TermFence, open_run_state, sign_run_state
from protocol.signing import open_signed, sign_body
from protocol.wire import swarm_pb2
from tests.coordinator_harness import tiny_config
from tests.fakes import FakeCoordinator
from tests.test_node_round import AddOne, make_update, peer_round

FAST = PeerTimeouts(poll=timedelta(milliseconds=10), manifest=timedelta(seconds=2), results=timedelta(seconds=2))


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeDHT:
    """What protocol.discovery asks of a hivemind DHT (store, get), in memory; a store takes
    `store_s` of the fake clock (a slow DHT)."""

    def __init__(self, clock: FakeClock, store_s: float = 0.0) -> None:
        self.clock, self.store_s = clock, store_s
        self.values: dict[str, dict[str, tuple[bytes, float]]] = {}

    def store(self, key, value, expiration, subkey=None, **hivemind_options) -> bool:
        self.clock.now += self.store_s
        self.values.setdefault(key, {})[subkey] = (value, expiration)
        return True

    def get(self, key, latest=True):
        found = self.values.get(key)
        return None if found is None else SimpleNamespace(
            value={k: SimpleNamespace(value=v, expiration_time=e) for k, (v, e) in found.items()})


def until(predicate, timeout_s: float = 30.0) -> None:
    """Wait for an observable fact (another thread reached a point), failing after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.01)


def lease_for(dht, identity: Identity, others: tuple[str, ...] = (), *, term: int = 0, floor_s: float = 2.0, clock=None) -> Lease:
    return Lease(dht, identity, run_id="r", term=term, endpoint="127.0.0.1:1", coordinators=(identity.peer_id, *others),
                 floor_s=floor_s, clock=clock or FakeClock())


# --- the lease -----------------------------------------------------------------------------------


def test_the_lease_is_held_only_within_lease_minus_margin_of_the_renewal_it_sent():
    clock = FakeClock()
    dht = FakeDHT(clock, store_s=0.3)  # the renewal takes 0.3 s: the record's TTL runs from its send
    lease = lease_for(dht, Identity.generate(), clock=clock, floor_s=2.0)
    assert not lease.holds()  # never renewed: acts on nothing
    sent = clock.now
    assert lease.renew()
    assert lease.holds()
    clock.now = sent + 2.0 * (1 - MARGIN) - 0.01
    assert lease.holds()
    clock.now = sent + 2.0 * (1 - MARGIN)  # the record has not lapsed yet, but the margin is gone
    assert not lease.holds()
    assert lease.renew() and lease.holds()  # a fresh confirmed renewal


def test_a_rival_with_a_higher_term_or_the_same_term_and_a_lower_key_demotes():
    ours, theirs = sorted((Identity.generate() for _ in range(2)), key=lambda i: i.peer_id)
    for rival, rival_term, our_term in ((theirs, 1, 0), (ours, 1, 1)):  # higher term; same term, lower key
        me = theirs if rival is ours else ours
        clock = FakeClock()
        dht = FakeDHT(clock)
        lease = lease_for(dht, me, (rival.peer_id,), term=our_term, clock=clock)
        assert lease.renew() and lease.holds()
        discovery.announce_run(dht, rival, run_id="r", endpoint="127.0.0.1:2", term=rival_term,
                               coordinators=(me.peer_id, rival.peer_id), ttl_s=2.0)
        assert not lease.renew()
        with pytest.raises(Demoted, match=f"term {rival_term}"):
            lease.holds()
        assert lease.rival.coordinator_id == rival.peer_id
    # Not a rival: a lower term, or a standby's record.
    clock = FakeClock()
    dht = FakeDHT(clock)
    lease = lease_for(dht, theirs, (ours.peer_id,), term=2, clock=clock)
    discovery.announce_run(dht, ours, run_id="r", endpoint="127.0.0.1:2", term=1, coordinators=(ours.peer_id, theirs.peer_id))
    assert lease.renew() and lease.holds()


def test_the_lease_grows_with_slow_renewals_and_never_shrinks():
    clock = FakeClock()
    dht = FakeDHT(clock, store_s=0.1)
    lease = lease_for(dht, Identity.generate(), clock=clock, floor_s=2.0)
    lease.renew()
    assert lease.lease_s == 2.0  # the floor: 4 x 0.1 s is less
    dht.store_s = 5.0  # one renewal waited on an unreachable node: an outlier, the lease stays
    lease.renew()
    assert lease.lease_s == 2.0
    dht.store_s = 1.5  # a loaded machine: slow renewals become the rule
    lease.renew()
    assert lease.lease_s == 2.0  # two slow ones are still set aside
    lease.renew()
    assert LATENCY_RANK == 3 and lease.lease_s == pytest.approx(LATENCY_FACTOR * 1.5)  # the 3rd slowest
    record = discovery.run_records(dht, "r")[0]
    assert record.lease_s == 2.0  # that renewal was sent with the lease it had; the next one names the longer one
    dht.store_s = 0.01
    for _ in range(10):
        lease.renew()
    assert lease.lease_s == pytest.approx(LATENCY_FACTOR * 1.5)  # kept: a standby may have read it
    assert discovery.run_records(dht, "r")[0].lease_s == pytest.approx(6.0)


def test_a_standbys_calls_to_the_active_end_by_its_records_lapse():
    """A frozen or cut-off active holds each call its whole deadline; the standby looks at the DHT
    (to take over) between calls, so no call outlasts the lapse of the record it read last."""
    f = standby.Following(dht=None, identity=Identity.generate(), run_id="r", checkpoint_path=None, endpoint="", pinned=None,
                          fence=TermFence())
    assert f.call_s(8.0) == standby.call_s(8.0) == 4.0 and f.wait_s() == standby.MANIFEST_WAIT_S  # no record read yet
    f.expires_at = discovery.dht_time() + 60.0
    assert f.call_s(8.0) == 4.0 and f.wait_s() == standby.MANIFEST_WAIT_S  # a live active's record: the usual deadlines
    f.expires_at = discovery.dht_time() + 0.5
    assert standby.MIN_CALL_S <= f.call_s(8.0) <= 0.5 and standby.MIN_WAIT_S <= f.wait_s() <= 0.5
    f.expires_at = discovery.dht_time() - 1.0  # lapsed: short calls, and the DHT is read again at once
    assert f.call_s(8.0) == standby.MIN_CALL_S and f.wait_s() == standby.MIN_WAIT_S


def test_a_renewal_confirmed_late_or_out_of_order_never_moves_the_lease_back():
    clock = FakeClock()
    lease = lease_for(FakeDHT(clock), Identity.generate(), clock=clock, floor_s=2.0)
    lapses = []
    lease.on_lapse = lapses.append
    newer = clock.now + 1.0
    older = clock.now
    clock.now = newer
    assert lease.renew(sent=newer) and lease._confirmed[0] == newer
    assert lease.renew(sent=older) and lease._confirmed[0] == newer  # the older one, back late: not counted
    clock.now = newer + 2.0 * (1 - MARGIN) + 1.0  # nothing confirmed since the margin ran out
    assert not lease.holds()
    assert lease.renew(sent=newer + 0.5)  # sent before that, confirmed after: the lease was not held meanwhile
    assert lapses == [newer + 2.0 * (1 - MARGIN)] and not lease.holds()
    assert lease.renew() and lease.holds()


# --- the round clock under the lease --------------------------------------------------------------


class SwitchLease:
    """A lease a test holds or lets lapse; `waits` counts the clock's waits for it."""

    lease_s = 2.0

    def __init__(self) -> None:
        self.held = True
        self.rival = None
        self.waits = 0
        self.changed = threading.Event()

    def holds(self) -> bool:
        if self.rival is not None:
            raise Demoted(self.rival, 0)
        return self.held

    def wait_held(self, timeout_s: float) -> bool:
        self.waits += 1
        self.changed.wait(min(timeout_s, 0.05))
        return self.held

    def status(self) -> dict:
        return {"lease_s": self.lease_s}


@pytest.fixture(scope="module")
def cfg():
    return tiny_config()


def test_a_coordinator_that_cannot_renew_its_lease_closes_no_round(cfg):
    c = Coordinator(cfg, Identity.generate())
    lease = c.lease = SwitchLease()
    lease.held = False
    assert c.close_round("test") is None
    assert not c.book.closed and c.manifests == {} and c.round == 0  # no manifest signed: the round stays open
    lease.held = True
    result = c.close_round("test")
    assert result is not None and c.round == 1 and [h.round for h in c.history] == [0]
    assert open_signed(c.manifests[0], MANIFEST_TAG)[0]["term"] == 0  # signed with the coordinator's term


def test_a_round_ready_to_apply_waits_for_the_lease_and_a_rival_leaves_it_unapplied(cfg):
    c = Coordinator(cfg, Identity.generate())
    lease = c.lease = SwitchLease()
    before = c.param_hash
    with c.lock:
        c.clock._close_commits()  # the manifest was signed while the lease was held ...
    lease.held = False  # ... then the process froze past its lease
    outcome: list = []
    thread = threading.Thread(target=lambda: outcome.append(_apply_or_demoted(c)))
    thread.start()
    until(lambda: lease.waits > 0)  # it waits for the lease, off the lock
    with c.lock:
        assert c.round == 0 and c.param_hash == before and c.history == []  # nothing adopted, nothing signed
        assert c.state_at(1) is None
    lease.rival = SimpleNamespace(coordinator_id="f" * 32, run_id=cfg.run_id, term=1)  # a standby took over
    thread.join(10)
    assert outcome == ["demoted"] and c.round == 0 and c.history == []


def _apply_or_demoted(c: Coordinator) -> str:
    try:
        c.clock._apply(c.book, "test")
        return "applied"
    except Demoted:
        return "demoted"


def test_a_round_is_recorded_only_once_every_counted_standby_holds_its_state(cfg):
    c = Coordinator(cfg, Identity.generate())
    standby = Identity.generate()
    assert c.followers.heard(standby.peer_id, endpoint="127.0.0.1:9", holding_round=0, holding_hash=c.param_hash)
    done = threading.Event()
    thread = threading.Thread(target=lambda: (c.close_round("test"), done.set()))
    thread.start()
    until(lambda: c.followers.pending is not None)  # round 0 is applied; its record waits for the standby
    assert not done.is_set() and c.history == [] and c.round == 1
    assert checkpoint.from_bytes(c.checkpoint_bytes).round == 1  # what the standby fetches is already served
    assert c.followers.heard(standby.peer_id, endpoint="127.0.0.1:9", holding_round=1, holding_hash=c.param_hash)
    thread.join(10)
    assert done.is_set() and [h.round for h in c.history] == [0]
    assert c.status()["coordinator"]["standbys"][0]["fingerprint"] == standby.peer_id  # `swarmloco status` lists it


def test_a_standby_that_lags_or_goes_silent_is_waited_for_until_its_grace_ends():
    clock = FakeClock()
    followers = Followers(lambda: 2.0, recorded=3, clock=clock)
    assert not followers.heard("a" * 32, endpoint="", holding_round=2, holding_hash="")  # behind the recorded state
    assert followers.heard("b" * 32, endpoint="", holding_round=3, holding_hash="")
    assert followers.awaited(4)[0].fingerprint == "b" * 32 and followers.awaited(3) == []
    followers.pending = (4, clock.now)
    clock.now += ACK_WAIT_LEASES * 2.0 + 0.1  # lagging on round 4 for longer than the ack wait
    last_counted = clock.now - ACK_WAIT_LEASES * 2.0 - 0.1
    assert not followers.heard("b" * 32, endpoint="", holding_round=3, holding_hash="")  # no longer counted ...
    clock.now = last_counted + GRACE_LEASES * 2.0 - 0.01
    assert [f.fingerprint for f in followers.awaited(4)] == ["b" * 32]  # ... but waited for until its grace ends
    clock.now += 0.02
    assert followers.awaited(4) == []
    assert followers.wait_for(4) and followers.recorded == 4


# --- fencing by term --------------------------------------------------------------------------------


def run_state(identity: Identity, term: int, round_: int = 3) -> swarm_pb2.Signed:
    return sign_run_state(identity, RunState(run_id="fake-run", config_hash="c" * 64, term=term, role="active", round=round_,
                                             param_hash="p" * 64, finished=False, active_endpoint="", timestamp=time.time()))


def test_the_fence_refuses_lower_terms_and_keeps_two_actives_in_one_term_as_evidence():
    a, b = sorted((Identity.generate() for _ in range(2)), key=lambda i: i.peer_id)
    fence = TermFence()
    assert fence.observe(0, b.peer_id, run_state(b, 0))
    assert fence.observe(1, b.peer_id, run_state(b, 1))
    assert not fence.observe(0, b.peer_id) and fence.stale(0, a.peer_id)  # superseded, whoever signed it
    assert fence.observe(1, a.peer_id, run_state(a, 1))  # two actives in term 1: the lower key holds it ...
    assert not fence.observe(1, b.peer_id) and (fence.term, fence.signer) == (1, a.peer_id)
    [evidence] = fence.evidence  # ... and both signed states are kept
    assert evidence["term"] == 1 and evidence["keys"] == sorted([a.peer_id, b.peer_id]) and evidence["winner"] == a.peer_id
    assert len(evidence["signed"]) == 2


def test_a_manifest_carries_its_term_and_one_without_is_malformed():
    coordinator = Identity.generate()
    keys = CoordinatorKeys.of([coordinator.peer_id])
    signed = sign_manifest(coordinator, RoundManifest(run_id="r", round=2, base_param_hash="B", entries=[], excluded={}, term=3))
    assert open_manifest(signed, keys=keys, run_id="r", round_=2).term == 3
    fields, _ = open_signed(signed, MANIFEST_TAG)
    for bad in (None, -1, True, "3"):
        body = {k: v for k, v in fields.items() if k != "term"} if bad is None else {**fields, "term": bad}
        with pytest.raises(EnvelopeError) as refused:
            open_manifest(sign_body(coordinator, MANIFEST_TAG, body), keys=keys, run_id="r", round_=2)
        assert refused.value.reason == "malformed"


def test_a_peer_refuses_a_superseded_coordinators_manifest_and_commits_again_at_the_active_one():
    old, new, peer = Identity.generate(), Identity.generate(), Identity.generate()
    fake = FakeCoordinator(identity=old)
    fence = TermFence()
    fence.observe(1, new.peer_id)  # a reply already showed term 1 (the standby took over)
    moved: list[str] = []

    def relocate() -> bool:  # what RunAuthority.relocate does: the client switches to the term-1 coordinator
        fake.fail_over("standby:2")
        fake.identity = new
        moved.append(fake.endpoint)
        return True

    exchange = RoundExchange(client=fake, keys=CoordinatorKeys.of([old.peer_id, new.peer_id]), run_id=fake.run_id,
                             peer_id=peer.peer_id, side=AddOne(), timeouts=FAST, stop=threading.Event(), endpoint="127.0.0.1:9",
                             client_mode=False, rejoin=lambda: None, fence=fence, relocate=relocate)
    update = make_update(peer)
    exchange.commit(update, 0)
    fake.manifests[0] = sign_manifest(old, RoundManifest(run_id=fake.run_id, round=0, base_param_hash="0" * 64, entries=[],
                                                         excluded={}, term=0))  # the frozen one woke up and closed round 0

    def republish(method: str, count: int) -> None:  # the new coordinator closes round 0 in term 1
        if method == "submit" and fake.identity is new:
            fake.manifests[0] = sign_manifest(new, RoundManifest(run_id=fake.run_id, round=0, base_param_hash="0" * 64, entries=[],
                                                                 excluded={}, term=1))

    fake.on_call(republish)
    outcome = exchange.run(peer_round(update))
    assert isinstance(outcome, Applied) and moved == ["standby:2"]
    assert exchange.side.seen[0].manifest.term == 1  # only the term-1 manifest reached the exchange mode
    commits = fake.commitments[0]
    assert len(commits) >= 2 and all(c == update.signed for c in commits)  # the same update, committed again: no retraining


def test_a_peer_without_a_successor_resynchronises_instead_of_applying_a_superseded_manifest(monkeypatch):
    monkeypatch.setattr("peer.node.round_exchange.RELOCATE_TRIES", 1)
    old, peer = Identity.generate(), Identity.generate()
    fake = FakeCoordinator(identity=old)
    fence = TermFence()
    fence.observe(2, "0" * 32)
    exchange = RoundExchange(client=fake, keys=CoordinatorKeys.of([old.peer_id]), run_id=fake.run_id, peer_id=peer.peer_id,
                             side=AddOne(), timeouts=FAST, stop=threading.Event(), endpoint="127.0.0.1:9", client_mode=False,
                             rejoin=lambda: None, fence=fence, relocate=lambda: False)
    update = make_update(peer)
    fake.manifests[0] = sign_manifest(old, RoundManifest(run_id=fake.run_id, round=0, base_param_hash="0" * 64, entries=[],
                                                         excluded={}, term=1))
    outcome = exchange.run(peer_round(update))
    assert isinstance(outcome, Resync) and "superseded" in outcome.why and exchange.side.seen == []


class StateClient:
    """A coordinator client serving one signed run state; relocate() switches to the next."""

    def __init__(self, *states: swarm_pb2.Signed) -> None:
        self.states = list(states)
        self.endpoint = "old:1"
        self.relocations = 0

    def run_info(self, round_=None, *, state_only=False) -> swarm_pb2.RunInfo:
        return swarm_pb2.RunInfo(run_state=self.states[0])

    def relocate(self) -> bool:
        if len(self.states) == 1:
            return False
        self.states.pop(0)
        self.endpoint, self.relocations = "new:2", self.relocations + 1
        return True


def test_the_run_authority_refuses_a_lower_term_state_and_moves_to_the_higher_term():
    old, new = Identity.generate(), Identity.generate()
    keys = CoordinatorKeys.of([old.peer_id, new.peer_id])
    client = StateClient(run_state(old, 0), run_state(new, 1))
    authority = RunAuthority(keys=keys, run_id="fake-run", client=client, counter=ByteCounter("p"), endpoints=[])
    authority.fence.observe(1, new.peer_id)  # learnt from a probe of the standby that took over
    state = authority.state()
    assert state is not None and (state.term, state.signer) == (1, new.peer_id) and client.relocations == 1
    alone = RunAuthority(keys=keys, run_id="fake-run", client=StateClient(run_state(old, 0)), counter=ByteCounter("p"), endpoints=[])
    alone.fence.observe(1, new.peer_id)
    assert alone.state() is None  # superseded, and no successor answers: no state is believed
    assert open_run_state(run_state(old, 0), keys=keys, run_id="fake-run").term == 0  # (it verifies: only the term is refused)


def test_a_run_state_carried_by_the_applied_reply_is_believed_without_asking_and_on_the_same_checks():
    """The sliced exchange's applied long-poll carries the signed state of round r + 1
    (SliceResultsReply.run_state): the peer checks θ_{r+1} against it with no GetRunInfo round trip,
    but only when a run key signed it, for that round, in a term the fence accepts."""
    old, new, stranger = Identity.generate(), Identity.generate(), Identity.generate()
    keys = CoordinatorKeys.of([old.peer_id, new.peer_id])

    class Counting(StateClient):
        asked = 0

        def run_info(self, round_=None, *, state_only=False) -> swarm_pb2.RunInfo:
            self.asked += 1
            return super().run_info(round_, state_only=state_only)

    client = Counting(run_state(new, 1, round_=4))
    authority = RunAuthority(keys=keys, run_id="fake-run", client=client, counter=ByteCounter("p"), endpoints=[])
    state = authority.state(4, carried=run_state(old, 0, round_=4))
    assert state is not None and (state.round, state.signer) == (4, old.peer_id) and client.asked == 0
    # another round's state, an empty one, one the fence refuses: asked for instead
    for carried in (run_state(old, 0, round_=3), swarm_pb2.Signed()):
        assert authority.state(4, carried=carried).signer == new.peer_id
    asked = client.asked
    assert asked == 2 and authority.fence.term == 1
    assert authority.state(4, carried=run_state(old, 0, round_=4)).signer == new.peer_id and client.asked == asked + 1
    with pytest.raises(PeerExit):  # signed by a key that is not the run's: as loud as the asked-for state's
        authority.state(4, carried=run_state(stranger, 2, round_=4))


def test_a_takeovers_run_log_holds_the_rounds_it_inherited_and_not_twice(tmp_path):
    """The run's round list is not restarted at the takeover round: the new coordinator's log gets
    the rounds of the history it took over that the log lacks, marked inherited."""
    from peer.coordinator.run_log import RunWatcher

    def status(coordinator_id: str, history: list[dict]) -> dict:
        return {"run_id": "r", "coordinator_id": coordinator_id, "endpoint": "h:1", "round": len(history), "codec": "fp16",
                "aggregator": "median", "outer": "nesterov", "initial_val_loss": 5.0, "finished": False, "history": history,
                "peers": [], "coordinator_traffic": {"bytes_sent": 0, "bytes_received": 0}}

    rounds = [{"round": r, "val_loss": 4.0 - r, "updates": 2, "excluded": {}, "seconds": 1.0, "close_reason": "quorum",
               "param_hash": f"h{r}"} for r in range(3)]
    shared, fresh = tmp_path / "shared.jsonl", tmp_path / "fresh.jsonl"
    view = {"history": []}
    first = RunWatcher(lambda: status("a" * 32, view["history"]), shared)
    first.poll()
    view["history"] = rounds[:1]
    first.poll()  # the log holds round 0; round 1 was closed after the last poll (then the process froze)
    first.close()
    for path in (shared, fresh):
        watcher = RunWatcher(lambda: status("b" * 32, rounds[:2]), path, term=lambda: 1)
        watcher.poll()
        watcher.close()
    events = [json.loads(line) for line in shared.read_text().splitlines()]
    assert [(e["event"], e.get("round"), e.get("inherited")) for e in events] == [
        ("start", 0, None), ("round", 0, None), ("takeover", 2, None), ("round", 1, True)]
    events = [json.loads(line) for line in fresh.read_text().splitlines()]
    assert [(e["event"], e.get("round")) for e in events] == [("takeover", 2), ("round", 0), ("round", 1)]
    assert events[0]["initial_val_loss"] == 5.0 and all(e["param_hash"] == f"h{e['round']}" for e in events[1:])


def test_the_run_log_says_finished_only_after_the_last_round(tmp_path):
    """The clock sets `finished` when it closes the last round, before that round is persisted into
    the history: a poll in between must not write "finished" ahead of the last round's line."""
    from peer.coordinator.run_log import RunWatcher

    rounds = [{"round": r, "val_loss": 4.0 - r, "updates": 2, "excluded": {}, "seconds": 1.0, "close_reason": "quorum",
               "param_hash": f"h{r}"} for r in range(2)]
    view = {"history": rounds[:1], "finished": False, "round": 1}

    def status() -> dict:
        return {"run_id": "r", "coordinator_id": "a" * 32, "endpoint": "h:1", "round": view["round"], "codec": "fp16",
                "aggregator": "median", "outer": "nesterov", "initial_val_loss": 5.0, "finished": view["finished"],
                "history": view["history"], "peers": [], "coordinator_traffic": {"bytes_sent": 0, "bytes_received": 0}}

    path = tmp_path / "run.jsonl"
    watcher = RunWatcher(status, path)
    watcher.poll()
    view.update(finished=True, round=2)  # round 1 closed, the run is over; round 1 not persisted yet
    watcher.poll()
    view["history"] = rounds
    watcher.poll()
    watcher.close()
    events = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(e["event"], e.get("round")) for e in events] == [("start", 1), ("round", 1), ("finished", 2)]
