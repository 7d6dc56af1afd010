"""The coordinator's side of the sliced exchange: owners, signed results, the round's close.

After the commit phase the coordinator signs a manifest that names each slice's owners (drawn
from the committed hashes). It never downloads the updates: owners reduce their slices and sign
the results; the coordinator collects those signatures (a few hundred bytes each), says when the
results are final, and then, like any peer, gathers the aggregated slices (one model's worth,
recomputing a slice only where owners disagree or for its spot checks) to hold θ_{r+1}, its
hash and the checkpoint. A false result is evidence: its signer is banned, the signed result kept.

Phases of a sliced round on the coordinator:
  commit -> reduce (manifest out) -> final (peers gather, spot-check, report) -> applied (we gather
  once every live peer has, with the reported liars' results removed: a lie a peer caught never
  reaches θ_{r+1}).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from peer.run.slice_exchange import GatherOutcome, Lie, SliceExchange, SliceRound
from protocol.envelope import EnvelopeError, RoundManifest, UpdateHeader
from protocol.reasons import Reason
from protocol.slice_result import SliceResult, signed_to_text
from protocol.wire import swarm_pb2

if TYPE_CHECKING:
    from peer.coordinator.state import Coordinator

log = logging.getLogger("swarmloco.coordinator")
KEEP_ROUNDS = 3


@dataclass(slots=True)
class SlicedRoundState:
    slice_round: SliceRound
    opened_at: float
    results: dict[tuple[int, str], tuple[SliceResult, swarm_pb2.Signed]] = field(default_factory=dict)
    covered_at: float | None = None  # every slice that has owners got at least one result
    final: bool = False
    final_at: float = 0.0
    gathered: set[str] = field(default_factory=set)  # peers that gathered (they wait for the applied round)
    reports: list[tuple[str, int, list[swarm_pb2.Signed]]] = field(default_factory=list)  # (reporter, slice, results)
    applied_hash: str = ""

    def owners_missing(self) -> int:
        return sum(1 for j, owners in enumerate(self.slice_round.owners) for o in owners if (j, o) not in self.results)

    def covered(self) -> bool:
        have = {j for j, _ in self.results}
        return all(j in have for j, owners in enumerate(self.slice_round.owners) if owners)


class SlicedRounds:
    """Owned by the Coordinator; every method that touches shared state runs under its lock,
    except gather(), which fetches and recomputes and must not hold it."""

    def __init__(self, coordinator: "Coordinator") -> None:
        self.c = coordinator
        self.exchange = SliceExchange(coordinator.math, coordinator.channels, coordinator.store, coordinator.fetchers,
                                      identity=coordinator.identity)
        self.rounds: dict[int, SlicedRoundState] = {}
        self.reports = threading.Semaphore(2)  # evidence checks running at once (each may fetch a slice's inputs)

    # --- the manifest (under the coordinator's lock) ----------------------------------------

    def open(self, r: int, manifest: RoundManifest, signed: swarm_pb2.Signed, headers: dict[str, UpdateHeader]) -> None:
        self.exchange.own_endpoint = self.c.endpoint
        self.rounds[r] = SlicedRoundState(SliceRound.of(r, manifest, signed, headers), time.monotonic())
        for old in [k for k in self.rounds if k < r - KEEP_ROUNDS]:
            del self.rounds[old]

    # --- results (under the lock) ---------------------------------------------------------

    def submit(self, signed: swarm_pb2.Signed) -> swarm_pb2.CommitReply:
        c = self.c
        state = self.rounds.get(c.book.round)
        if state is None or state.final:
            return c.refuse("stale-round", "stale-round: no sliced round is collecting results now")
        rnd = state.slice_round
        try:
            result = self.exchange.open_result(rnd, signed)
        except EnvelopeError as exc:
            return c.refuse(exc.reason, f"{exc.reason}: {exc}")
        key = (result.slice, result.owner)
        first = state.results.get(key)
        if first is not None:
            if first[0] == result:
                return swarm_pb2.CommitReply(accepted=True, reason="already submitted", current_round=c.round)
            self.ban(result.owner, f"two different results for slice {result.slice} in round {rnd.round}",
                     {"kind": "result-equivocation", "round": rnd.round, "slice": result.slice,
                      "first_result": signed_to_text(first[1]), "second_result": signed_to_text(signed)})
            return c.refuse("equivocation", "equivocation: two different results for one slice; banned")
        state.results[key] = (result, signed)
        if state.covered_at is None and state.covered():
            state.covered_at = time.monotonic()
        c.round_closed.notify_all()
        return swarm_pb2.CommitReply(accepted=True, current_round=c.round)

    def should_finalize(self, now: float) -> tuple[bool, str]:
        state = self.rounds.get(self.c.book.round)
        if state is None or state.final:
            return False, ""
        x = self.c.cfg.exchange
        if state.owners_missing() == 0:
            return True, "every owner reported"
        if state.covered_at is not None and now - state.covered_at >= x.result_grace_s:
            return True, f"every slice has a result; {state.owners_missing()} owner result(s) missing"
        if now - state.opened_at >= x.result_timeout_s:
            return True, f"result timeout {x.result_timeout_s:.0f}s: missing slices are recomputed"
        return False, ""

    def finalize(self) -> None:
        """The results are final: peers gather now. We gather once they have (or the timeout),
        so that a lie their spot checks caught is out of the results before we apply them."""
        state = self.rounds[self.c.book.round]
        state.final, state.final_at = True, time.monotonic()
        self.c.round_closed.notify_all()

    def ready_to_apply(self, now: float) -> tuple[bool, str]:
        state = self.rounds.get(self.c.book.round)
        if state is None or not state.final:
            return False, ""
        alive = {p for p in state.slice_round.peer_ids if (r := self.c.registry.get(p)) is not None and r.state != "gone"}
        waiting = alive - state.gathered
        if not waiting:
            return True, "every live peer gathered"
        if now - state.final_at >= self.c.cfg.exchange.result_timeout_s:
            return True, f"{len(waiting)} peer(s) did not gather within {self.c.cfg.exchange.result_timeout_s:.0f}s"
        return False, ""

    def take_final(self) -> tuple[SliceRound, list[swarm_pb2.Signed], list[tuple[str, int, list[swarm_pb2.Signed]]]]:
        state = self.rounds[self.c.book.round]
        reports, state.reports = state.reports, []
        return state.slice_round, [signed for _, signed in state.results.values()], reports

    # --- gather and apply (no lock held) --------------------------------------------------------

    def gather(self, rnd: SliceRound, results: list[swarm_pb2.Signed],
               reports: list[tuple[str, int, list[swarm_pb2.Signed]]]) -> GatherOutcome:
        """Check the peers' reports (recompute the slice; ban whoever signed a false result and
        drop their results), then gather what is left, with our own spot checks."""
        false: set[bytes] = set()
        for reporter, j, disputed in reports:
            for lie in self._verify_report(rnd, j, disputed):
                false.add(lie.signed.signature)
                with self.c.lock:
                    self.ban_liar(rnd.round, lie, f" (reported by {reporter[:8]})")
        kept = [s for s in results if s.signature not in false]
        outcome = self.exchange.gather(rnd, kept, spot_checks=self.c.cfg.exchange.spot_checks)
        with self.c.lock:
            for lie in outcome.liars:
                self.ban_liar(rnd.round, lie)
        return outcome

    def _verify_report(self, rnd: SliceRound, j: int, disputed: list[swarm_pb2.Signed]) -> list[Lie]:
        try:
            return self.exchange.settle(rnd, j, self.exchange.open_results(rnd, disputed).get(j, []))[1]
        except Exception as exc:  # noqa: BLE001 - a report that cannot be checked changes nothing
            log.info("could not check a report on slice %d of round %d: %s", j, rnd.round, exc)
            return []

    def ban_liar(self, r: int, lie: Lie, note: str = "") -> None:
        self.ban(lie.result.owner, f"false slice result in round {r}",
                 {"kind": "false-result", "round": r, "why": lie.why + note, "signed_result": signed_to_text(lie.signed)})

    def ban(self, peer_id: str, reason: str, evidence: dict[str, Any]) -> None:
        record = self.c.registry.get(peer_id)
        if record is not None and record.banned_reason:
            return
        self.c.registry.ban(peer_id, reason, evidence)
        log.warning("banned %s: %s (evidence kept)", peer_id[:8], reason)

    def applied(self, r: int, param_hash: str) -> None:
        state = self.rounds.get(r)
        if state is not None:
            state.applied_hash = param_hash

    # --- long-poll (takes the lock itself) ------------------------------------------------

    def report_gathered(self, peer_id: str, r: int) -> swarm_pb2.CommitReply:
        """Under the lock: `peer_id` (the verified signer of a gathered report) has gathered round
        r and reported what it found false. ready_to_apply waits for the round's live peers."""
        c = self.c
        record = c.registry.get(peer_id)
        if record is None:
            return c.refuse(Reason.UNKNOWN_PEER, "unknown-peer: Join the run before reporting a gathered round")
        if record.banned_reason:
            return c.refuse(Reason.BANNED, f"banned: {record.banned_reason}")
        state = self.rounds.get(r)
        if r != c.book.round or state is None or not state.final:
            return c.refuse(Reason.STALE_ROUND, f"stale-round: round {r} is not gathering now (current round {c.round})")
        if peer_id in state.gathered:
            return swarm_pb2.CommitReply(accepted=True, reason="already reported", current_round=c.round)
        state.gathered.add(peer_id)
        c.round_closed.notify_all()
        return swarm_pb2.CommitReply(accepted=True, current_round=c.round)

    def wait_results(self, r: int, wait_s: float, until_applied: bool) -> swarm_pb2.SliceResultsReply:
        """Long-poll for round r's final results, or (until_applied) for its θ_{r+1}. A read only:
        a peer says it gathered with a signed ReportGathered (report_gathered)."""
        c = self.c
        deadline = time.monotonic() + max(0.0, min(wait_s, 60.0))
        with c.round_closed:
            while True:
                state = self.rounds.get(r)
                done = state is None or (state.applied_hash if until_applied else state.final)
                remaining = deadline - time.monotonic()
                if done or remaining <= 0:
                    break
                c.round_closed.wait(remaining)
            if state is None:
                return swarm_pb2.SliceResultsReply(ready=False, current_round=c.round, finished=c.finished)
            return swarm_pb2.SliceResultsReply(
                ready=state.final, results=[s for _, s in state.results.values()] if state.final else [],
                applied=bool(state.applied_hash), param_hash=state.applied_hash, current_round=c.round, finished=c.finished,
            )

    # --- evidence from peers (spot checks) ---------------------------------------------------

    def report(self, reporter: str, r: int, j: int, signed_results: list[swarm_pb2.Signed]) -> swarm_pb2.CommitReply:
        """A peer says these signed results for slice j of round r did not recompute. Checked
        (by recomputing) before the round is applied; a report on an applied round is checked
        beside the clock, and bans only."""
        state = self.rounds.get(r)
        if state is None:
            return self.c.refuse("stale-round", "stale-round: that round's inputs are no longer kept")
        if not 0 <= j < self.c.math.layout.num_slices:
            return self.c.refuse("malformed", f"malformed: slice {j} does not exist")
        if not state.applied_hash:
            if len(state.reports) >= 4 * len(state.slice_round.peer_ids):
                return self.c.refuse("busy", "busy: too many reports this round")
            state.reports.append((reporter, j, signed_results))
            return swarm_pb2.CommitReply(accepted=True, reason="will be checked before the round is applied", current_round=self.c.round)
        if not self.reports.acquire(blocking=False):
            return self.c.refuse("busy", "busy: evidence checks are running; report again later")
        threading.Thread(target=self._check_late_report, args=(state.slice_round, j, signed_results, reporter),
                         name="swarmloco-evidence", daemon=True).start()
        return swarm_pb2.CommitReply(accepted=True, reason="checking", current_round=self.c.round)

    def _check_late_report(self, rnd: SliceRound, j: int, signed_results: list[swarm_pb2.Signed], reporter: str) -> None:
        try:
            for lie in self._verify_report(rnd, j, signed_results):
                with self.c.lock:
                    self.ban_liar(rnd.round, lie, f" (reported by {reporter[:8]})")
        finally:
            self.reports.release()
