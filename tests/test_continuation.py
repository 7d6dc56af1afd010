"""A takeover continues the round in flight (issue 22), in process: the manifest the previous active
signed is signed again in the successor's term as a checked continuation of it, the round's book
holds the peers' original commitments, and the owners' result batches signed over the earlier
manifest count as they are. The real-process run (the active SIGKILLed once the standby followed
the manifest) is tests/test_failover.py."""

from __future__ import annotations

import hashlib
import shutil
import time

import pytest

from peer.coordinator.continuation import continue_round
from peer.coordinator.state import Coordinator
from peer.run import slice_plan
from peer.run.slice_round import SliceRound
from protocol.envelope import MANIFEST_TAG, EnvelopeError, RoundManifest, open_manifest, sign_manifest
from protocol.identity import Identity
from protocol.run_state import CoordinatorKeys
from protocol.signing import open_signed, sign_body
from protocol.slice_result import SliceResult, sign_slice_results
from tests.coordinator_harness import join, make_update, serve_coordinator
from tests.helpers import tiny_run_config

ENDPOINT = "127.0.0.1:9"  # the peers' announced endpoint (not dialled: the owners would fetch from it)


def test_a_continued_manifest_is_checked_against_the_body_it_continues():
    a, b = Identity.generate(), Identity.generate()
    keys = CoordinatorKeys.of([a.peer_id, b.peer_id])
    first = RoundManifest(run_id="r", round=2, base_param_hash="B", entries=[], excluded={"x" * 32: "late"}, term=0)
    signed = sign_manifest(a, first)
    assert not {"continues", "continues_term"} & open_signed(signed, MANIFEST_TAG)[0].keys()  # nothing new in a plain manifest
    sha = hashlib.sha256(signed.body).hexdigest()
    continued = RoundManifest(run_id="r", round=2, base_param_hash="B", entries=[], excluded={"x" * 32: "late"}, term=1,
                              continues=sha, continues_term=0)
    opened = open_manifest(sign_manifest(b, continued), keys=keys, run_id="r", round_=2)
    assert (opened.term, opened.continues, opened.continues_term) == (1, sha, 0)
    for bad in (
        RoundManifest(run_id="r", round=2, base_param_hash="C", entries=[], excluded={"x" * 32: "late"}, term=1, continues=sha),
        RoundManifest(run_id="r", round=2, base_param_hash="B", entries=[], excluded={}, term=1, continues=sha),
        RoundManifest(run_id="r", round=2, base_param_hash="B", entries=[], excluded={"x" * 32: "late"}, term=0, continues=sha),
        RoundManifest(run_id="r", round=2, base_param_hash="B", entries=[], excluded={"x" * 32: "late"}, term=2, continues=sha,
                      continues_term=1),
    ):  # another base, other exclusions, not a later term, the wrong earlier term: not that body
        with pytest.raises(EnvelopeError) as refused:
            open_manifest(sign_manifest(b, bad), keys=keys, run_id="r", round_=2)
        assert refused.value.reason == "forged"
    fields, _ = open_signed(sign_manifest(b, continued), MANIFEST_TAG)
    with pytest.raises(EnvelopeError):  # not a sha256 of anything signed
        open_manifest(sign_body(b, MANIFEST_TAG, {**fields, "continues": "f" * 64}), keys=keys, run_id="r", round_=2)


@pytest.fixture
def sliced_cfg_and_keys():
    a, b = Identity.generate(), Identity.generate()
    cfg = tiny_run_config(data={"val_batches": 2, "max_corpus_bytes": 300_000}, inner={"steps": 4, "warmup_steps": 2},
                          rounds={"rounds": 3, "min_deadline_s": 2.0, "deadline_s": 30.0, "peer_timeout_s": 6.0},
                          exchange={"mode": "sliced"}, control={"coordinators": sorted([a.peer_id, b.peer_id])})
    return cfg, a, b


def test_the_successor_continues_the_round_with_the_peers_commitments_and_the_owners_results(sliced_cfg_and_keys, tmp_path):
    cfg, a, b = sliced_cfg_and_keys
    peers = [Identity.generate() for _ in range(3)]
    with serve_coordinator(cfg, identity=a, checkpoint_path=tmp_path / "a.ckpt") as served:
        active = served.coordinator
        updates = {}
        for i, p in enumerate(peers):
            assert join(served, p, ENDPOINT).accepted
            updates[p.peer_id] = make_update(served, p, seed=i)[0]
        active._snapshot()  # the state θ_0 the standby holds (it names the peers)
        for signed in updates.values():
            assert active.submit(signed, ENDPOINT).accepted
        assert active.close_round("test") is None  # sliced: the manifest is out, the owners reduce
        first = active.manifests[0]
        sha = hashlib.sha256(first.body).hexdigest()
        shutil.copy(tmp_path / "a.ckpt", tmp_path / "b.ckpt")
        keys = CoordinatorKeys.of(cfg.control.coordinators)
        old = open_manifest(first, keys=keys, run_id=cfg.run_id, round_=0)
        owning = [p for p in peers if slice_plan.owned_by(old.owners, p.peer_id)]
        batches = [sign_slice_results(p, [SliceResult(run_id=cfg.run_id, round=0, slice=j, owner=p.peer_id, manifest_sha256=sha,
                                                      result_sha256=hashlib.sha256(bytes([j])).hexdigest(), result_size=8, inputs=())
                                          for j in slice_plan.owned_by(old.owners, p.peer_id)]) for p in owning]
        # followed as the active's GetSliceResults sends them: packed, the agreeing owners' rows copied
        followed = active.exchange.rounds[0].slice_round.pack(batches)
    owner, batch = owning[0], batches[0]
    assert sum(len(f.body) for f in followed) < sum(len(f.body) for f in batches) - 32 * len(old.owners)

    successor = Coordinator(cfg, b, checkpoint_path=tmp_path / "b.ckpt", term=1)
    assert successor.round == 0 and successor.param_hash == old.base_param_hash
    assert continue_round(successor, first, followed) == ""
    again = open_manifest(successor.manifests[0], keys=keys, run_id=cfg.run_id, round_=0)
    assert (again.term, again.continues, again.continues_term) == (1, sha, 0)
    assert again.entries == old.entries and again.owners == old.owners  # the peers' own signed headers, the same draw
    book = successor.book
    assert book.closed and sorted(book.commitments) == sorted(updates)
    assert {p: c.signed.SerializeToString() for p, c in book.commitments.items()} == \
        {p: s.SerializeToString() for p, s in updates.items()}
    # Peers that move to it commit their update again: taken as the one it holds, not a new one.
    for signed in updates.values():
        assert successor.submit(signed, ENDPOINT).reason == "already committed"
    # The owner's batch, signed over the earlier manifest, counts (its second submission is the same batch) ...
    state = successor.exchange.rounds[0]
    assert sorted(state.batches) == sorted(p.peer_id for p in owning)  # every followed batch rebuilt and counted
    assert successor.exchange.submit_result(batch).reason == "already submitted"
    # ... because every node binds the continued round's results to the body it continues.
    assert SliceRound.of(0, again, successor.manifests[0], {}).manifest_sha256 == sha
    # A second takeover (term 2) of the same round stays bound to the first body.
    third = Coordinator(cfg, a, checkpoint_path=tmp_path / "b.ckpt", term=2)
    assert continue_round(third, successor.manifests[0], [batch]) == ""
    assert open_manifest(third.manifests[0], keys=keys, run_id=cfg.run_id, round_=0).continues == sha
    assert owner.peer_id in third.exchange.rounds[0].batches
    with third.lock:  # results not final yet: it waits for the other owners (or its result timeout)
        assert third.exchange.ready_to_apply(time.monotonic()) == (False, "")
    # Results the previous active had made final: its peers gathered them there (they may be in the
    # next round already), so the successor applies as soon as it has gathered, awaiting nobody.
    fourth = Coordinator(cfg, b, checkpoint_path=tmp_path / "b.ckpt", term=3)
    assert continue_round(fourth, third.manifests[0], [batch], final=True) == ""
    with fourth.lock:
        assert fourth.exchange.ready_to_apply(time.monotonic()) == (True, "every live peer gathered")


def test_a_round_that_cannot_be_continued_is_reopened(sliced_cfg_and_keys, tmp_path):
    cfg, a, b = sliced_cfg_and_keys
    successor = Coordinator(cfg, b, checkpoint_path=tmp_path / "b.ckpt", term=1)
    keys_term = RoundManifest(run_id=cfg.run_id, round=0, base_param_hash=successor.param_hash, entries=[], excluded={}, term=1)
    other_base = RoundManifest(run_id=cfg.run_id, round=0, base_param_hash="0" * 64, entries=[], excluded={}, term=0)
    assert "not based on" in continue_round(successor, sign_manifest(a, keys_term))  # not an earlier term
    assert "not based on" in continue_round(successor, sign_manifest(a, other_base))
    assert "does not hold" in continue_round(successor, sign_manifest(Identity.generate(), other_base))  # not a run key
    assert not successor.book.closed and successor.manifests == {}
    all_to_all = Coordinator(tiny_run_config(exchange={"mode": "all-to-all"}, control={"coordinators": [a.peer_id, b.peer_id]}), b, term=1)
    assert "holds the updates" in continue_round(all_to_all, sign_manifest(a, other_base))


def test_a_standby_heartbeat_names_the_manifest_it_follows(sliced_cfg_and_keys):
    cfg, a, b = sliced_cfg_and_keys
    c = Coordinator(cfg, a)
    assert c.followers.heard(b.peer_id, endpoint=ENDPOINT, holding_round=0, holding_hash=c.param_hash, manifest_round=0)
    assert c.status()["coordinator"]["standbys"][0]["manifest_round"] == 0
