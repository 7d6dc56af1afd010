"""A peer's round after training, in process, against tests/fakes.py's coordinator: every branch
of commit (rejoin, resync, fatal, a cut push), of the manifest wait (manifest, finished, missed,
deadline, refused re-commit, failover), the censorship check, and the outcome handling."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import torch

from peer.exchange.outcome import Applied, Fatal, Finished, Resync, Unreachable
from peer.exchange.peer_side import ManifestInHand, PeerExchange
from peer.node.coordinator_client import CoordinatorUnavailable
from peer.node.errors import PeerExit
from peer.node.node import PeerNode, PeerOptions
from peer.node.round import PeerRound, Update
from peer.node.round_exchange import PUSH_FAILED, RoundExchange
from peer.run import faults
from peer.run.timeouts import PeerTimeouts
from protocol.accounting import Traffic
from protocol.envelope import UpdateHeader, sha256_hex, sign_update
from protocol.identity import Identity
from protocol.run_state import CoordinatorKeys
from protocol.wire import swarm_pb2
from tests.fakes import FakeCoordinator

D = 8  # parameters of the toy round
FAST = PeerTimeouts(poll=timedelta(milliseconds=10), manifest=timedelta(seconds=2), results=timedelta(seconds=2))


class AddOne(PeerExchange):
    """An exchange mode that applies θ_{r+1} = θ_r + 1 and remembers what it was handed."""

    def __init__(self, raises: BaseException | None = None) -> None:
        self.seen: list[ManifestInHand] = []
        self.raises = raises

    def run(self, round_: ManifestInHand):
        self.seen.append(round_)
        if self.raises is not None:
            raise self.raises
        return Applied(params=round_.base + 1, updates=len(round_.manifest.entries), wait_s=round_.wait_s)


def make_update(identity: Identity, r: int = 0) -> Update:
    payload = bytes(range(16))
    header = UpdateHeader(run_id="fake-run", round=r, peer_id=identity.peer_id, codec="fp32", numel=D, layout_hash="l" * 64,
                          base_param_hash="0" * 64, payload_sha256=sha256_hex(payload), payload_size=len(payload))
    return Update(signed=sign_update(identity, header), payload=payload, encode_s=0.0)


@pytest.fixture
def peer_identity() -> Identity:
    return Identity.generate()


@pytest.fixture
def fake() -> FakeCoordinator:
    return FakeCoordinator()


def round_exchange(fake: FakeCoordinator, identity: Identity, side: PeerExchange | None = None, *, client_mode: bool = False,
                   keys: CoordinatorKeys | None = None, timeouts: PeerTimeouts = FAST) -> tuple[RoundExchange, list[int]]:
    rejoins: list[int] = []
    exchange = RoundExchange(client=fake, keys=keys or CoordinatorKeys.of([fake.identity.peer_id]), run_id=fake.run_id,
                             peer_id=identity.peer_id, side=side or AddOne(), timeouts=timeouts, stop=threading.Event(),
                             endpoint="" if client_mode else "127.0.0.1:9", client_mode=client_mode,
                             rejoin=lambda: rejoins.append(1) or fake.join(swarm_pb2.Signed()))
    return exchange, rejoins


def peer_round(update: Update, r: int = 0) -> PeerRound:
    return PeerRound(r=r, base=torch.zeros(D), started=0.0, before=Traffic(0, 0), update=update)


# --- commit ------------------------------------------------------------------------------------


def test_commit_accepted_commits_once(fake, peer_identity):
    exchange, rejoins = round_exchange(fake, peer_identity)
    assert exchange.commit(make_update(peer_identity), 0) is None
    assert fake.counts["submit"] == 1 and rejoins == []


@pytest.mark.parametrize("refusal", [swarm_pb2.UNKNOWN_PEER, swarm_pb2.WRONG_ENDPOINT])
def test_commit_rejoins_once_then_commits_the_same_update(fake, peer_identity, refusal):
    exchange, rejoins = round_exchange(fake, peer_identity)
    update = make_update(peer_identity)
    fake.refuse("submit", refusal)
    assert exchange.commit(update, 0) is None
    assert rejoins == [1] and fake.joins == 1
    assert fake.counts["submit"] == 2 and fake.commitments[0] == [update.signed]  # the refused one was not recorded


def test_commit_refused_twice_for_rejoin_gives_up_without_resync(fake, peer_identity):
    exchange, rejoins = round_exchange(fake, peer_identity)
    fake.refuse("submit", swarm_pb2.UNKNOWN_PEER, times=2)
    assert exchange.commit(make_update(peer_identity), 0) is None  # the manifest wait tells what became of the round
    assert rejoins == [1] and fake.counts["submit"] == 2


@pytest.mark.parametrize("refusal, name", [(swarm_pb2.STALE_ROUND, "STALE_ROUND"), (swarm_pb2.WRONG_BASE, "WRONG_BASE")])
def test_commit_refused_for_state_says_resync(fake, peer_identity, refusal, name):
    exchange, rejoins = round_exchange(fake, peer_identity)
    fake.refuse("submit", refusal)
    assert exchange.commit(make_update(peer_identity), 0) == name
    assert rejoins == [] and fake.counts["submit"] == 1


@pytest.mark.parametrize("refusal", [swarm_pb2.EQUIVOCATION, swarm_pb2.BANNED])
def test_commit_fatal_refusal_stops_the_peer(fake, peer_identity, refusal):
    exchange, _ = round_exchange(fake, peer_identity)
    fake.refuse("submit", refusal, "you are out")
    with pytest.raises(PeerExit, match="you are out"):
        exchange.commit(make_update(peer_identity), 0)


def test_client_mode_push_cut_short_is_tried_again(fake, peer_identity):
    exchange, _ = round_exchange(fake, peer_identity, client_mode=True)
    update = make_update(peer_identity)
    fake.cut_push(after_chunks=0)
    assert exchange.commit(update, 0) is None
    assert fake.counts["push"] == 2 and fake.pushed == [update.payload] and fake.counts["submit"] == 1


def test_client_mode_push_broken_twice_misses_the_round(fake, peer_identity):
    exchange, _ = round_exchange(fake, peer_identity, client_mode=True)
    from tests.fakes import CutTransfer

    fake.fail("push", CutTransfer(), times=2)
    assert exchange.commit(make_update(peer_identity), 0) == PUSH_FAILED
    assert fake.counts["push"] == 2 and fake.counts["submit"] == 0  # never committed a payload nobody holds


# --- the manifest wait ---------------------------------------------------------------------------


def test_manifest_after_polls_reaches_the_mode_with_the_round(fake, peer_identity):
    side = AddOne()
    exchange, _ = round_exchange(fake, peer_identity, side)
    update = make_update(peer_identity)
    fake.on_call(lambda method, n: method == "manifest" and n == 3 and fake.publish_manifest(0))
    outcome = exchange.run(peer_round(update))
    assert isinstance(outcome, Applied) and torch.equal(outcome.params, torch.ones(D))
    assert fake.counts["manifest"] == 3
    assert fake.counts["submit"] == 2  # re-committed between the two polls without news (idempotent)
    assert [s.r for s in side.seen] == [0] and side.seen[0].manifest.round == 0


def test_the_manifest_poll_goes_out_with_the_commit_and_run_takes_its_answer(fake, peer_identity):
    """poll_ahead: the long-poll for the manifest is asked before the commit's answer is in (the
    last peer to commit gets the manifest one round trip after its commit, not two); it commits
    again between polls only once that commit is in; run() asks nothing more."""
    side = AddOne()
    exchange, _ = round_exchange(fake, peer_identity, side)
    update = make_update(peer_identity)
    published = threading.Event()
    answered_during_commit: list[bool] = []
    # The commit is answered only once the manifest is out: sequential (poll after the commit's
    # answer), that would never happen; the poll beside it polls meanwhile without committing again.
    fake.on_call(lambda method, n: method == "submit" and answered_during_commit.append(published.wait(30)))
    fake.on_call(lambda method, n: method == "manifest" and n == 3 and (fake.publish_manifest(0), published.set()))
    assert exchange.commit(update, 0, poll_ahead=True) is None
    outcome = exchange.run(peer_round(update))
    assert isinstance(outcome, Applied) and [s.r for s in side.seen] == [0]
    assert answered_during_commit == [True] and fake.counts["submit"] == 1 and fake.counts["manifest"] == 3
    # refused: the poll sent ahead ends, and run() polls afresh
    fake.refuse("submit", swarm_pb2.STALE_ROUND)
    assert exchange.commit(update, 1, poll_ahead=True) == "STALE_ROUND" and exchange.ahead is None


def test_run_finished_while_waiting(fake, peer_identity):
    exchange, _ = round_exchange(fake, peer_identity)
    fake.finished = True
    assert isinstance(exchange.run(peer_round(make_update(peer_identity))), Finished)


def test_round_closed_without_us_is_a_missed_manifest(fake, peer_identity):
    exchange, _ = round_exchange(fake, peer_identity)
    fake.round = 1  # the coordinator moved on; round 0's manifest is gone
    outcome = exchange.run(peer_round(make_update(peer_identity)))
    assert outcome == Resync("missed the manifest of round 0", wait_s=outcome.wait_s)


def test_manifest_wait_ends_at_its_deadline(fake, peer_identity):
    short = PeerTimeouts(poll=timedelta(milliseconds=10), manifest=timedelta(milliseconds=100), results=timedelta(seconds=1))
    exchange, _ = round_exchange(fake, peer_identity, timeouts=short)
    outcome = exchange.run(peer_round(make_update(peer_identity)))
    assert isinstance(outcome, Resync) and outcome.why == "missed the manifest of round 0"
    assert outcome.wait_s >= 0.1 and fake.counts["manifest"] >= 2


def test_recommit_refused_while_waiting_resyncs(fake, peer_identity):
    exchange, _ = round_exchange(fake, peer_identity)
    fake.on_call(lambda method, n: method == "manifest" and n == 1 and fake.refuse("submit", swarm_pb2.STALE_ROUND))
    assert exchange.run(peer_round(make_update(peer_identity))) == Resync("our update was refused")
    assert fake.counts["manifest"] == 1


def test_failover_mid_wait_commits_again_at_the_new_coordinator(fake, peer_identity):
    exchange, _ = round_exchange(fake, peer_identity)

    def hook(method: str, n: int) -> None:
        if method == "manifest" and n == 2:
            fake.fail_over()
        if method == "manifest" and n == 3:
            fake.publish_manifest(0)

    fake.on_call(hook)
    outcome = exchange.run(peer_round(make_update(peer_identity)))
    assert isinstance(outcome, Applied)
    submits = [i for i, (m, _) in enumerate(fake.calls) if m == "submit"]
    moved_at = [i for i, (m, _) in enumerate(fake.calls) if m == "manifest"][1]
    assert any(i > moved_at for i in submits)  # the same update committed again after the switch


def test_a_manifest_signed_by_another_key_is_fatal(fake, peer_identity):
    exchange, _ = round_exchange(fake, peer_identity, keys=CoordinatorKeys.of([Identity.generate().peer_id]))
    fake.publish_manifest(0)
    outcome = exchange.run(peer_round(make_update(peer_identity)))
    assert isinstance(outcome, Fatal) and "not the run's" in outcome.why


@pytest.mark.parametrize("raised, kind, text", [
    (CoordinatorUnavailable("nobody answers"), Unreachable, "nobody answers"),
    (PeerExit("stop now"), Fatal, "stop now"),
    (RuntimeError("boom"), Resync, "the exchange failed (RuntimeError)"),
])
def test_exceptions_of_the_mode_become_outcomes(fake, peer_identity, raised, kind, text):
    exchange, _ = round_exchange(fake, peer_identity, AddOne(raises=raised))
    fake.publish_manifest(0)
    outcome = exchange.run(peer_round(make_update(peer_identity)))
    assert isinstance(outcome, kind) and text in str(outcome)


def test_an_injected_fault_at_the_manifest_phase_resyncs(fake, peer_identity):
    side = AddOne()
    exchange, _ = round_exchange(fake, peer_identity, side)
    fake.publish_manifest(0)
    with faults.inject("manifest", 0, "error") as injection:
        outcome = exchange.run(peer_round(make_update(peer_identity)))
    assert outcome == Resync("the exchange failed (InjectedFault)") and injection.hits == 1 and side.seen == []


def test_a_slow_coordinator_only_slows_the_round(fake, peer_identity):
    exchange, _ = round_exchange(fake, peer_identity)
    fake.delay("manifest", 0.05)
    fake.publish_manifest(0)
    outcome = exchange.run(peer_round(make_update(peer_identity)))
    assert isinstance(outcome, Applied) and outcome.wait_s >= 0.05


def test_unreachable_coordinator_during_the_wait(fake, peer_identity):
    exchange, _ = round_exchange(fake, peer_identity)
    fake.fail("manifest", CoordinatorUnavailable("coordinator 1.2.3.4:5 unreachable for 120s"))
    outcome = exchange.run(peer_round(make_update(peer_identity)))
    assert outcome == Unreachable("coordinator 1.2.3.4:5 unreachable for 120s")


# --- censorship is visible -------------------------------------------------------------------------


def test_left_out_without_a_reason_is_recorded(fake, peer_identity):
    exchange, _ = round_exchange(fake, peer_identity)
    other = Identity.generate()
    other_update = make_update(other)
    fake.publish_manifest(0, [fake.entry_for(other_update.signed, _header_of(other))])
    exchange.run(peer_round(make_update(peer_identity)))
    assert exchange.left_out == [0]


def test_excluded_with_a_reason_is_not_censorship(fake, peer_identity):
    exchange, _ = round_exchange(fake, peer_identity)
    fake.publish_manifest(0, excluded={peer_identity.peer_id: "late"})
    exchange.run(peer_round(make_update(peer_identity)))
    assert exchange.left_out == []


def test_listed_is_not_censorship(fake, peer_identity):
    exchange, _ = round_exchange(fake, peer_identity)
    update = make_update(peer_identity)
    fake.publish_manifest(0, [fake.entry_for(update.signed, _header_of(peer_identity))])
    outcome = exchange.run(peer_round(update))
    assert exchange.left_out == [] and outcome.updates == 1


def _header_of(identity: Identity):
    payload = bytes(range(16))
    return UpdateHeader(run_id="fake-run", round=0, peer_id=identity.peer_id, codec="fp32", numel=D, layout_hash="l" * 64,
                        base_param_hash="0" * 64, payload_sha256=sha256_hex(payload), payload_size=len(payload))


# --- the node handles each outcome in one place ------------------------------------------------------


@pytest.fixture
def node() -> PeerNode:
    return PeerNode(PeerOptions(coordinator="127.0.0.1:1"))


def test_outcome_fatal_stops_the_peer(node, peer_identity):
    with pytest.raises(PeerExit, match="the key is wrong"):
        node.finish_round(peer_round(make_update(peer_identity)), Fatal("the key is wrong"))


def test_outcome_unreachable_says_how_to_come_back(node, peer_identity):
    with pytest.raises(PeerExit, match=r"no coordinator of the run answered: gone\. Giving up at round 3; restart with --resume"):
        node.finish_round(peer_round(make_update(peer_identity), r=3), Unreachable("gone"))


def test_outcome_finished_ends_the_run(node, peer_identity):
    node.finish_round(peer_round(make_update(peer_identity)), Finished())
    assert node.finished and node.history == []


def test_outcome_resync_resynchronises_with_its_reason(node, peer_identity, monkeypatch):
    why: list[str] = []
    monkeypatch.setattr(node, "resync", why.append)
    node.finish_round(peer_round(make_update(peer_identity)), Resync("missed the manifest of round 0"))
    assert why == ["missed the manifest of round 0"] and not node.finished


def test_node_commit_resyncs_on_a_stale_round(node, fake, peer_identity, monkeypatch):
    node.round_exchange, _ = round_exchange(fake, peer_identity)
    why: list[str] = []
    monkeypatch.setattr(node, "resync", why.append)
    fake.refuse("submit", swarm_pb2.STALE_ROUND)
    assert node.commit(make_update(peer_identity), 0) is False and why == ["update refused: STALE_ROUND"]
    fake.refuse("submit", swarm_pb2.STALE_ROUND)
    assert node.commit(make_update(peer_identity), 0, resync=False) is False and len(why) == 1
