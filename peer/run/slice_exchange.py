"""The sliced exchange's work, shared by peers and the coordinator: reduce-scatter and all-gather.

  reduce (owners)   slice j of every listed update -> verify against its author's signed header
                    -> decode into a preallocated (n, s_j) block -> robust rule on the slice
                    -> result bytes, stored under their sha256 and served; once every owned slice
                    is done, one signed batch of their SliceResults (protocol/slice_result.py)
  gather (everyone) the owners' batches opened into per-slice results; for each slice: one claim
                    -> fetch the bytes from any owner that signed it; several claims, no claim, or
                    a spot check -> recompute from the signed inputs and believe only what
                    recomputes (the liars are named, each with its signed batch as evidence)

Everything here is deterministic given the manifest and the inputs, so two honest nodes that see
the same inputs sign the same bytes; a node that sees different bytes knows someone lied.
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import torch

from peer.run import slice_plan
from peer.run.round_math import RoundMath
from peer.run.work_math import RowWork
from protocol.reasons import FOR_CAUSE
from protocol.envelope import EnvelopeError, RoundManifest, UpdateHeader, check_entry, signed_from_json
from protocol import merkle
from peer.run.slice_fetch import SliceFetching
from peer.run.slice_round import GatherOutcome, Lie, SliceRound, draw_owners
from peer.run.thread_clock import CoreTally
from protocol.batched_fetch import MAX_STREAMS
from protocol.channels import STALL_TIMEOUT
from protocol.payload_fetch import ChannelPool
from protocol.payload_store import PayloadStore, StoredSlice
from protocol.slice_result import SliceResult, open_slice_results, sign_slice_results
from protocol.slice_result_wire import BatchUnpacker
from protocol.wire import swarm_pb2

log = logging.getLogger("swarmloco.exchange")
INLINE_DECODE_MAX = 1 << 16  # values: an agreed result slice this small is decoded on the gathering thread


class SliceExchange(SliceFetching):
    def __init__(
        self,
        math: RoundMath,
        pool: ChannelPool,
        store: PayloadStore,
        workers: ThreadPoolExecutor,
        *,
        own_endpoint: str = "",
        identity: Any = None,
    ) -> None:
        self.math = math
        self.pool = pool
        self.store = store
        self.workers = workers
        self.own_endpoint = own_endpoint
        # An owner waits this long for the slices client-mode authors push it once they hold the
        # manifest (a fraction of the result phase: a silent author is then counted unreachable).
        self.push_wait_s = math.cfg.exchange.result_timeout_s / 4
        # A trade partner that has pushed nothing by the time our own streams are done and this
        # long after is fetched from instead, as a stream that brought nothing this long is cut off.
        self.swap_wait_s = min(self.push_wait_s, STALL_TIMEOUT.total_seconds())
        self.identity = identity
        # Slices are gathered a few at a time; each may fetch its inputs through `workers`, so the
        # two levels use two pools (one pool for both could fill with slices waiting on fetches).
        self.slice_workers = ThreadPoolExecutor(max_workers=4, thread_name_prefix="swarmloco-slice")
        # Client mode: one push stream per owner, all in flight at once (fetches run on the pool's loop: protocol/batched_fetch.py).
        self.streams = ThreadPoolExecutor(max_workers=MAX_STREAMS, thread_name_prefix="swarmloco-stream")
        self._hashed: tuple[bytes, list[bytes], list[bytes]] | None = None  # (payload, slices, digests)
        # The last reduce_owned_slices' reduces: their wall time, CPU and wait for a core (peer/run/thread_clock.py)
        self.last_reduce_times: dict[str, Any] | None = None

    def close(self) -> None:
        self.slice_workers.shutdown(wait=False, cancel_futures=True)
        self.streams.shutdown(wait=False, cancel_futures=True)

    # --- the sender's side ---------------------------------------------------------------

    def slice_hashes(self, payload: bytes) -> list[str]:
        parts = self.math.sliced_codec.split(payload)
        digests = [hashlib.sha256(part).digest() for part in parts]
        self._hashed = (payload, parts, digests)  # serve_slices of the same bytes object hashes nothing again
        return [d.hex() for d in digests]

    def _split_hashed(self, payload: bytes) -> tuple[list[bytes], list[bytes]]:
        """(slices, their sha256 digests) of `payload`: slice_hashes' when it was this very object."""
        done, self._hashed = self._hashed, None
        if done is not None and done[0] is payload:
            return done[1], done[2]
        parts = self.math.sliced_codec.split(payload)
        return parts, [hashlib.sha256(part).digest() for part in parts]

    def serve_slices(self, header: UpdateHeader, payload: bytes) -> None:
        """Make each slice of a (verified) payload fetchable by (its header's slices_root, index),
        with its Merkle proof. A header whose root is not its payload's (a client-mode peer's
        lie) gets nothing served: its slices are as unreachable as a wrong digest made them."""
        parts, digests = self._split_hashed(payload)
        root = header.root_bytes()
        if len(parts) != header.num_slices or merkle.root(digests) != root:
            log.warning("update of %s: its signed slices_root is not the Merkle root of its payload's slices; "
                        "not serving them", header.peer_id[:8])
            return
        for j, (part, digest, path) in enumerate(zip(parts, digests, merkle.proofs(digests))):
            self.store.put_slice(root, j, StoredSlice(header.round, digest.hex(), tuple(path), len(parts), part))

    # --- the manifest --------------------------------------------------------------------

    def open_round(self, manifest: RoundManifest, signed_manifest: swarm_pb2.Signed, r: int,
                   verify_header: Callable[[Any, int | None], UpdateHeader]) -> SliceRound:
        """Check the manifest's entries and owner draw; raises EnvelopeError when they do not hold."""
        headers: dict[str, UpdateHeader] = {}
        for entry in manifest.entries:
            header = verify_header(signed_from_json(entry.header), r)
            check_entry(entry, header)
            if header.num_slices != self.math.layout.num_slices:
                raise EnvelopeError("malformed", f"update of {entry.peer_id[:8]} commits to {header.num_slices} slices, the run has {self.math.layout.num_slices}")
            headers[entry.peer_id] = header
        if manifest.owners != draw_owners(self.math, r, manifest.entries):
            raise EnvelopeError("forged", "the manifest's slice owners are not the draw its entries determine")
        return SliceRound.of(r, manifest, signed_manifest, headers)

    # --- reduce-scatter ------------------------------------------------------------------

    def reduce(self, rnd: SliceRound, j: int, inputs: list[str] | None = None,
               fetched: list[tuple[bytes | None, str]] | None = None) -> tuple[bytes, SliceResult]:
        """Aggregate slice j over `inputs` (default: every listed update we can get and use);
        `fetched`: their (bytes or None, why not) when the caller has fetched them already."""
        candidates = rnd.peer_ids if inputs is None else inputs
        size = self.math.layout.size(j)
        rows = torch.empty(len(candidates), size)  # (n, s_j), filled in place
        if fetched is None:
            fetched = list(self.workers.map(lambda p: self._try_fetch(rnd, p, j), candidates))
        present = [data for data, _ in fetched if data is not None]
        rejected = iter(self.math.decode_slices(present, j, rnd.round, rows))  # the rows of those that decode, in order
        used: list[str] = []
        excluded: dict[str, str] = {}
        for peer_id, (data, error) in zip(candidates, fetched):
            if data is not None:
                refusal = next(rejected)
                if refusal is None:
                    used.append(peer_id)
                    continue
                error = refusal.reason
            excluded[peer_id] = error
        for_cause = sum(reason in FOR_CAUSE for reason in [*rnd.manifest.excluded.values(), *excluded.values()])
        work = RowWork.of([rnd.headers[p].tokens for p in used], rnd.manifest.work_history, used)  # their signed claims
        result = self.math.reduce_slice(rows[: len(used)], j, round_=rnd.round, excluded_for_cause=for_cause, work=work)
        sha = hashlib.sha256(result).hexdigest()
        self.store.put_blob(sha, rnd.round, result)
        owner = self.identity.peer_id if self.identity is not None else ""
        return result, SliceResult(
            run_id=self.math.cfg.run_id, round=rnd.round, slice=j, owner=owner, manifest_sha256=rnd.manifest_sha256,
            result_sha256=sha, result_size=len(result), inputs=tuple(used), excluded=excluded,
        )

    def reduce_owned_slices(self, rnd: SliceRound, marks: dict[str, float] | None = None) -> list[tuple[bytes, SliceResult]]:
        """Every slice this node owns, reduced: (result bytes, its result), by slice. `marks`
        gets the wall-clock time its inputs were in ("inputs_fetched")."""
        assert self.identity is not None
        owned = slice_plan.owned_by(rnd.owners, self.identity.peer_id)
        # Every input of every owned slice fetched at once: ONE stream per holder carrying all the
        # slices wanted from it, every holder in flight at once (issue 24), then what did not come
        # fetched alone from the next holders. A slice whose n inputs are all in is reduced at once,
        # beside the streams still bringing the later slices (decoding while bytes arrive); the
        # rest once the fallback is done. Same inputs, same bytes, whichever way.
        peers = rnd.peer_ids
        missing = {j: len(peers) for j in owned}
        inputs: dict[tuple[str, int], bytes] = {}
        early: dict[int, Future] = {}
        lock = threading.Lock()
        times = CoreTally()

        def arrived(pair: tuple[str, int], data: bytes) -> None:
            j = pair[1]
            with lock:
                inputs[pair] = data
                missing[j] -= 1
                if missing[j]:
                    return
            early[j] = self.slice_workers.submit(self._reduce_relayed, rnd, j, times, [(inputs[(p, j)], "") for p in peers])

        # Two owners trade in ONE stream (SwapSlices), opened by one of them (slice_plan.swap_partners):
        # half the streams of fetching from each other (issue 24); our results go back over it.
        trades = self._trades(rnd, self.identity.peer_id)
        try:
            fetched = self._fetch_inputs(rnd, [(p, j) for j in owned for p in peers], arrived, trades=trades)
            if marks is not None:
                marks["inputs_fetched"] = time.time()
            reduced = [early[j].result() if j in early else self._reduce_relayed(rnd, j, times, [fetched[(p, j)] for p in peers])
                       for j in owned]
        except BaseException:
            self.store.results.abandon(rnd.round)  # the trades stop waiting for results that will not come
            raise
        self.last_reduce_times = times.take()
        return reduced

    def _reduce_relayed(self, rnd: SliceRound, j: int, times: CoreTally,
                        fetched: list[tuple[bytes | None, str]]) -> tuple[bytes, SliceResult]:
        """reduce(), timed, and its bytes handed to the trades that carry them to their gatherers."""
        out = times.call(self.reduce, rnd, j, fetched=fetched)
        self.store.results.put(rnd.round, j, out[0])
        return out

    def reduce_owned(self, rnd: SliceRound, marks: dict[str, float] | None = None) -> list[swarm_pb2.Signed]:
        """What this node submits: its owned slices reduced and signed as one batch (none when it owns none)."""
        results = [result for _, result in self.reduce_owned_slices(rnd, marks)]
        return [sign_slice_results(self.identity, results)] if results else []

    # --- all-gather ----------------------------------------------------------------------

    def open_results(self, rnd: SliceRound, batches: list[swarm_pb2.Signed]) -> dict[int, list[tuple[SliceResult, swarm_pb2.Signed]]]:
        """Valid results by slice, each beside its signed batch: signed by an owner of that slice,
        for this manifest; one batch per owner (the first), an invalid batch ignored."""
        by_slice: dict[int, list[tuple[SliceResult, swarm_pb2.Signed]]] = {}
        seen: set[str] = set()
        unpacker = rnd.unpacker(self.math.cfg.run_id)  # one for the list: a packed row may copy an earlier batch's
        for packed in batches:
            try:
                results, signed = self.open_batch(rnd, packed, unpacker)
            except EnvelopeError as exc:
                log.info("ignoring slice results: %s", exc)
                continue
            if results[0].owner in seen:
                log.info("ignoring a second batch of slice results from %s", results[0].owner[:8])
                continue
            seen.add(results[0].owner)
            for result in results:
                by_slice.setdefault(result.slice, []).append((result, signed))
        return by_slice

    def open_batch(self, rnd: SliceRound, signed: swarm_pb2.Signed,
                   unpacker: BatchUnpacker | None = None) -> tuple[tuple[SliceResult, ...], swarm_pb2.Signed]:
        """An owner's signed batch (packed or full) for this round's manifest -> (its results by
        slice, the full signed batch: the evidence); EnvelopeError otherwise."""
        full = (unpacker or rnd.unpacker(self.math.cfg.run_id)).full(signed)
        return open_slice_results(
            full, run_id=self.math.cfg.run_id, round_=rnd.round, manifest_sha256=rnd.manifest_sha256, owners=rnd.owners,
            max_result_bytes=self.math.max_result_bytes(), peer_ids=rnd.peer_ids,
        ), full

    def gather(self, rnd: SliceRound, batches: list[swarm_pb2.Signed], *, spot_checks: int = 0,
               coverage: float | None = None, rng: random.Random | None = None,
               marks: dict[str, float] | None = None, spot: list[int] | None = None) -> GatherOutcome:
        """The (d,) aggregate from the owners' signed batches; recomputes where it must.
        `coverage`: run the spot checks only with probability spot_check_probability (peers and
        the coordinator, so that a node's spot-check bytes stay bounded in n); None: always.
        `marks` gets the wall-clock time the agreed results were in ("results_fetched").
        `spot`: the slices to spot-check, drawn already (draw_spot_checks; prefetch fetched for
        them); None: drawn here from spot_checks and coverage."""
        by_slice = self.open_results(rnd, batches)
        layout = self.math.layout
        if spot is None:
            spot = self.draw_spot_checks(rnd, spot_checks, coverage, rng)
        outcome = GatherOutcome(combined=torch.empty(layout.numel), spot_checked=spot)
        # The results our trade partners send us over the reduce-scatter's streams (protocol/
        # result_relay.py): those of the owners that signed are on their way, if not in already.
        self.store.results.wait_inbound(rnd.round, self.swap_wait_s, {res.owner for claims in by_slice.values() for res, _ in claims})
        self._prefetch(rnd, by_slice, spot)
        if marks is not None:
            marks["results_fetched"] = time.time()

        def agreed(j: int) -> tuple[str, list[SliceResult]] | None:
            """Slice j's one agreed claim, when it is not spot-checked: its sha256 and the results that signed it."""
            claims = slice_plan.distinct_claims((res.result_sha256, res.inputs) for res, _ in by_slice.get(j, []))
            if len(claims) != 1 or j in spot:
                return None
            sha = claims[0][0]
            return sha, [res for res, _ in by_slice[j] if res.result_sha256 == sha]

        def take(j: int, data: bytes, signers: list[SliceResult]) -> tuple[int, bytes, torch.Tensor, list[Lie], bool, dict[str, str]]:
            """The agreed bytes of slice j, decoded (ValueError: they are no aggregate)."""
            return j, data, self.math.decode_result(data, j), [], False, dict(signers[0].excluded)

        def one(j: int) -> tuple[int, bytes, torch.Tensor, list[Lie], bool, dict[str, str]]:
            claim = agreed(j)
            if claim is not None:
                data = self._fetch_result(rnd, j, *claim)
                try:
                    if data is not None:
                        return take(j, data, claim[1])
                except ValueError:  # agreed bytes that cannot be an aggregate: recomputation says who lied
                    pass
            data, liars, excluded = self.settle(rnd, j, by_slice.get(j, []))
            return j, data, self.math.decode_result(data, j), liars, True, excluded

        def held(j: int) -> tuple[bytes, list[SliceResult]] | None:
            """The usual slice: its agreed bytes, which the prefetch brought, and their signers."""
            claim = agreed(j) if layout.size(j) <= INLINE_DECODE_MAX else None
            data = None if claim is None else self.store.get_blob(claim[0])
            return None if data is None else (data, claim[1])

        # A held slice is decoded here (tens of microseconds for a small slice), not handed to a slice
        # thread and back (32 hand-offs a round cost more than the decodes); what must fetch or
        # recompute, or held bytes that do not decode, go to the slice threads, submitted first.
        ready = {j: item for j in range(layout.num_slices) if (item := held(j)) is not None}
        pooled = [self.slice_workers.submit(one, j) for j in range(layout.num_slices) if j not in ready]
        done: list[tuple[int, bytes, torch.Tensor | None, list[Lie], bool, dict[str, str]]] = []
        try:
            # Held slices decode straight into their ranges of the aggregate (values None below),
            # checked finite once per run of adjacent slices; agreed bytes that cannot be an
            # aggregate go to recomputation, which says who lied.
            refused = self.math.decode_results_into({j: data for j, (data, _) in ready.items()}, outcome.combined)
            pooled += [self.slice_workers.submit(one, j) for j in refused]
            done = [(j, data, None, [], False, dict(signers[0].excluded)) for j, (data, signers) in ready.items() if j not in refused]
            done = sorted(done + [future.result() for future in pooled], key=lambda out: out[0])
        except BaseException:
            for future in pooled:
                future.cancel()
            raise
        for j, data, values, liars, recomputed, excluded in done:
            if values is not None:
                outcome.combined[layout.range(j)] = values
            outcome.result_bytes += len(data)
            outcome.liars.extend(liars)
            outcome.excluded[j] = excluded
            if recomputed:
                outcome.recomputed.append(j)
        return outcome

    def draw_spot_checks(self, rnd: SliceRound, spot_checks: int, coverage: float | None = None,
                         rng: random.Random | None = None) -> list[int]:
        """The slices this node recomputes although their owners agree: `spot_checks` of the ones
        it does not own, run with probability spot_check_probability when `coverage` is given
        (None: always). Drawn once the results are final, so unpredictable to the owners."""
        me = self.identity.peer_id if self.identity is not None else ""
        not_mine = [j for j in range(self.math.layout.num_slices) if me not in rnd.owners[j]]
        rng = rng or random.SystemRandom()
        if coverage is not None and rng.random() >= slice_plan.spot_check_probability(
                spot_checks, coverage, self.math.layout.num_slices, len(rnd.peer_ids)):
            return []
        return sorted(rng.sample(not_mine, min(spot_checks, len(not_mine))))

    def prefetch(self, rnd: SliceRound, batches: list[swarm_pb2.Signed], spot: list[int]) -> None:
        """Bytes only, nothing believed yet: what gather(rnd, batches, spot=spot) will want, into
        the store (the coordinator runs it as soon as the results are final, while the peers
        gather, so that applying the round costs no round trip of its own)."""
        self._prefetch(rnd, self.open_results(rnd, batches), spot)

    def _prefetch(self, rnd: SliceRound, by_slice: dict[int, list[tuple[SliceResult, swarm_pb2.Signed]]],
                  spot: list[int]) -> None:
        """The agreed results of every slice but `spot` and the inputs of the `spot` slices, all in
        flight at once, from as few owners as hold them all (slice_plan.cover): a spot check's
        inputs come from one signer of the slice's result, which holds every input it reduced (8
        peers: 3 streams a gather, where one per author and one per owner picked were up to 13);
        what it does not send is fetched from the authors. Inputs of client-mode authors (pushed
        to the slice's owners) are left to settle(), which fetches them from the owners. A spot check recomputes each claim over its
        own inputs (settle), so only the authors some claim used are fetched: an author every owner
        left out (unreachable: issue 22's partitioned peer, whose dead link held the coordinator's
        apply 10-13 s) is not asked; a slice with no claim is reduced over every author."""
        def authors(j: int) -> list[str]:
            claims = by_slice.get(j)
            used = {p for res, _ in claims for p in res.inputs} if claims else set(rnd.peer_ids)
            return [p for p in rnd.peer_ids if p in used]

        inputs = [(p, j) for j in spot for p in authors(j) if any(rnd.holders[p])]
        agreed = self._agreed_results(rnd, by_slice, [j for j in range(self.math.layout.num_slices) if j not in spot])
        # a spot slice's inputs from one who signed a result for it: it holds every input it reduced
        owners = {j: self._signer_endpoints(rnd, (res for res, _ in by_slice.get(j, []))) for j in spot}
        chosen = slice_plan.cover({**{j: holders for j, (_, _, holders) in agreed.items()}, **owners}, random.SystemRandom())
        results: dict[str, list[tuple[str, int]]] = {}
        for j, (sha, size, _) in agreed.items():
            results.setdefault(chosen[j], []).append((sha, size))
        self._fetch_inputs(rnd, inputs, results=results, via={j: chosen[j] for j in spot if j in chosen})

    def settle(self, rnd: SliceRound, j: int,
               results: list[tuple[SliceResult, swarm_pb2.Signed]]) -> tuple[bytes, list[Lie], dict[str, str]]:
        """Recompute each claim over its own inputs; keep the preferred one that holds.
        -> (slice j's aggregate, the results disproved, its exclusions)."""
        claims = slice_plan.distinct_claims((res.result_sha256, res.inputs) for res, _ in results)
        verified: dict[tuple[str, tuple[str, ...]], bytes | None] = {}
        for sha, inputs in claims:
            try:
                data, mine = self.reduce(rnd, j, list(inputs))
            except Exception as exc:  # noqa: BLE001 - an input we cannot get: the claim stays unverified
                log.info("cannot recompute slice %d over a claimed input set: %s", j, exc)
                continue
            if mine.inputs != inputs:
                continue  # some input is out of our reach now: neither proven nor disproven
            verified[(sha, inputs)] = data if mine.result_sha256 == sha else None
        liars = [Lie(signed, f"slice {j}: signed sha256 {res.result_sha256[:12]} over {len(res.inputs)} inputs; "
                     "recomputing those inputs gives other bytes", res)
                 for res, signed in results if (res.result_sha256, res.inputs) in verified and verified[(res.result_sha256, res.inputs)] is None]
        for sha, inputs in claims:  # claims are in preference order
            data = verified.get((sha, inputs))
            if data is not None:
                excluded = next(res.excluded for res, _ in results if res.result_sha256 == sha and res.inputs == inputs)
                return data, liars, dict(excluded)
        data, mine = self.reduce(rnd, j)  # nothing to believe (or nobody answered): as an owner would
        return data, liars, dict(mine.excluded)
