"""The coordinator's side of a sliced round, in process: who gathered, and when a round is applied.

"Gathered" is its own signed message (ReportGathered, tag swarmloco/gathered/v1): a peer says it
has gathered round r and reported what it found false, and the coordinator applies the round once
every live listed peer has (or the result timeout has passed). GetSliceResults is a read only.
"""

from __future__ import annotations

import hashlib
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import grpc
import pytest
import torch

from peer.run.config import RunConfig
from protocol.accounting import PEER_HEADER
from protocol.envelope import GATHERED_TAG
from protocol.identity import Identity
from protocol.rpc_errors import refusal_of
from protocol.signing import sign_body
from protocol.slice_result import SliceResult, sign_slice_results, signed_to_text
from protocol.wire import swarm_pb2
from tests.helpers import tiny_run_config
from tests.coordinator_harness import Served, join, make_update, serve_coordinator

RESULT_TIMEOUT_S = 30.0


def sliced_config() -> RunConfig:
    return tiny_run_config(
        data={"val_batches": 2, "max_corpus_bytes": 300_000},
        rounds={"rounds": 3, "deadline_s": 30.0, "peer_timeout_s": 60.0},
        exchange={"mode": "sliced", "slices": 4, "replicas": 2, "result_timeout_s": RESULT_TIMEOUT_S, "result_grace_s": 1.0},
    )


def sliced_side(served: Served):
    """The coordinator's sliced-exchange object (its slice rounds by round number)."""
    return served.coordinator.exchange


@dataclass
class FinalRound:
    served: Served
    round: int
    listed: list[Identity]  # committed and in the manifest
    bystander: Identity  # joined, not listed

    @property
    def state(self):
        return sliced_side(self.served).rounds[self.round]


@contextmanager
def final_sliced_round() -> Iterator[FinalRound]:
    """Two listed peers (a, b) whose owners' results are all in and final; c joined and stayed out."""
    with serve_coordinator(sliced_config(), generous_limits=True) as served:
        c = served.coordinator
        a, b, bystander = Identity.generate(), Identity.generate(), Identity.generate()
        for i, peer in enumerate((a, b)):
            assert join(served, peer, f"127.0.0.1:{9 + i}").accepted
            signed, _, _ = make_update(served, peer, seed=i)
            reply = served.stub.SubmitCommitment(swarm_pb2.CommitRequest(header=signed, endpoint=f"127.0.0.1:{9 + i}"), timeout=10)
            assert reply.accepted, reply.reason
        assert join(served, bystander).accepted
        assert c.close_round("test") is None and c.book.closed
        r = c.book.round
        manifest_sha = hashlib.sha256(c.manifests[r].body).hexdigest()
        state = sliced_side(served).rounds[r]
        for owner in (a, b):
            assert served.stub.SubmitSliceResult(owner_batch(c, state, owner, manifest_sha), timeout=10).accepted
        with c.lock:
            assert sliced_side(served).should_finalize(time.monotonic()) == (True, "every owner reported")
            sliced_side(served).finalize()
        yield FinalRound(served, r, [a, b], bystander)


def owner_batch(c, state, owner: Identity, manifest_sha: str, result_sha256: str = "ab" * 32) -> swarm_pb2.Signed:
    """`owner`'s signed batch of (made-up) results for every slice it owns in the open sliced round."""
    rnd = state.slice_round
    return sign_slice_results(owner, [
        SliceResult(run_id=c.cfg.run_id, round=rnd.round, slice=j, owner=owner.peer_id, manifest_sha256=manifest_sha,
                    result_sha256=result_sha256, result_size=8, inputs=tuple(rnd.peer_ids), excluded={})
        for j, owners in enumerate(rnd.owners) if owner.peer_id in owners])


def gathered_report(identity: Identity, run_id: str, round_: int, **fields) -> swarm_pb2.Signed:
    body = {"run_id": run_id, "round": round_, "peer_id": identity.peer_id, "timestamp": time.time(), **fields}
    return sign_body(identity, GATHERED_TAG, body)


def gathered_fields(c, identity: Identity, round_: int) -> dict:
    """A gathered report's body as the servicer hands it on once its signature verified."""
    return {"run_id": c.cfg.run_id, "round": round_, "peer_id": identity.peer_id, "timestamp": time.time()}


def test_reading_the_results_marks_nobody_gathered():
    with final_sliced_round() as fr:
        for peer in fr.listed:
            # The old side effect's trigger: a named caller's until_applied long-poll on a final round.
            reply = fr.served.stub.GetSliceResults(swarm_pb2.SliceResultsRequest(round=fr.round, wait_s=0.0, until_applied=True),
                                                   metadata=((PEER_HEADER, peer.peer_id),), timeout=10)
            assert reply.ready and not reply.applied and reply.results == []  # the peer has them: not sent again
            final = fr.served.stub.GetSliceResults(swarm_pb2.SliceResultsRequest(round=fr.round, wait_s=0.0),
                                                   metadata=((PEER_HEADER, peer.peer_id),), timeout=10)
            assert final.ready and len(final.results) == 2  # one signed batch per owner, covering its slices
            opened = sliced_side(fr.served).slices.open_results(fr.state.slice_round, list(final.results))
            assert sum(map(len, opened.values())) == sum(map(len, fr.state.slice_round.owners)) == 8
        assert fr.state.gathered == set()
        assert fr.served.status()["exchange"] == {"mode": "sliced", "slices": fr.served.coordinator.math.layout.num_slices, "replicas": 2}
        with fr.served.coordinator.lock:
            assert sliced_side(fr.served).ready_to_apply(fr.state.final_at + 1.0) == (False, "")


def test_report_gathered_counts_the_signer_only_and_refuses_bad_reports():
    with final_sliced_round() as fr:
        served, c = fr.served, fr.served.coordinator
        a, b = fr.listed
        run = c.cfg.run_id

        def refused(signed: swarm_pb2.Signed) -> int:
            reply = served.stub.ReportGathered(signed, timeout=10)
            assert not reply.accepted
            return reply.refusal

        # a says b gathered: the body must name its signer
        assert refused(gathered_report(a, run, fr.round, peer_id=b.peer_id)) == swarm_pb2.BAD_SIGNATURE
        assert refused(gathered_report(a, run, fr.round + 1)) == swarm_pb2.STALE_ROUND
        assert refused(gathered_report(a, run, fr.round - 1)) == swarm_pb2.STALE_ROUND
        assert refused(gathered_report(a, "another-run", fr.round)) == swarm_pb2.WRONG_RUN
        assert refused(gathered_report(a, run, str(fr.round))) == swarm_pb2.MALFORMED
        assert refused(gathered_report(Identity.generate(), run, fr.round)) == swarm_pb2.UNKNOWN_PEER
        good = gathered_report(a, run, fr.round)
        for tampered in (swarm_pb2.Signed(body=good.body, signature=bytes(64), public_key=good.public_key),
                         swarm_pb2.Signed(body=good.body, signature=good.signature, public_key=b.public_key)):
            with pytest.raises(grpc.RpcError) as err:
                served.stub.ReportGathered(tampered, timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED and refusal_of(err.value) == swarm_pb2.BAD_SIGNATURE
        assert fr.state.gathered == set()

        assert served.stub.ReportGathered(good, timeout=10).accepted
        assert served.stub.ReportGathered(good, timeout=10).reason == "already reported"  # idempotent
        assert fr.state.gathered == {a.peer_id}
        with c.lock:
            assert sliced_side(served).ready_to_apply(fr.state.final_at + 1.0) == (False, "")
        assert served.stub.ReportGathered(gathered_report(b, run, fr.round), timeout=10).accepted
        with c.lock:
            assert sliced_side(served).ready_to_apply(fr.state.final_at + 1.0) == (True, "every live peer gathered")
        assert served.rejections().get("internal-error", 0) == 0


def test_ready_to_apply_waits_for_live_peers_until_the_result_timeout():
    with final_sliced_round() as fr:
        c, side = fr.served.coordinator, sliced_side(fr.served)
        a, b = fr.listed
        final_at = fr.state.final_at
        with c.lock:
            assert side.report_gathered(gathered_fields(c, a, fr.round), a.peer_id).accepted
            # b has not gathered: wait, up to the result timeout counted from when the results went final
            assert side.ready_to_apply(final_at + RESULT_TIMEOUT_S - 0.1) == (False, "")
            assert side.ready_to_apply(final_at + RESULT_TIMEOUT_S) == (True, "1 peer(s) did not gather within 30s")
            # a peer that is gone is not waited for; a bystander's report changes nothing
            assert side.report_gathered(gathered_fields(c, fr.bystander, fr.round), fr.bystander.peer_id).accepted
            assert side.ready_to_apply(final_at + 1.0) == (False, "")
            c.registry.get(b.peer_id).state = "gone"
            assert side.ready_to_apply(final_at + 1.0) == (True, "every live peer gathered")


def test_a_gathered_report_before_the_results_are_final_is_stale():
    with serve_coordinator(sliced_config(), generous_limits=True) as served:
        c, a = served.coordinator, Identity.generate()
        assert join(served, a, "127.0.0.1:9").accepted
        signed, _, _ = make_update(served, a)
        assert served.stub.SubmitCommitment(swarm_pb2.CommitRequest(header=signed, endpoint="127.0.0.1:9"), timeout=10).accepted
        r = c.round
        reply = served.stub.ReportGathered(gathered_report(a, c.cfg.run_id, r), timeout=10)
        assert not reply.accepted and reply.refusal == swarm_pb2.STALE_ROUND  # the commit phase is still open
        c.close_round("test")
        reply = served.stub.ReportGathered(gathered_report(a, c.cfg.run_id, r), timeout=10)
        assert not reply.accepted and reply.refusal == swarm_pb2.STALE_ROUND  # reducing: results not final yet
        assert sliced_side(served).rounds[r].gathered == set()


def test_every_mode_has_a_coordinator_side_and_all_to_all_refuses_the_slice_rpcs():
    from peer.exchange.all_to_all_coordinator import AllToAllCoordinator
    from peer.exchange.coordinator_side import NO_SLICE_RESULTS
    from peer.exchange.modes import MODES
    from peer.exchange.sliced_coordinator import SlicedCoordinator

    assert {name: mode.coordinator for name, mode in MODES.items()} == {"sliced": SlicedCoordinator, "all-to-all": AllToAllCoordinator}
    cfg = tiny_run_config(data={"val_batches": 2, "max_corpus_bytes": 300_000}, exchange={"mode": "all-to-all"})
    with serve_coordinator(cfg, generous_limits=True) as served:
        a = Identity.generate()
        assert join(served, a, "127.0.0.1:9").accepted
        assert isinstance(served.coordinator.exchange, AllToAllCoordinator)
        calls = [lambda: served.stub.SubmitSliceResult(swarm_pb2.Signed(), timeout=10),
                 lambda: served.stub.GetSliceResults(swarm_pb2.SliceResultsRequest(round=0, wait_s=1.0), timeout=10),
                 lambda: served.stub.ReportEvidence(swarm_pb2.Signed(), timeout=10),
                 lambda: served.stub.ReportGathered(gathered_report(a, served.coordinator.cfg.run_id, 0), timeout=10)]
        for call in calls:
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and err.value.details() == NO_SLICE_RESULTS
        assert served.status()["exchange"] == {"mode": "all-to-all", "slices": None, "replicas": None}


@contextmanager
def reducing_round() -> Iterator[tuple[Served, object, list[Identity], str]]:
    """Two listed peers, the manifest out, no results yet: (served, its round state, [a, b], manifest sha)."""
    with serve_coordinator(sliced_config(), generous_limits=True) as served:
        c = served.coordinator
        a, b = Identity.generate(), Identity.generate()
        for i, peer in enumerate((a, b)):
            assert join(served, peer, f"127.0.0.1:{9 + i}").accepted
            signed, _, _ = make_update(served, peer, seed=i)
            assert served.stub.SubmitCommitment(swarm_pb2.CommitRequest(header=signed, endpoint=f"127.0.0.1:{9 + i}"), timeout=10).accepted
        assert c.close_round("test") is None and c.book.closed
        state = sliced_side(served).rounds[c.book.round]
        yield served, state, [a, b], hashlib.sha256(c.manifests[c.book.round].body).hexdigest()


def test_an_owner_that_never_sends_its_batch_is_covered_by_the_other_owners_after_the_grace():
    with reducing_round() as (served, state, (a, b), manifest_sha):
        c, side = served.coordinator, sliced_side(served)
        assert all(set(owners) == {a.peer_id, b.peer_id} for owners in state.slice_round.owners)  # 2 servers, r = 2
        assert served.stub.SubmitSliceResult(owner_batch(c, state, a, manifest_sha), timeout=10).accepted
        # b died mid-round: every slice has a's result, so the round closes after the grace, not the timeout
        with c.lock:
            assert state.covered_at is not None and state.owners_missing() == 1
            assert side.should_finalize(state.covered_at + 0.5) == (False, "")
            assert side.should_finalize(state.covered_at + 1.0) == (True, "every slice has a result; 1 owner(s) sent none")


def test_a_second_different_batch_from_one_owner_is_equivocation_and_bans_it():
    with reducing_round() as (served, state, (a, b), manifest_sha):
        c = served.coordinator
        first = owner_batch(c, state, a, manifest_sha)
        assert served.stub.SubmitSliceResult(first, timeout=10).accepted
        again = served.stub.SubmitSliceResult(first, timeout=10)
        assert again.accepted and again.reason == "already submitted"  # idempotent
        second = served.stub.SubmitSliceResult(owner_batch(c, state, a, manifest_sha, result_sha256="cd" * 32), timeout=10)
        assert not second.accepted and second.refusal == swarm_pb2.EQUIVOCATION
        record = c.registry.get(a.peer_id)
        assert record.banned_reason and record.evidence[0]["kind"] == "result-equivocation"
        assert {record.evidence[0]["first_result"], record.evidence[0]["second_result"]} == {
            signed_to_text(first), signed_to_text(owner_batch(c, state, a, manifest_sha, result_sha256="cd" * 32))}
        assert list(state.batches) == [a.peer_id]  # the first batch stands; b's still counts when it comes
        assert served.stub.SubmitSliceResult(owner_batch(c, state, b, manifest_sha), timeout=10).accepted


def test_an_applied_round_is_announced_once_its_hash_is_set():
    """A long-poll on the server's loop reads the state without the lock when woken: the round's
    applied hash must be set when the notification that wakes it goes out, or it parks until
    some later news (on 8 WAN peers: 2.5 s late)."""
    from peer.exchange.coordinator_side import Aggregated
    from peer.run.slice_round import GatherOutcome

    with final_sliced_round() as fr:
        c, side = fr.served.coordinator, sliced_side(fr.served)
        seen: list[str] = []
        c.round_closed.listen(lambda: seen.append(fr.state.applied_hash))
        aggregated = Aggregated(params=torch.zeros(1), used=[], detail=([], GatherOutcome(combined=torch.zeros(1))))
        with c.lock:
            side.applied(c.book, aggregated, "cd" * 32)
        assert seen and seen[-1] == "cd" * 32


def test_the_applied_reply_carries_the_signed_state_of_the_next_round():
    """A peer checks θ_{r+1} against the coordinator's signed state of round r + 1: the applied
    long-poll brings it (no GetRunInfo round trip after every round); the final-results reply does not."""
    from peer.exchange.coordinator_side import Aggregated
    from peer.run.slice_round import GatherOutcome

    with final_sliced_round() as fr:
        c, side, stub = fr.served.coordinator, sliced_side(fr.served), fr.served.stub
        aggregated = Aggregated(params=torch.zeros(1), used=[], detail=([], GatherOutcome(combined=torch.zeros(1))))
        with c.lock:
            book = c.book
            c.open.round += 1  # as the clock's _advance does before it signs round r + 1's state
            signed = c.sign_state()
            side.applied(book, aggregated, "cd" * 32)
        applied = stub.GetSliceResults(swarm_pb2.SliceResultsRequest(round=fr.round, wait_s=0.0, until_applied=True), timeout=10)
        assert applied.applied and applied.param_hash == "cd" * 32 and applied.run_state == signed
        final = stub.GetSliceResults(swarm_pb2.SliceResultsRequest(round=fr.round, wait_s=0.0), timeout=10)
        assert final.ready and not final.HasField("run_state")
