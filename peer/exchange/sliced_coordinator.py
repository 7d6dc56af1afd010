"""The coordinator's side of the sliced exchange: owners, signed results, the round's close.

After the commit phase the coordinator signs a manifest that names each slice's owners (drawn
from the committed hashes). It never downloads the updates: owners reduce their slices and each
signs one batch of its results; the coordinator collects those batches (one per owner, ~80 bytes
a slice), says when the results are final, and then, like any peer, gathers the aggregated
slices (one model's worth, recomputing a slice only where owners disagree or for its spot checks)
to hold θ_{r+1}, its hash and the checkpoint. A false result is evidence: its signer is banned,
its signed batch kept. A slice closes on any of its owners' batches: one that never comes (its
owner slow or dead) is waited for only as long as the result grace / timeout allow.

Phases of a sliced round on the coordinator:
  commit -> reduce (manifest out) -> final (peers gather, spot-check, report, say they gathered
  with a signed ReportGathered) -> applied (we gather once every live peer has, with the
  reported liars' results removed: a lie a peer caught never reaches θ_{r+1}).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import grpc
import torch

from peer.coordinator.round_book import Commitment, RoundBook
from peer.exchange.coordinator_side import Aggregated, CoordinatorExchange, RoundContext
from peer.exchange.spot_budget import SpotBudget
from peer.run.slice_exchange import SliceExchange
from peer.run.slice_round import Lie, SliceRound, sliced_manifest
from protocol.envelope import EnvelopeError, ManifestEntry, RoundManifest
from protocol.payload_store import StoredPayload
from protocol.reasons import Reason
from protocol.rpc_errors import RpcAbort, refusal_for
from protocol.slice_result import SliceResult, open_mismatch_report, signed_to_text
from protocol.wire import swarm_pb2

log = logging.getLogger("swarmloco.coordinator")
KEEP_ROUNDS = 3
Reports = list[tuple[str, int, list[swarm_pb2.Signed]]]  # (reporter, slice, the signed batches it disputes)


@dataclass(slots=True)
class SlicedRoundState:
    slice_round: SliceRound
    opened_at: float
    batches: dict[str, tuple[tuple[SliceResult, ...], swarm_pb2.Signed]] = field(default_factory=dict)  # owner -> its batch
    covered_at: float | None = None  # every slice that has owners got at least one result
    final: bool = False
    final_at: float = 0.0
    gathered: set[str] = field(default_factory=set)  # peers that gathered (they wait for the applied round)
    reports: Reports = field(default_factory=list)
    applied_hash: str = ""
    packed: list[swarm_pb2.Signed] | None = None  # the final batches as GetSliceResults sends them (made once)
    spot: list[int] = field(default_factory=list)  # our spot checks, drawn when the results became final
    ahead: Future | None = None  # fetching what aggregate() will gather, from then on (while the peers gather)

    def owners_missing(self) -> int:
        """Owners (of at least one slice) whose batch has not come."""
        return len({o for owners in self.slice_round.owners for o in owners} - self.batches.keys())

    def covered(self) -> bool:
        return all(any(o in self.batches for o in owners) for owners in self.slice_round.owners if owners)

    def signed_batches(self) -> list[swarm_pb2.Signed]:
        return [signed for _, signed in self.batches.values()]

    def packed_batches(self) -> list[swarm_pb2.Signed]:
        """The final batches packed to travel (protocol/slice_result_wire.py); they no longer change."""
        if self.packed is None:
            self.packed = self.slice_round.pack(self.signed_batches())
        return self.packed


class SlicedCoordinator(CoordinatorExchange):
    """Every method that touches shared state runs under ctx.lock (the RPC ones take it), except
    aggregate(), which fetches and recomputes and must not hold it."""

    name = "sliced"
    continues_in_flight = True

    def __init__(self, ctx: RoundContext) -> None:
        super().__init__(ctx)
        self.slices = SliceExchange(ctx.math, ctx.channels, ctx.store, ctx.fetchers, identity=ctx.identity)
        self.rounds: dict[int, SlicedRoundState] = {}
        self.spot_budget = SpotBudget(ctx.channels.counter, ctx.math.layout.numel)  # ctx.channels counts on our ledger
        self.evidence_checks = threading.Semaphore(2)  # late reports checked at once (each may fetch a slice's inputs)
        self._final: dict[int, tuple[list[swarm_pb2.Signed], Reports]] = {}  # taken by ready_to_apply for aggregate
        self.ahead = ThreadPoolExecutor(max_workers=1, thread_name_prefix="swarmloco-gather-ahead")

    def close(self) -> None:
        self.ahead.shutdown(wait=False, cancel_futures=True)
        self.slices.close()

    # --- commitments and the manifest ----------------------------------------------------------

    def admit(self, commitment: Commitment, pushed: StoredPayload | None) -> None:
        """The owners fetch, verify and decode; a client-mode author pushes its slices to their
        owners once the manifest names them (we hold only what an older client pushed to us)."""
        if pushed is not None:
            self.slices.serve_slices(commitment.header, pushed.payload)
        with self.ctx.lock:
            if commitment.status == "pending":
                commitment.status = "verified"

    def holders(self, commitment: Commitment, public: list[str]) -> list[str]:
        if commitment.endpoint:
            return [commitment.endpoint]
        # client mode: nobody holds it until it pushes each slice to that slice's owners; an older
        # client pushed the whole payload to us, and then we serve its slices
        held = self.slices.store.get_slice(commitment.header.root_bytes(), 0) is not None
        return [self.ctx.endpoint()] if held else []

    def manifest(self, book: RoundBook, entries: list[ManifestEntry], base_param_hash: str) -> RoundManifest:
        return sliced_manifest(self.ctx.math, book.round, entries, base_param_hash=base_param_hash, excluded=book.excluded)

    def commits_closed(self, book: RoundBook, manifest: RoundManifest, signed: swarm_pb2.Signed, verified: list[str]) -> bool:
        """The owners reduce now; the clock applies the round once their results are final and
        the peers gathered."""
        self.slices.own_endpoint = self.ctx.endpoint()
        headers = {p: book.commitments[p].header for p in verified}
        self.rounds[book.round] = SlicedRoundState(SliceRound.of(book.round, manifest, signed, headers), time.monotonic())
        for old in [k for k in self.rounds if k < book.round - KEEP_ROUNDS]:
            del self.rounds[old]
        self.ctx.round_closed.notify_all()
        return False

    # --- results (under the lock) ----------------------------------------------------------------

    def submit_result(self, signed: swarm_pb2.Signed) -> swarm_pb2.CommitReply:
        with self.ctx.lock:
            return self._submit_result(signed)

    def submit_followed(self, batches: Sequence[swarm_pb2.Signed]) -> None:
        """The batches a standby followed, as the previous active packed them (one list: a row may
        copy an earlier batch's), rebuilt in order and submitted whole."""
        with self.ctx.lock:
            state = self.rounds.get(self.ctx.open.book.round)
            if state is None:
                return
            unpacker = state.slice_round.unpacker(self.ctx.cfg.run_id)
            for packed in batches:
                try:
                    full = unpacker.full(packed)
                except EnvelopeError as exc:
                    log.info("a followed slice-result batch does not rebuild: %s", exc)
                    continue
                self._submit_result(full)

    def _submit_result(self, signed: swarm_pb2.Signed) -> swarm_pb2.CommitReply:
        ctx = self.ctx
        state = self.rounds.get(ctx.open.book.round)
        if state is None or state.final:
            return ctx.refuse(Reason.STALE_ROUND, "stale-round: no sliced round is collecting results now")
        rnd = state.slice_round
        try:
            results, signed = self.slices.open_batch(rnd, signed)  # kept whole: the evidence
        except EnvelopeError as exc:
            return ctx.refuse(exc.reason, f"{exc.reason}: {exc}")
        owner = results[0].owner
        first = state.batches.get(owner)
        if first is not None:
            if first[0] == results:
                return swarm_pb2.CommitReply(accepted=True, reason="already submitted", current_round=ctx.open.round)
            differ = [a.slice for a, b in zip(first[0], results) if a != b]
            self.ban(owner, f"two different slice-result batches in round {rnd.round}",
                     {"kind": "result-equivocation", "round": rnd.round, "slice": differ[0] if differ else results[0].slice,
                      "first_result": signed_to_text(first[1]), "second_result": signed_to_text(signed)})
            return ctx.refuse(Reason.EQUIVOCATION, "equivocation: two different batches of slice results in one round; banned")
        state.batches[owner] = (results, signed)
        if state.covered_at is None and state.covered():
            state.covered_at = time.monotonic()
        ctx.round_closed.notify_all()
        return swarm_pb2.CommitReply(accepted=True, current_round=ctx.open.round)

    def should_finalize(self, now: float) -> tuple[bool, str]:
        state = self.rounds.get(self.ctx.open.book.round)
        if state is None or state.final:
            return False, ""
        x = self.ctx.cfg.exchange
        if state.owners_missing() == 0:
            return True, "every owner reported"
        if state.covered_at is not None and now - state.covered_at >= x.result_grace_s:
            return True, f"every slice has a result; {state.owners_missing()} owner(s) sent none"
        if now - state.opened_at >= x.result_timeout_s:
            return True, f"result timeout {x.result_timeout_s:.0f}s: missing slices are recomputed"
        return False, ""

    def finalize(self) -> None:
        """The results are final: peers gather now. We gather once they have (or the timeout),
        so that a lie their spot checks caught is out of the results before we apply them."""
        state = self.rounds[self.ctx.open.book.round]
        state.final, state.final_at = True, time.monotonic()
        self.ctx.round_closed.notify_all()
        # Fetch what we will gather now, beside the peers: applying the round then waits on no
        # round trip (docs/sliced-exchange.md "Round trips"). Bytes only: which claims count is
        # still decided in aggregate(), after the peers' reports.
        # Our own spot checks are sampled like a peer's (bytes bounded in n, docs/sliced-exchange.md),
        # and drawn only where they fit our byte budget (peer/exchange/spot_budget.py: what the
        # ledger moved so far, and the final results every listed peer is about to fetch from us).
        cfg, rnd = self.ctx.cfg.exchange, state.slice_round
        results_out = len(rnd.peer_ids) * sum(b.ByteSize() for b in state.packed_batches())
        spot_checks = self.spot_budget.spot_checks(rnd.round, cfg.spot_checks, [e.payload_size for e in rnd.manifest.entries],
                                                   self.ctx.math.layout.num_slices, still_to_send=results_out)
        state.spot = self.slices.draw_spot_checks(rnd, spot_checks, cfg.spot_check_coverage)
        state.ahead = self.ahead.submit(self.slices.prefetch, state.slice_round, state.signed_batches(), state.spot)

    def ready_to_apply(self, now: float) -> tuple[bool, str]:
        """Under the lock: finalize the results when due, then wait for the live listed peers to
        say they gathered (ReportGathered), or for the result timeout."""
        if self.should_finalize(now)[0]:
            self.finalize()
            return False, ""
        r = self.ctx.open.book.round
        state = self.rounds.get(r)
        if state is None or not state.final:
            return False, ""
        alive = {p for p in state.slice_round.peer_ids if (rec := self.ctx.registry.get(p)) is not None and rec.state != "gone"}
        waiting = alive - state.gathered
        timeout_s = self.ctx.cfg.exchange.result_timeout_s
        if waiting and now - state.final_at < timeout_s:
            return False, ""
        reports, state.reports = state.reports, []
        self._final = {r: (state.signed_batches(), reports)}
        if not waiting:
            return True, "every live peer gathered"
        return True, f"{len(waiting)} peer(s) did not gather within {timeout_s:.0f}s"

    def gathered_elsewhere(self) -> None:
        state = self.rounds[self.ctx.open.book.round]
        self.finalize()
        state.gathered = set(state.slice_round.peer_ids)

    def report_gathered(self, fields: dict[str, Any], signer: str) -> swarm_pb2.CommitReply:
        """A peer (the verified signer of {run_id, round, peer_id, timestamp}) has gathered the
        round and reported what it found false: ready_to_apply waits for the live listed peers."""
        ctx = self.ctx
        round_ = fields.get("round")
        if fields.get("run_id") != ctx.cfg.run_id:
            return ctx.refuse(Reason.WRONG_RUN, f"wrong-run: this coordinator runs {ctx.cfg.run_id!r}, not {fields.get('run_id')!r}")
        if fields.get("peer_id") != signer:  # the body must name its signer: nobody reports for another peer
            return ctx.refuse(Reason.FORGED, f"forged: the report names peer {str(fields.get('peer_id'))[:8]} but is signed by {signer[:8]}")
        if not isinstance(round_, int) or isinstance(round_, bool):
            return ctx.refuse(Reason.MALFORMED, "malformed: a gathered report needs an integer round")
        with ctx.lock:
            record = ctx.registry.get(signer)
            if record is None:
                return ctx.refuse(Reason.UNKNOWN_PEER, "unknown-peer: Join the run before reporting a gathered round")
            if record.banned_reason:
                return ctx.refuse(Reason.BANNED, f"banned: {record.banned_reason}")
            state = self.rounds.get(round_)
            if round_ != ctx.open.book.round or state is None or not state.final:
                return ctx.refuse(Reason.STALE_ROUND, f"stale-round: round {round_} is not gathering now (current round {ctx.open.round})")
            if signer in state.gathered:
                return swarm_pb2.CommitReply(accepted=True, reason="already reported", current_round=ctx.open.round)
            state.gathered.add(signer)
            ctx.round_closed.notify_all()
            return swarm_pb2.CommitReply(accepted=True, current_round=ctx.open.round)

    # --- gather and apply (no lock held) -------------------------------------------------------------

    def aggregate(self, book: RoundBook, params: torch.Tensor) -> Aggregated:
        """Check the peers' reports (recompute the slice; ban whoever signed a false result and
        drop their results), gather what is left with our own spot checks, take the outer step."""
        ctx = self.ctx
        state = self.rounds[book.round]
        rnd = state.slice_round
        batches, reports = self._final.pop(book.round)
        if state.ahead is not None:
            try:
                state.ahead.result()
            except Exception as exc:  # noqa: BLE001 - what did not come ahead is fetched by gather
                log.info("fetching round %d's results ahead failed: %s", book.round, exc)
        false: set[bytes] = set()  # the signatures of batches holding a result that did not recompute
        for reporter, j, disputed in reports:
            for lie in self._verify_report(rnd, j, disputed):
                false.add(lie.signed.signature)
                with ctx.lock:
                    self.ban_liar(rnd.round, lie, f" (reported by {reporter[:8]})")
        kept = [s for s in batches if s.signature not in false]  # a liar's word counts for none of its slices
        outcome = self.slices.gather(rnd, kept, spot=state.spot)  # drawn and fetched ahead (finalize)
        params = params.clone()
        ctx.math.step_with_aggregate(params, outcome.combined, round_=book.round)  # θ_r -> θ_{r+1}
        with ctx.lock:
            for lie in outcome.liars:
                self.ban_liar(rnd.round, lie)
            verified = book.verified()
        # An update counts when it took part in at least one slice.
        used = [p for p in verified if not outcome.excluded or not all(p in ex for ex in outcome.excluded.values())]
        return Aggregated(params=params, used=used, excluded=outcome.excluded_by_peer(), detail=(verified, outcome))

    def applied(self, book: RoundBook, aggregated: Aggregated, param_hash: str) -> None:
        verified, outcome = aggregated.detail
        self.spot_budget.applied(outcome.result_bytes)
        self.ctx.registry.record_slices(book.round, verified, outcome.excluded, self.ctx.math.layout.num_slices)
        state = self.rounds.get(book.round)
        if state is not None:
            state.applied_hash = param_hash
            # Told now, not only by the clock's notify as it opened the next round (before this
            # hash was set): a long-poll on the server's loop reads without the lock, and one that
            # read in between waited for the next news (measured: up to 2.5 s on 8 WAN peers).
            self.ctx.round_closed.notify_all()

    def _verify_report(self, rnd: SliceRound, j: int, disputed: list[swarm_pb2.Signed]) -> list[Lie]:
        try:
            return self.slices.settle(rnd, j, self.slices.open_results(rnd, disputed).get(j, []))[1]
        except Exception as exc:  # noqa: BLE001 - a report that cannot be checked changes nothing
            log.info("could not check a report on slice %d of round %d: %s", j, rnd.round, exc)
            return []

    def ban_liar(self, r: int, lie: Lie, note: str = "") -> None:
        self.ban(lie.result.owner, f"false slice result in round {r}",
                 {"kind": "false-result", "round": r, "slice": lie.result.slice, "why": lie.why + note,
                  "signed_result": signed_to_text(lie.signed)})

    def ban(self, peer_id: str, reason: str, evidence: dict[str, Any]) -> None:
        record = self.ctx.registry.get(peer_id)
        if record is not None and record.banned_reason:
            return
        self.ctx.registry.ban(peer_id, reason, evidence)
        log.warning("banned %s: %s (evidence kept)", peer_id[:8], reason)

    def status(self) -> dict[str, Any]:
        return {"mode": self.name, "slices": self.ctx.math.layout.num_slices, "replicas": self.ctx.cfg.exchange.replicas}

    # --- long-poll (takes the lock itself) ---------------------------------------------------------

    def results_news(self, r: int, until_applied: bool) -> bool:
        state = self.rounds.get(r)
        return state is None or bool(state.applied_hash if until_applied else state.final)

    def wait_results(self, r: int, wait_s: float, until_applied: bool) -> swarm_pb2.SliceResultsReply:
        """Long-poll for round r's final results, or (until_applied) for its θ_{r+1}. A read only:
        a peer says it gathered with a signed ReportGathered (report_gathered)."""
        ctx = self.ctx
        deadline = time.monotonic() + max(0.0, min(wait_s, 60.0))
        with ctx.round_closed:
            while True:
                state = self.rounds.get(r)
                remaining = deadline - time.monotonic()
                if self.results_news(r, until_applied) or remaining <= 0:
                    break
                ctx.round_closed.wait(remaining)
            if state is None:
                return swarm_pb2.SliceResultsReply(ready=False, current_round=ctx.open.round, finished=ctx.open.finished)
            return swarm_pb2.SliceResultsReply(
                # the results once, with the final answer; an until_applied poll comes from a peer
                # that already gathered them (one signed batch per owner: the largest control reply)
                ready=state.final, results=state.packed_batches() if state.final and not until_applied else [],
                applied=bool(state.applied_hash), param_hash=state.applied_hash, current_round=ctx.open.round,
                finished=ctx.open.finished,
            )

    # --- evidence from peers (spot checks) -----------------------------------------------------------

    def report_evidence(self, signed: swarm_pb2.Signed) -> swarm_pb2.CommitReply:
        ctx = self.ctx
        try:
            reporter, round_, slice_, results = open_mismatch_report(signed, run_id=ctx.cfg.run_id)
        except EnvelopeError as exc:
            ctx.registry.reject(exc.reason)
            raise RpcAbort(grpc.StatusCode.INVALID_ARGUMENT, f"report refused: {exc}", refusal_for(exc.reason)) from None
        with ctx.lock:
            record = ctx.registry.get(reporter)
            if record is None or record.banned_reason:
                ctx.registry.reject(Reason.UNKNOWN_PEER)
                return swarm_pb2.CommitReply(accepted=False, reason="unknown-peer: only the run's peers may report",
                                             refusal=swarm_pb2.UNKNOWN_PEER, current_round=ctx.open.round)
            return self.report(reporter, round_, slice_, results)

    def report(self, reporter: str, r: int, j: int, signed_results: list[swarm_pb2.Signed]) -> swarm_pb2.CommitReply:
        """Under the lock: a peer says slice j of these signed batches of round r did not
        recompute. Checked (by recomputing) before the round is applied; a report on an applied
        round is checked beside the clock, and bans only."""
        ctx = self.ctx
        state = self.rounds.get(r)
        if state is None:
            return ctx.refuse(Reason.STALE_ROUND, "stale-round: that round's inputs are no longer kept")
        if not 0 <= j < ctx.math.layout.num_slices:
            return ctx.refuse(Reason.MALFORMED, f"malformed: slice {j} does not exist")
        if not state.applied_hash:
            if len(state.reports) >= 4 * len(state.slice_round.peer_ids):
                return ctx.refuse(Reason.BUSY, "busy: too many reports this round")
            state.reports.append((reporter, j, signed_results))
            return swarm_pb2.CommitReply(accepted=True, reason="will be checked before the round is applied", current_round=ctx.open.round)
        if not self.evidence_checks.acquire(blocking=False):
            return ctx.refuse(Reason.BUSY, "busy: evidence checks are running; report again later")
        threading.Thread(target=self._check_late_report, args=(state.slice_round, j, signed_results, reporter),
                         name="swarmloco-evidence", daemon=True).start()
        return swarm_pb2.CommitReply(accepted=True, reason="checking", current_round=ctx.open.round)

    def _check_late_report(self, rnd: SliceRound, j: int, signed_results: list[swarm_pb2.Signed], reporter: str) -> None:
        try:
            for lie in self._verify_report(rnd, j, signed_results):
                with self.ctx.lock:
                    self.ban_liar(rnd.round, lie, f" (reported by {reporter[:8]})")
        finally:
            self.evidence_checks.release()
