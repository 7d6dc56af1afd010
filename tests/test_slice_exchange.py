"""The sliced exchange engine over real gRPC on loopback: owners reduce, everyone gathers,
a lying owner is outvoted by recomputation, colluding owners are caught by a spot check.

Each simulated peer is a real PayloadServicer server holding its own update's slices; no
coordinator is involved here (the real-process tests cover it): the manifest is signed by a
throwaway coordinator identity exactly as the coordinator signs it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from peer.cli.simulate_slices import false_result
from peer.run import slice_exchange, slice_plan
from peer.run.config import RunConfig
from peer.run.round_math import RoundMath
from peer.run.slice_exchange import SliceExchange
from peer.run.slice_round import sliced_manifest
from protocol.accounting import ByteCounter
from protocol.envelope import ManifestEntry, build_update_header, sign_manifest, sign_update, signed_to_json
from protocol.identity import Identity, peer_id_of
from protocol.payload_fetch import ChannelPool
from protocol.payload_service import PayloadServicer, serve_payloads
from protocol.payload_store import PayloadStore, StoredPayload
from protocol.slice_result import sign_slice_results

NUMEL = 4096
LAYOUT = "test-layout"


class Node:
    def __init__(self, cfg: RunConfig) -> None:
        self.identity = Identity.generate()
        self.math = RoundMath(cfg, NUMEL)
        self.counter = ByteCounter(self.identity.peer_id)
        self.store = PayloadStore()
        servicer = PayloadServicer(self.store, verify_header=lambda s: self.verify_header(s, None), accept_pushes=False,
                                   accept_slice_pushes=True,  # as a peer's: owners trade slices (SwapSlices)
                                   own_peer_id=self.identity.peer_id)
        self.server, port = serve_payloads(servicer, self.counter, host="127.0.0.1", port=0)
        self.endpoint = f"127.0.0.1:{port}"
        self.pool = ChannelPool(self.counter)
        self.workers = ThreadPoolExecutor(8)
        self.exchange = SliceExchange(self.math, self.pool, self.store, self.workers, own_endpoint=self.endpoint, identity=self.identity)

    def verify_header(self, signed, round_):
        return self.math.open_update(signed, round_=round_, layout_hash=LAYOUT)

    def close(self) -> None:
        self.exchange.close()
        self.pool.close()
        self.workers.shutdown(wait=False)
        self.server.stop(0)


@pytest.fixture
def slice_nodes():
    cfg = RunConfig.from_dict({"run_id": "slices", "exchange": {"mode": "sliced", "slices": 8, "replicas": 2},
                               "aggregation": {"name": "median"}})
    nodes = [Node(cfg) for _ in range(4)]
    yield cfg, nodes
    for node in nodes:
        node.close()


def make_round(cfg: RunConfig, nodes: list[Node], r: int = 0, nan_author: int | None = None):
    """Every node encodes an update and serves its slices; a coordinator signs the manifest."""
    gen = torch.Generator().manual_seed(7)
    updates, entries = {}, []
    for i, node in enumerate(nodes):
        delta = torch.randn(NUMEL, generator=gen) * (i + 1)
        payload = node.math.encode(delta, r)
        if nan_author == i:  # a NaN in slice 5 only (fp16 bytes 0x7e00 = NaN)
            parts = node.math.sliced_codec.split(payload)
            bad = bytearray(parts[5])
            bad[4:6] = b"\x00\x7e"
            parts[5] = bytes(bad)
            payload = b"".join(parts)
        slices = node.exchange.slice_hashes(payload)
        header = build_update_header(run_id=cfg.run_id, round_=r, peer_id=node.identity.peer_id, codec=cfg.compression.codec,
                                     numel=NUMEL, layout_hash=LAYOUT, base_param_hash="0" * 64, payload=payload, slices=slices)
        signed = sign_update(node.identity, header)
        node.store.put(StoredPayload(header, signed, payload), verified=True)
        node.exchange.serve_slices(header, payload)
        updates[node.identity.peer_id] = node.math.sliced_codec.decode(payload, NUMEL)
        entries.append(ManifestEntry(peer_id=header.peer_id, payload_sha256=header.payload_sha256, payload_size=header.payload_size,
                                     header=signed_to_json(signed), holders=[node.endpoint], serves=True))
    manifest = sliced_manifest(nodes[0].math, r, entries, base_param_hash="0" * 64)
    entries = manifest.entries
    # 8 slices, 2 distinct owners each, spread evenly: every one of the 4 servers owns 8·2/4 = 4.
    assert all(len(set(owners)) == 2 for owners in manifest.owners) and len(manifest.owners) == 8
    assert sorted(Counter(p for owners in manifest.owners for p in owners).values()) == [4, 4, 4, 4]
    signed_manifest = sign_manifest(Identity.generate(), manifest)
    rounds = [node.exchange.open_round(manifest, signed_manifest, r, node.verify_header) for node in nodes]
    assert all(rnd.owners == manifest.owners for rnd in rounds)  # every node reads the same draw
    return rounds, [updates[e.peer_id] for e in entries]


def each_at_once(nodes, rounds, work):
    """work(node, rnd) on every node at once, as peers run a phase (an owner awaits the trades
    other owners open with it: one by one, each would wait for the others); -> their results."""
    with ThreadPoolExecutor(len(nodes)) as pool:
        return list(pool.map(work, nodes, rounds))


def reduce_all(nodes, rounds):
    """Every owner's signed batch (one per node: all 4 own slices here)."""
    return [signed for batch in each_at_once(nodes, rounds, lambda node, rnd: node.exchange.reduce_owned(rnd)) for signed in batch]


def lying_batch(nodes, rounds, owner_id: str, lie_about: set[int]):
    """`owner_id`'s batch with false results for the slices in `lie_about`, honest for the rest."""
    i = next(k for k, n in enumerate(nodes) if n.identity.peer_id == owner_id)
    node = nodes[i]
    results = [false_result(node.math, node.store, res.slice, data, res) if res.slice in lie_about else res
               for data, res in node.exchange.reduce_owned_slices(rounds[i])]
    return sign_slice_results(node.identity, results)


def test_every_node_gathers_the_same_aggregate_as_the_whole_vector_math(slice_nodes):
    cfg, nodes = slice_nodes
    rounds, updates = make_round(cfg, nodes)
    results = reduce_all(nodes, rounds)
    assert len(results) == 4  # one signed batch per owner
    opened = nodes[0].exchange.open_results(rounds[0], results)
    assert sorted(opened) == list(range(8)) and all(len(opened[j]) == 2 for j in range(8))  # both owners of every slice
    outcomes = [node.exchange.gather(rnd, results) for node, rnd in zip(nodes, rounds)]
    for outcome in outcomes[1:]:
        assert torch.equal(outcome.combined, outcomes[0].combined)
    assert all(not o.liars and not o.recomputed for o in outcomes)
    for node, rnd in zip(nodes, rounds):  # each owner timed its own slices' reduces (peer/run/thread_clock.py)
        times = node.exchange.last_reduce_times
        assert times["calls"] == len(slice_plan.owned_by(rnd.owners, node.identity.peer_id)) == 4
        assert 0 < times["cpu_s"] <= times["wall_s"] + 0.01 and (times["core_wait_s"] is None or times["core_wait_s"] >= 0)
    # The reference, computed here from the decoded rows: per coordinate the mean of the 2 middle
    # of 4 values (the median rule's even-n choice), in the slice results' fp16 format.
    expected = torch.stack(updates).sort(dim=0).values[1:3].double().mean(dim=0).float().half().float()
    assert torch.equal(outcomes[0].combined, expected)
    whole = torch.zeros(NUMEL)
    RoundMath(cfg, NUMEL).apply(whole, updates, round_=0)  # the simulator's sliced path: same bytes
    stepped = torch.zeros(NUMEL)
    RoundMath(cfg, NUMEL).step_with_aggregate(stepped, outcomes[0].combined)
    assert torch.equal(stepped, whole)


def test_a_lone_lying_owner_is_outvoted_and_named(slice_nodes):
    cfg, nodes = slice_nodes
    rounds, _ = make_round(cfg, nodes)
    honest = reduce_all(nodes, rounds)
    clean = nodes[0].exchange.gather(rounds[0], honest).combined
    # The first owner of slice 3 signs a different result for it (its honest bytes, shifted).
    liar_id = rounds[0].owners[3][0]
    lie = lying_batch(nodes, rounds, liar_id, {3})
    tampered = [s for s in honest if _owner(s) != liar_id] + [lie]
    for node, rnd in zip(nodes, rounds):
        outcome = node.exchange.gather(rnd, tampered)
        assert torch.equal(outcome.combined, clean)  # the lie changed nobody's parameters
        assert [(lie.signature, 3)] == [(s.signature, res.slice) for s, _, res in outcome.liars]  # its batch: the evidence
        assert 3 in outcome.recomputed


def test_colluding_owners_are_caught_by_a_spot_check(slice_nodes):
    cfg, nodes = slice_nodes
    rounds, _ = make_round(cfg, nodes)
    honest = reduce_all(nodes, rounds)
    clean = nodes[0].exchange.gather(rounds[0], honest).combined
    owners = rounds[0].owners[6]
    checker_index = next(i for i, n in enumerate(nodes) if n.identity.peer_id not in owners)
    lies = [lying_batch(nodes, rounds, owner_id, {6}) for owner_id in owners]  # both owners of slice 6: the same false bytes
    tampered = [s for s in honest if _owner(s) not in owners] + lies
    checker = nodes[checker_index]
    unchecked = checker.exchange.gather(rounds[checker_index], tampered, spot_checks=0)
    assert not torch.equal(unchecked.combined, clean) and not unchecked.liars  # agreeing liars pass unchecked
    checked = checker.exchange.gather(rounds[checker_index], tampered, spot_checks=8, rng=random.Random(0))
    assert torch.equal(checked.combined, clean)
    assert sorted(s.signature for s, *_ in checked.liars) == sorted(s.signature for s in lies)


def test_a_non_finite_slice_is_excluded_from_that_slice_only(slice_nodes):
    cfg, nodes = slice_nodes
    rounds, _ = make_round(cfg, nodes, nan_author=2)
    outcome = nodes[0].exchange.gather(rounds[0], reduce_all(nodes, rounds))
    bad = nodes[2].identity.peer_id
    assert outcome.excluded[5] == {bad: "non-finite"}
    assert all(bad not in outcome.excluded[j] for j in range(8) if j != 5)
    assert bool(torch.isfinite(outcome.combined).all())


def test_a_vanished_owner_is_covered_and_a_slice_nobody_reduced_is_recomputed(slice_nodes):
    cfg, nodes = slice_nodes
    rounds, _ = make_round(cfg, nodes)
    results = reduce_all(nodes, rounds)
    clean = nodes[0].exchange.gather(rounds[0], results).combined
    gone = rounds[0].owners[1][0]
    survivors = [s for s in results if _owner(s) != gone]  # its batch never came: every slice has its other owner
    checker = next(i for i, n in enumerate(nodes) if n.identity.peer_id != gone)
    outcome = nodes[checker].exchange.gather(rounds[checker], survivors)
    assert torch.equal(outcome.combined, clean) and outcome.recomputed == []
    silent = set(rounds[0].owners[2])  # and neither owner of slice 2 sent a batch: recomputed
    survivors = [s for s in results if _owner(s) not in silent]
    checker = next(i for i, n in enumerate(nodes) if n.identity.peer_id not in silent)
    outcome = nodes[checker].exchange.gather(rounds[checker], survivors)
    assert torch.equal(outcome.combined, clean)
    assert 2 in outcome.recomputed


def test_an_owner_that_signed_and_then_vanished_costs_a_gather_nothing_but_the_fallback(slice_nodes, monkeypatch):
    """A gather asks one owner for a whole group of slices and a spot check's inputs (slice_plan.cover).
    If that owner signed its results and then went away, every slice it was asked for comes from
    its co-owner and the spot check's inputs from their authors: the same aggregate, the spot
    check held, nobody named a liar."""
    cfg, nodes = slice_nodes
    rounds, _ = make_round(cfg, nodes)
    batches = reduce_all(nodes, rounds)
    clean = nodes[0].exchange.gather(rounds[0], batches, spot_checks=0).combined
    checker = 0
    me = nodes[checker].identity.peer_id
    spot = [j for j, owners in enumerate(rounds[checker].owners) if me not in owners][:1]
    gone = next(i for i, n in enumerate(nodes) if n.identity.peer_id in rounds[checker].owners[spot[0]])
    nodes[gone].server.stop(0).wait(5)  # both owners of the spot slice signed; this one serves nothing now
    gone_endpoint = nodes[gone].endpoint

    class PickTheVanished:  # the cover's draw picks it wherever it may
        def choice(self, seq):
            return gone_endpoint if gone_endpoint in seq else seq[0]

    monkeypatch.setattr(slice_exchange.random, "SystemRandom", PickTheVanished)
    outcome = nodes[checker].exchange.gather(rounds[checker], batches, spot=spot)
    assert gone_endpoint in nodes[checker].counter.calls_to("FetchPayload")  # it was asked, and the fallback covered it
    assert torch.equal(outcome.combined, clean)
    assert outcome.spot_checked == outcome.recomputed == spot and not outcome.liars
    assert all(not excluded for excluded in outcome.excluded.values())


def _owner(signed) -> str:
    return peer_id_of(signed.public_key)  # a batch's owner is its signing key


def test_one_stream_per_counterpart_per_phase(slice_nodes):
    """Reduce-scatter: every two owners trade in ONE SwapSlices stream, opened by one of them
    (slice_plan.swap_partners): each sends the other the slices of its update the other owns, and
    nothing is fetched; all-gather: the same stream then carries back, once reduced, each
    aggregated slice the other gathers from us (slice_plan.result_routes), so the gather opens no
    stream at all (issue 24). Counted by each node's transport ledger (client and served side);
    the bytes of those streams are the slices, their proofs, the results and a few bytes an item."""
    cfg, nodes = slice_nodes
    rounds, _ = make_round(cfg, nodes)
    endpoint_of = {node.identity.peer_id: node.endpoint for node in nodes}
    befores = [node.counter.total() for node in nodes]
    batches = reduce_all(nodes, rounds)
    assert all(node.store.results.wait_inbound(rnd.round, 10.0) for node, rnd in zip(nodes, rounds))  # every result in
    size_of = {res.slice: res.result_size for signed in batches for res in nodes[0].exchange.open_batch(rounds[0], signed)[0]}
    opened = Counter()
    for node, rnd, before in zip(nodes, rounds, befores):
        me = node.identity.peer_id
        opens, awaits = slice_plan.swap_partners(rnd.owners, rnd.peer_ids, me)
        assert len(opens) + len(awaits) == 3 and len(opens) in (1, 2)  # 4 owners: a tournament
        assert node.counter.calls_to("SwapSlices") == {endpoint_of[p]: 1 for p in opens}
        assert node.counter.calls_to("served:SwapSlices") == {p: 1 for p in awaits}  # the served side names the caller's peer_id
        assert node.counter.calls_to("FetchPayload") == {}  # every input came in a trade: nothing fetched
        opened.update(frozenset((me, p)) for p in opens)
        received = node.counter.total().received - before.received
        sent = node.counter.total().sent - before.sent
        owned = slice_plan.owned_by(rnd.owners, me)
        data = sum(len(node.store.get_slice(rnd.headers[p].root_bytes(), j).payload) for j in owned for p in rnd.peer_ids)
        own = sum(len(node.store.get_slice(rnd.headers[me].root_bytes(), j).payload) for j in owned)
        mine = [j for p in rnd.peer_ids if p != me for j in slice_plan.owned_by(rnd.owners, p)]  # our slices others own
        ours = sum(len(node.store.get_slice(rnd.headers[me].root_bytes(), j).payload) for j in mine)
        # A slice answered: at most its whole proof (log2 8 = 3 siblings of 34 B framed) and ~12 B of
        # framing; a pushed one: its whole proof and ~12 B; a stream's request or header: ~600 B.
        # the aggregated slices that ride back: each slice we do not own from one of its owners
        send, receive = slice_plan.result_routes(rnd.owners, rnd.peer_ids, me)
        results_in = sum(size_of[j] for js in receive.values() for j in js)
        results_out = sum(size_of[j] for js in send.values() for j in js)
        assert results_in == sum(size_of[j] for j in range(len(rnd.owners)) if j not in owned)  # each exactly once
        per_slice, authors, per_result = 3 * 34 + 12, len(rnd.peer_ids) - 1, 24
        assert 0 <= received - (data - own) - results_in <= len(owned) * authors * per_slice + 3 * 600 + 8 * per_result
        assert 0 <= sent - ours - results_out <= len(mine) * per_slice + 3 * 600 + 8 * per_result
    assert sorted(opened.values()) == [1] * 6  # 4 owners: 6 pairs, each traded in one stream
    for node, rnd in zip(nodes, rounds):
        node.counter.round = 1  # the gather's calls, apart
        before = node.counter.calls_to("FetchPayload")
        outcome = node.exchange.gather(rnd, batches, spot_checks=0)
        assert not outcome.recomputed and not outcome.liars
        assert node.counter.calls_to("FetchPayload") == before  # every result came over the trades: no stream of its own
    combined = [node.exchange.gather(rnd, batches, spot_checks=0).combined for node, rnd in zip(nodes, rounds)]
    assert all(torch.equal(c, combined[0]) for c in combined)  # in sync


def test_a_partner_that_relays_other_bytes_than_it_signs_changes_nothing(slice_nodes):
    """The results riding the trades are believed by nobody: an owner that sends its gatherers
    other bytes than those it signs (here zeros) only makes them fetch the signed bytes from the
    slice's owners, as before; every node gathers the same aggregate, nothing recomputed, and no
    liar named (what it signed is honest)."""
    cfg, nodes = slice_nodes
    rounds, _ = make_round(cfg, nodes)
    liar = nodes[1]
    relay_honestly = liar.store.results.put
    liar.store.results.put = lambda r, j, data: relay_honestly(r, j, bytes(len(data)))
    batches = reduce_all(nodes, rounds)
    assert all(node.store.results.wait_inbound(rnd.round, 10.0) for node, rnd in zip(nodes, rounds))
    before = [node.counter.calls_to("FetchPayload") for node in nodes]
    outcomes = [node.exchange.gather(rnd, batches, spot_checks=0) for node, rnd in zip(nodes, rounds)]
    assert all(torch.equal(o.combined, outcomes[0].combined) and not o.recomputed and not o.liars for o in outcomes)
    me = liar.identity.peer_id
    for node, rnd, asked in zip(nodes, rounds, before):
        routed = slice_plan.result_routes(rnd.owners, rnd.peer_ids, me)[0].get(node.identity.peer_id)
        fetched = node.counter.calls_to("FetchPayload") != asked
        assert fetched == bool(routed)  # whoever the liar routed results to fetched them; nobody else opened a stream


def test_an_owner_that_never_opens_its_trades_is_fetched_from_and_changes_nothing(slice_nodes):
    """An owner that opens none of the trades it should (an older peer, a crash between manifest and
    reduce, a slow machine) costs the owners awaiting it only swap_wait_s: they fetch its slices
    from it in one batched stream, and every node gathers the same aggregate, nobody excluded."""
    cfg, nodes = slice_nodes
    rounds, _ = make_round(cfg, nodes)
    for node in nodes:
        node.exchange.swap_wait_s = 0.2  # (its default: the stall timeout, 5 s)
    silent = nodes[0]
    silent.exchange._trades = lambda rnd, me: None  # it fetches everything itself and pushes nothing
    me = silent.identity.peer_id
    batches = reduce_all(nodes, rounds)
    for node, rnd in zip(nodes[1:], rounds[1:]):
        _, awaits = slice_plan.swap_partners(rnd.owners, rnd.peer_ids, node.identity.peer_id)
        asked = node.counter.calls_to("FetchPayload")
        assert asked.get(silent.endpoint, 0) == (1 if me in awaits else 0)  # awaited it in vain, then ONE stream from it
    outcomes = [node.exchange.gather(rnd, batches, spot_checks=0) for node, rnd in zip(nodes, rounds)]
    assert all(torch.equal(o.combined, outcomes[0].combined) for o in outcomes)
    assert all(not excluded for o in outcomes for excluded in o.excluded.values())


def test_a_gather_with_a_spot_check_asks_as_few_owners_as_hold_what_it_wants(slice_nodes):
    """A gather with a spot check wants the aggregated slices it lacks and every input of the
    checked slice: it asks one owner of the checked slice for its inputs (each still checked
    against its author's signed root), and the owners it picks cover both, one stream each. Here
    (4 peers, r = 2) the owner draw gives two pairs that own the same slices, so each peer asks
    ONE owner of the other pair (the code before: every other author for the inputs, and owners
    at random per slice for the results: 3 streams). The aggregate is the one a gather without a
    spot check gets, and the spot check holds."""
    cfg, nodes = slice_nodes
    rounds, _ = make_round(cfg, nodes)
    batches = reduce_all(nodes, rounds)
    plain = nodes[1].exchange.gather(rounds[1], batches, spot_checks=0).combined
    for node, rnd in zip(nodes, rounds):
        me = node.identity.peer_id
        groups = {frozenset(o) for o in rnd.owners if me not in o}
        assert len(groups) == 1  # the other pair
        node.counter.round = 1
        spot = [j for j, owners in enumerate(rnd.owners) if me not in owners][:1]
        before = node.counter.calls_to("FetchPayload")
        outcome = node.exchange.gather(rnd, batches, spot=spot)
        after = node.counter.calls_to("FetchPayload")
        streams = {e: after[e] - before.get(e, 0) for e in after if after[e] - before.get(e, 0)}
        owner_endpoints = {rnd.endpoints[o] for o in next(iter(groups))}
        assert len(streams) == 1 and set(streams.values()) == {1} and set(streams) <= owner_endpoints
        assert outcome.spot_checked == outcome.recomputed == spot and not outcome.liars  # a spot check recomputes
        assert torch.equal(outcome.combined, plain)


def test_a_batched_fetch_keeps_what_checks_and_leaves_the_rest_to_the_fallback(slice_nodes):
    """One stream, several items: an item the holder lacks comes back marked missing, an item whose
    bytes do not check (a wrong digest asked for) is refused, and the others still arrive, checked."""
    from protocol import merkle
    from protocol.batched_fetch import Wanted, fetch_items

    cfg, nodes = slice_nodes
    rounds, _ = make_round(cfg, nodes)
    asker, holder = nodes[0], nodes[1]
    header = rounds[0].headers[holder.identity.peer_id]
    proven = merkle.ProvenNodes(header.root_bytes(), header.num_slices)
    stranger = merkle.ProvenNodes(bytes(32), header.num_slices)  # a root nobody serves
    size = asker.math.sliced_codec.max_slice_payload_size(0)
    told: list[tuple[int, bytes]] = []  # as each item checks, while the stream goes on (reduce-on-arrival uses it)
    got = fetch_items(asker.pool, holder.endpoint, [
        Wanted(max_size=size, slice=1, proven=proven), Wanted(max_size=size, slice=2, proven=stranger),
        Wanted(max_size=size, slice=3, proven=proven), Wanted(max_size=size, sha256="ab" * 32),
        Wanted(max_size=size, slice=5, proven=proven)], on_item=lambda k, item: told.append((k, item.data)))
    assert got[1] is None and got[3] is None
    assert told == [(k, got[k].data) for k in (0, 2, 4)]  # the checked ones only, in stream order
    for k, j in ((0, 1), (2, 3), (4, 5)):
        assert got[k] is not None and got[k].data == holder.store.get_slice(header.root_bytes(), j).payload
    assert asker.counter.calls_to("FetchPayload") == {holder.endpoint: 1}


def test_a_spot_check_asks_no_author_that_every_owner_left_out(slice_nodes):
    """Issue 22's partition: an author vanished after committing, so every owner left its update
    out (unreachable). A spot check recomputes each claim over the inputs that claim used, so the
    gatherer (the coordinator applies the round only after this prefetch) never dials the vanished
    author: in the chaos run its dead link held the coordinator's apply 10 s (13 s on loopback
    through a netns link cut), while every peer had gathered."""
    cfg, nodes = slice_nodes
    rounds, _ = make_round(cfg, nodes)
    victim = 3
    gone, gone_endpoint = nodes[victim].identity.peer_id, nodes[victim].endpoint
    nodes[victim].server.stop(0).wait(5)  # gone: nothing serves its slices any more
    alive = [i for i in range(len(nodes)) if i != victim]
    batches = reduce_all([nodes[i] for i in alive], [rounds[i] for i in alive])
    checker = 0
    spot = [j for j, owners in enumerate(rounds[checker].owners) if nodes[checker].identity.peer_id not in owners]
    by_slice = nodes[checker].exchange.open_results(rounds[checker], batches)
    assert all(set(res.excluded) == {gone} for j in spot for res, _ in by_slice[j])  # every owner left it out
    before = nodes[checker].counter.calls_to("FetchPayload")  # the owners' phase dialled it (and was refused)
    nodes[checker].exchange.prefetch(rounds[checker], batches, spot)  # what the coordinator runs once the results are final
    outcome = nodes[checker].exchange.gather(rounds[checker], batches, spot=spot)
    after = nodes[checker].counter.calls_to("FetchPayload")
    asked = {e for e in after if after[e] > before.get(e, 0)}
    assert asked and gone_endpoint not in asked  # old code: asked it for every spot slice
    assert sorted(outcome.recomputed) == spot and not outcome.liars  # each claim recomputed over its own inputs, and held
    assert all(outcome.excluded[j] == {gone: "unreachable"} for j in range(len(rounds[checker].owners)))
    assert torch.equal(outcome.combined, nodes[1].exchange.gather(rounds[1], batches, spot_checks=0).combined)


@pytest.mark.parametrize("garble", ["short", "nan"])
def test_agreed_bytes_that_do_not_decode_are_recomputed_and_their_signers_named(slice_nodes, garble):
    """Both owners of slice 2 sign the same bytes, which are no aggregate (one byte short, or the
    right length with a NaN: caught by the check over the run of slices decoded together): a gather
    takes the agreed claim, fails to decode it, recomputes the slice from its signed inputs and names
    both signers, with every other slice decoded as agreed."""
    cfg, nodes = slice_nodes
    rounds, _ = make_round(cfg, nodes)
    honest = reduce_all(nodes, rounds)
    clean = nodes[0].exchange.gather(rounds[0], honest).combined
    owners = rounds[0].owners[2]

    def garbled_batch(owner_id: str):
        i = next(k for k, n in enumerate(nodes) if n.identity.peer_id == owner_id)
        node, results = nodes[i], []
        for data, res in node.exchange.reduce_owned_slices(rounds[i]):
            if res.slice == 2:
                bad = data[:-1] if garble == "short" else data[:4] + b"\x00\x00\xc0\x7f" + data[8:]  # NaN in fp16 and fp32
                sha = hashlib.sha256(bad).hexdigest()
                node.store.put_blob(sha, res.round, bad)
                res = dataclasses.replace(res, result_sha256=sha, result_size=len(bad))
            results.append(res)
        return sign_slice_results(node.identity, results)

    lies = [garbled_batch(owner_id) for owner_id in owners]
    tampered = [s for s in honest if _owner(s) not in owners] + lies
    gatherer = next(i for i, n in enumerate(nodes) if n.identity.peer_id not in owners)
    outcome = nodes[gatherer].exchange.gather(rounds[gatherer], tampered, spot_checks=0)
    assert torch.equal(outcome.combined, clean)
    assert outcome.recomputed == [2]
    assert sorted(s.signature for s, *_ in outcome.liars) == sorted(s.signature for s in lies)
