"""The sliced exchange's fetches (SliceExchange's base): few round trips per phase (issue 24).

  reduce-scatter   an owner wants slice j of every listed update for each slice j it owns. Two
                   owners TRADE in one SwapSlices stream (slice_plan.swap_partners says which of
                   the two opens it): the opener pushes the slices of its update the other owns
                   beside its request for the other's; the trades opened to us are awaited
                   (swap_wait_s once our own streams are done). An author that owns nothing gets
                   ONE FetchPayload stream carrying every slice wanted from it; all streams at
                   once. What a trade did not bring (never opened, ended short) comes in one
                   batched stream from its author; what still did not come (a missing item, a
                   failed proof, a broken stream) is fetched alone from the next holders (the
                   author, the slice's other owners)
  all-gather       each agreed aggregated slice from one of its signers, the signers asked as few as
                   hold what the gather wants (slice_plan.cover, ties at random): ONE stream per
                   owner carries every slice wanted from it, all owners at once; what did not come,
                   from its other signers
  spot checks      slice j's n inputs from ONE of its owners (who holds every input it reduced; each
                   still checked against its author's signed root), in the same streams as the
                   all-gather's results; the owners asked are as few as cover both
                   (slice_plan.cover): 3 streams a gather at 8 peers, where one per author was 7
  recomputation    (disputes) slice j's n inputs: one call per author, all at once
  client mode      a NAT'd author serves nothing: once the manifest names the owners it pushes each
                   slice of its update to that slice's owners, ONE PushSlices stream per owner, all
                   at once; an owner waits for those (push_wait_s) before counting them unreachable,
                   and anyone else fetches them from the slice's owners (the coordinator relays nothing)

Every object is checked as it completes (a slice against the Merkle root its author signed, an
aggregated slice against the sha256 its owners signed) and stored to be served on.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from functools import partial
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable

import grpc

from peer.run import slice_plan
from peer.run.slice_round import SliceRound
from protocol.channels import TRANSFER_DEADLINE
from protocol.batched_fetch import Push, Wanted, fetch_streams
from protocol.envelope import signed_from_json
from protocol.payload_fetch import ChannelPool, FetchedSlice, FetchError, fetch_blob, fetch_slice
from protocol.payload_store import PayloadStore, StoredSlice
from protocol.result_relay import RelayPlan
from protocol.slice_push import push_slices
from protocol.slice_result import SliceResult
from protocol.swap_ticket import sign_swap_ticket
from protocol.wire import swarm_pb2

log = logging.getLogger("swarmloco.exchange")


@dataclass(frozen=True, slots=True)
class Trades:
    """An owner's trades in a reduce-scatter (slice_plan.swap_partners): the streams it opens,
    endpoint -> what it pushes there; the owners (peer_ids) that open one to it."""

    pushes: dict[str, Push]
    awaited: frozenset[str]


class SliceFetching:
    """What a SliceExchange fetches, and from whom; it sets these attributes."""

    math: Any
    pool: ChannelPool
    store: PayloadStore
    workers: ThreadPoolExecutor  # one object per call (fallbacks, recomputation inputs)
    streams: ThreadPoolExecutor  # client mode: one push stream per owner, all in flight at once
    own_endpoint: str
    push_wait_s: float  # how long an owner waits for the slices client-mode authors push it
    swap_wait_s: float  # how long, once its own streams are done, it waits for a trade opened by the other owner

    def push_own_slices(self, rnd: SliceRound, peer_id: str, signed_header: swarm_pb2.Signed) -> int:
        """Client mode: each slice of our update to each of its owners, ONE PushSlices stream per
        owner carrying every slice it owns, all owners at once. -> how many owners took them all
        (an owner that did not counts us unreachable for its slices; the other owner may not)."""
        root = rnd.headers[peer_id].root_bytes()
        groups: dict[str, list[tuple[int, StoredSlice]]] = {}
        for j, owners in enumerate(rnd.owners):
            item = self.store.get_slice(root, j)  # ours: put by serve_slices when we encoded
            for owner in owners if item is not None else []:
                if rnd.endpoints.get(owner):
                    groups.setdefault(rnd.endpoints[owner], []).append((j, item))

        def one_stream(owner: str) -> bool:
            try:
                reply = self.pool.peer_stub(owner).PushSlices(push_slices(signed_header, groups[owner]),
                                                              timeout=TRANSFER_DEADLINE.total_seconds())
            except grpc.RpcError as exc:
                log.warning("pushing our slices to %s broke: %s", owner, exc.details() if hasattr(exc, "details") else exc)
                return False
            if not reply.accepted:
                log.warning("%s refused our slices: %s", owner, reply.reason)
            return reply.accepted

        return sum(self.streams.map(one_stream, groups))

    def fetch_input(self, rnd: SliceRound, peer_id: str, j: int) -> bytes:
        """Slice j of peer_id's update: from our store (verified when it was put) or fetched with its
        Merkle proof against the signed root (a holder whose proof fails is skipped, as one whose
        bytes missed a signed digest was)."""
        header = rnd.headers[peer_id]
        root = header.root_bytes()
        held = self.store.get_slice(root, j)
        if held is not None:
            return held.payload
        others = [rnd.endpoints[o] for o in rnd.owners[j] if o in rnd.endpoints]
        holders = [h for h in rnd.holders[peer_id] + others if h and h != self.own_endpoint]
        got = fetch_slice(self.pool, holders, header, j, max_size=self.math.sliced_codec.max_slice_payload_size(j),
                          proven=rnd.proven[peer_id])
        self.store.put_slice(root, j, StoredSlice(rnd.round, got.digest, got.proof, header.num_slices, got.data))  # re-served
        return got.data

    def _try_fetch(self, rnd: SliceRound, peer_id: str, j: int) -> tuple[bytes | None, str]:
        try:
            return self.fetch_input(rnd, peer_id, j), ""
        except (FetchError, OSError) as exc:
            log.info("slice %d of %s unavailable: %s", j, peer_id[:8], exc)
            return None, "unreachable"

    def _first_holder(self, rnd: SliceRound, author: str) -> str:
        """Where a batched fetch asks for the author's slices first: its first holder that is not
        us ("" for a client-mode author, whose slices were pushed to their owners)."""
        return next((h for h in rnd.holders[author] if h and h != self.own_endpoint), "")

    def _signer_endpoints(self, rnd: SliceRound, signers: Iterable[SliceResult]) -> list[str]:
        """Where the owners who signed these results serve (each once, ours left out)."""
        return list(dict.fromkeys(rnd.endpoints[s.owner] for s in signers
                                  if rnd.endpoints.get(s.owner, self.own_endpoint) != self.own_endpoint))

    def _trades(self, rnd: SliceRound, me: str) -> Trades | None:
        """The reduce-scatter's trades of `me` (slice_plan.swap_partners): to each owner we open a
        stream to, the slices of our update it owns (as serve_slices stored them), with our signed
        header; the owners that open one to us. None when we trade with nobody."""
        opens, awaits = slice_plan.swap_partners(rnd.owners, rnd.peer_ids, me)
        if not opens and not awaits:
            return None
        signed = signed_from_json(next(e.header for e in rnd.manifest.entries if e.peer_id == me))
        root = rnd.headers[me].root_bytes()
        # The all-gather rides the same streams (protocol/result_relay.py): what each partner
        # gathers from us, and we from it, goes back over the trade once reduced.
        relay, r = self.store.results, rnd.round
        partners = [p for p in opens + awaits if rnd.endpoints.get(p)]
        bound = self.math.max_result_bytes()
        send, receive = slice_plan.result_routes(rnd.owners, rnd.peer_ids, me)
        plan = RelayPlan(send={p: send.get(p, []) for p in partners}, receive={p: dict.fromkeys(receive.get(p, []), bound) for p in partners},
                         wait_s=self.push_wait_s)
        relay.open(r, plan)
        pushes = {}
        for other in opens:
            if rnd.endpoints.get(other):
                relay.started(r, other)  # our stream to it: its results to us come over it
                held = [(j, item) for j in slice_plan.owned_by(rnd.owners, other) if (item := self.store.get_slice(root, j))]
                pushes[rnd.endpoints[other]] = Push(
                    signed, held, results=partial(relay.outgoing, r, other, 0.0) if plan.send[other] else None,
                    expect=plan.receive[other], on_result=partial(self.store.take_result, r, other),
                    on_end=partial(relay.ended, r, other), tail_s=self.push_wait_s,
                    ticket=sign_swap_ticket(self.identity, run_id=self.math.cfg.run_id, round_=r, to=other))
        return Trades(pushes=pushes, awaited=frozenset(awaits))

    def _fetch_inputs(self, rnd: SliceRound, wanted: list[tuple[str, int]],
                      arrived: Callable[[tuple[str, int], bytes], None] | None = None,
                      results: dict[str, list[tuple[str, int]]] | None = None, via: dict[int, str] | None = None,
                      trades: Trades | None = None) -> dict[tuple[str, int], tuple[bytes | None, str]]:
        """(author, slice) -> (its bytes or None, why not): what we hold, then one batched stream
        per first holder, then each missing one alone (store, author, the slice's other owners).
        `arrived(pair, data)`: told of each input we held or a batched stream brought, as soon as
        it is in (on the fetch loop's thread, protocol/batched_fetch.py: quick, never raising);
        not of what the fallback fetches. `via` (slice -> holder): ask that holder (an owner of the
        slice, who holds every input it reduced) for the slice's inputs instead of each author.
        `results` (holder -> [(sha256, size)]): aggregated slices that ride in the same streams
        (one stream per counterpart for a gather's results and its spot checks' inputs), stored as
        they check; what does not come is left to _fetch_result. `trades`: the reduce-scatter's
        (SwapSlices): the streams to the owners we open one to carry our slices they own, and what
        the owners that open one to us would send is not asked for but awaited (swap_wait_s once
        our own streams are done; then fetched like the rest)."""
        got: dict[tuple[str, int], tuple[bytes | None, str]] = {}
        # pushed to us once their authors hold the manifest: by client-mode authors (who serve
        # nothing) and by the owners that open a trade with us
        pushed = [(p, j) for p, j in wanted if not any(rnd.holders[p])]
        awaited = [(p, j) for p, j in wanted if trades is not None and p in trades.awaited]

        def take_held(pair: tuple[str, int]) -> bool:
            held = self.store.get_slice(rnd.headers[pair[0]].root_bytes(), pair[1])
            if held is not None:
                got[pair] = (held.payload, "")
                if arrived is not None:
                    arrived(pair, held.payload)
            return held is not None

        later = set(pushed) | set(awaited)
        asked = [pair for pair in wanted if not take_held(pair) and pair not in later]
        self._stream_inputs(rnd, self._by_holder(rnd, asked, via), results or {}, got, arrived,
                            trades.pushes if trades is not None else None)
        for pairs, wait_s, trade in ((pushed, self.push_wait_s, False), (awaited, self.swap_wait_s, True)):
            waiting = [pair for pair in pairs if pair not in got]
            if waiting:  # a trade that ended without some slice: fetched from its author at once
                self.store.wait_slices([(rnd.headers[p].root_bytes(), j) for p, j in waiting], wait_s, until_push_ended=trade)
                for pair in waiting:
                    take_held(pair)
        # What a trade did not bring, in ONE stream per author (it serves its slices): a partner that
        # never opened (older, crashed, slow) costs one batched fetch, not a call per slice.
        untraded = self._by_holder(rnd, [pair for pair in awaited if pair not in got])
        if untraded:
            self._stream_inputs(rnd, untraded, {}, got, arrived)
        missing = [pair for pair in wanted if pair not in got]
        for pair, outcome in zip(missing, self.workers.map(lambda pair: self._try_fetch(rnd, *pair), missing)):
            got[pair] = outcome
        return got

    def _by_holder(self, rnd: SliceRound, pairs: list[tuple[str, int]],
                   via: dict[int, str] | None = None) -> dict[str, list[tuple[str, int]]]:
        """holder -> the (author, slice) pairs to ask it for: slice j's `via` holder if any, else
        the author's first holder; a pair with neither is left out (the fallback tries it)."""
        groups: dict[str, list[tuple[str, int]]] = {}
        for p, j in pairs:
            holder = (via or {}).get(j) or self._first_holder(rnd, p)
            if holder:
                groups.setdefault(holder, []).append((p, j))
        return groups

    def _stream_inputs(self, rnd: SliceRound, groups: dict[str, list[tuple[str, int]]], results: dict[str, list[tuple[str, int]]],
                       got: dict[tuple[str, int], tuple[bytes | None, str]], arrived: Callable[[tuple[str, int], bytes], None] | None,
                       pushes: dict[str, Push] | None = None) -> None:
        """One batched stream per holder: `groups`' inputs (author, slice), then `results`'
        aggregated slices (sha256, size), `pushes` sent beside; each object stored as it checks,
        an input also into `got` and told to `arrived`."""
        def keep(holder: str, k: int, item: FetchedSlice) -> None:  # as each object checks, while the streams go on
            inputs = groups.get(holder, [])
            if k >= len(inputs):  # an aggregated slice riding along
                self.store.put_blob(item.digest, rnd.round, item.data)
                return
            p, j = inputs[k]
            header = rnd.headers[p]
            self.store.put_slice(header.root_bytes(), j, StoredSlice(rnd.round, item.digest, item.proof, header.num_slices,
                                                                    item.data))  # re-served
            got[(p, j)] = (item.data, "")
            if arrived is not None:
                arrived((p, j), item.data)

        plan = {holder: [Wanted(max_size=self.math.sliced_codec.max_slice_payload_size(j), slice=j, proven=rnd.proven[p])
                         for p, j in groups.get(holder, [])] + [Wanted(max_size=size, sha256=sha) for sha, size in results.get(holder, [])]
                for holder in {**groups, **results}}
        fetch_streams(self.pool, plan, on_item=keep, pushes=pushes)

    def _agreed_results(self, rnd: SliceRound, by_slice: dict[int, list[tuple[SliceResult, swarm_pb2.Signed]]],
                        slices: list[int]) -> dict[int, tuple[str, int, list[str]]]:
        """slice -> (sha256, size, the endpoints of its signers but us): the agreed aggregated slices
        of `slices` we lack. Disputed or missing slices are left out (settled by recomputation)."""
        agreed: dict[int, tuple[str, int, list[str]]] = {}
        for j in slices:
            claims = slice_plan.distinct_claims((res.result_sha256, res.inputs) for res, _ in by_slice.get(j, []))
            if len(claims) != 1:
                continue
            sha = claims[0][0]
            signers = [res for res, _ in by_slice[j] if res.result_sha256 == sha]
            holders = self._signer_endpoints(rnd, signers)
            if holders and self.store.get_blob(sha) is None:
                agreed[j] = (sha, signers[0].result_size, holders)
        return agreed

    def _fetch_result(self, rnd: SliceRound, j: int, sha: str, signers: list[SliceResult]) -> bytes | None:
        data = self.store.get_blob(sha)
        if data is not None:
            return data
        holders = [rnd.endpoints[s.owner] for s in signers if s.owner in rnd.endpoints]
        random.shuffle(holders)  # spread the all-gather over the slice's owners
        try:
            data = fetch_blob(self.pool, holders, sha, signers[0].result_size)
        except (FetchError, OSError) as exc:
            log.info("aggregated slice %d unavailable from its owners: %s", j, exc)
            return None
        self.store.put_blob(sha, rnd.round, data)
        return data
