"""The round clock: when the commit phase closes, the signed manifest, applying the round, the next.

A round closes (round_book.should_close) on its quorum and either every expected peer or the
adaptive deadline. Closing signs the manifest under the lock; the exchange mode then says whether
the round is applied at once (all-to-all: the robust rule over the verified updates) or later,
when the clock finds it ready (sliced: the owners' results are final and the peers gathered).
Applying runs without the lock; θ_{r+1} is adopted, and round r + 1 opened, under it.

Nothing is signed or adopted without the lease (peer/coordinator/lease.py): the check is made under
the lock, right before. A round that is due while the lease is not held stays open; one whose
aggregate is ready waits, off the lock, until the lease is confirmed again or a rival took the run
(Demoted: the coordinator steps down with the round unapplied). Every manifest carries the term.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

from peer.coordinator.lease import ALWAYS_HELD, ActGuard, Halted
from peer.coordinator.round_book import AdaptiveDeadline, RoundBook, RoundResult, should_close
from peer.exchange.coordinator_side import CoordinatorExchange, RoundContext
from peer.coordinator.phase_window import PhaseWindow
from peer.run.work_math import WorkLedger, aligned_overlap
from peer.learn.model import param_hash
from peer.run.faults import fail_point
from protocol.envelope import ManifestEntry, RoundManifest, sign_manifest, signed_to_json
from protocol.manifest_wire import CompactManifests
from protocol.reasons import Reason, count_for_cause
from protocol.wire import swarm_pb2

KEEP_MANIFESTS = 4  # rounds back
LEASE_WAIT_S = 0.5  # a round ready to apply while the lease is not held: look again this often


class RoundClock:
    """`sign_state()` signs the open round's state (under the lock); `persist(result)` evaluates
    θ_{r+1} and writes the checkpoint (the clock thread, no lock)."""

    def __init__(self, ctx: RoundContext, exchange: CoordinatorExchange, *, sign_state: Callable[[], swarm_pb2.Signed],
                 persist: Callable[[RoundResult], RoundResult], start_wait_until: float, term: Callable[[], int] = lambda: 0,
                 halted: Callable[[], bool] = lambda: False) -> None:
        self.ctx = ctx
        self.exchange = exchange
        self.sign_state = sign_state
        self.persist = persist
        self.start_wait_until = start_wait_until
        self.term = term  # the coordinator's term, signed into every manifest
        self.halted = halted  # the coordinator is stopping: a wait for the lease gives up (Halted)
        self.lease: ActGuard = ALWAYS_HELD  # the active's lease (main.py sets the DHT one)
        self.deadline = AdaptiveDeadline(ctx.cfg.rounds)
        self.manifests: dict[int, swarm_pb2.Signed] = {}
        self.compact_manifests = CompactManifests()  # as they travel to peers that ask (protocol/manifest_wire.py)
        self.work = WorkLedger(ctx.math)  # each peer's claimed and accepted work (status, the history cap)
        self.phase_window = PhaseWindow(ctx.cfg.inner.steps)  # overlapped rounds' window (aligned_overlap)

    def tick(self) -> RoundResult | None:
        """Close the open round if it is time, apply it once it is ready; returns what happened when it was applied."""
        ctx, now_open = self.ctx, self.ctx.open
        with ctx.lock:
            if now_open.finished:
                return None
            ctx.registry.mark_gone()
            now = time.monotonic()
            expected = ctx.registry.active(now_open.round)
            if now_open.round == 0 and now < self.start_wait_until and len(expected) < ctx.cfg.rounds.expected_peers:
                return None  # let the expected peers arrive before round 1 can close
            book = now_open.book
            if book.closed:
                ready, why = self.exchange.ready_to_apply(now)
            else:
                ready, why = should_close(book, expected, self.deadline.current, ctx.cfg.rounds.min_peers, now)
                if ready and not self.lease.holds():
                    return None  # the lease may lapse: sign nothing (a standby may be taking over)
                ready = ready and self._close_commits()
            if not ready:
                return None
        return self._apply(book, why)

    def close_round(self, why: str) -> RoundResult | None:
        """Close the commit phase now: sign the manifest; if the exchange mode applies at once
        (all-to-all), also aggregate and open the next round (else tick() applies it later)."""
        with self.ctx.lock:
            if not self.lease.holds():
                return None
            book = self.ctx.open.book
            apply_now = self._close_commits()
        return self._apply(book, why) if apply_now else None

    def while_held(self, act: Callable[[], RoundResult | None]):
        """act() under the lock once the lease is held; while it is not, wait off the lock (a
        coordinator that cannot renew its lease acts on nothing). Demoted when a rival took the
        run, Halted when the coordinator stops meanwhile."""
        while True:
            with self.ctx.lock:
                if self.lease.holds():
                    return act()
            if self.halted():
                raise Halted("the coordinator stopped while its lease was not held")
            self.lease.wait_held(LEASE_WAIT_S)

    def _close_commits(self) -> bool:
        """Under the lock: sign the open round's manifest; True when the round is applied now."""
        book, base = self.ctx.open.book, self.ctx.open.param_hash
        verified = book.verified()
        for peer_id, c in book.commitments.items():  # still pending at the deadline: too late
            if c.status == "pending":
                c.status, c.reason = "excluded", str(Reason.LATE)
                book.excluded[peer_id] = str(Reason.LATE)
        manifest = self.exchange.manifest(book, self._manifest_entries(book, verified), base)
        history = self.work.history([e.peer_id for e in manifest.entries])  # the owners' history cap (window runs)
        listed = {e.peer_id: book.commitments[e.peer_id] for e in manifest.entries}
        window_ms = (self.phase_window.next(book.round, {p: (c.arrived, c.header.inner_steps) for p, c in listed.items()})
                     if aligned_overlap(self.ctx.cfg) else 0)
        manifest = dataclasses.replace(manifest, last=book.round + 1 >= self.ctx.cfg.rounds.rounds, term=self.term(),
                                       work_history=history, window_ms=window_ms)
        signed = self.manifests[book.round] = sign_manifest(self.ctx.identity, manifest)
        claims = {p: (c.header.inner_steps, c.header.tokens) for p, c in listed.items()}
        self.ctx.registry.record_work(book.round, self.work.close(claims, history, count_for_cause(book.excluded)))
        fail_point("manifest-signed", book.round)
        for old in [r for r in self.manifests if r < book.round - KEEP_MANIFESTS]:
            del self.manifests[old]
        book.closed = True  # late commitments are refused from now on
        return self.exchange.commits_closed(book, manifest, signed, verified)

    def continue_manifest(self, book: RoundBook, manifest: RoundManifest, *, continues: str, continues_term: int) -> None:
        """Under the lock, after a takeover: the round in flight goes on under the manifest the
        previous active signed for it (`book` holds its commitments), signed again in our term as a
        continuation of that signed body (`continues`, its sha256, signed in `continues_term`): the
        owners' results stay bound to it, and the exchange mode collects them from here."""
        self.phase_window.resume(manifest.window_ms)  # the swarm's phases keep their window across the takeover
        continued = dataclasses.replace(manifest, term=self.term(), continues=continues, continues_term=continues_term)
        signed = self.manifests[book.round] = sign_manifest(self.ctx.identity, continued)
        book.closed = book.continued = True
        self.exchange.commits_closed(book, continued, signed, book.verified())
        self.ctx.round_closed.notify_all()

    def _manifest_entries(self, book: RoundBook, verified: list[str]) -> list[ManifestEntry]:
        public = [c.endpoint for p, c in sorted(book.commitments.items()) if c.endpoint and p in verified]
        entries = []
        for peer_id in verified:
            c = book.commitments[peer_id]
            entries.append(ManifestEntry(peer_id=peer_id, payload_sha256=c.header.payload_sha256, payload_size=c.header.payload_size,
                                         header=signed_to_json(c.signed), holders=self.exchange.holders(c, public),
                                         serves=bool(c.endpoint)))
        return entries

    def _apply(self, book: RoundBook, why: str) -> RoundResult:
        """θ_{r+1} computed by the exchange mode without the lock, adopted under it; then persisted."""
        aggregated = self.exchange.aggregate(book, self.ctx.open.params)

        def adopt() -> RoundResult:
            self.ctx.open.params = aggregated.params
            result = self._advance(book, aggregated.used, why, {**aggregated.excluded, **book.excluded})
            self.exchange.applied(book, aggregated, self.ctx.open.param_hash)
            return result

        return self.persist(self.while_held(adopt))

    def _advance(self, book: RoundBook, used: list[str], why: str, excluded: dict[str, str]) -> RoundResult:
        """θ_{r+1} is ctx.open.params: record the round, open the next."""
        now_open = self.ctx.open
        arrivals = [c.arrived for c in book.commitments.values()]
        if len(arrivals) > 1 and not book.continued:
            self.deadline.observe(max(arrivals) - min(arrivals))
        now_open.round += 1
        now_open.param_hash = param_hash(now_open.params)
        result = RoundResult(
            round=book.round,
            updates=len(used),
            excluded=excluded,
            seconds=time.monotonic() - book.opened_at,
            val_loss=float("nan"),  # persist evaluates, off the lock
            param_hash=now_open.param_hash,
            close_reason=why,
        )
        now_open.book = RoundBook(round=now_open.round)
        if now_open.round >= self.ctx.cfg.rounds.rounds:
            now_open.finished = True
        self.sign_state()
        self.ctx.round_closed.notify_all()
        return result

    def manifest_news(self, round_: int) -> bool:
        """Whether a GetManifest for round_ has its answer (the manifest, or a round past it, or the
        end). Reads only, and only ever turns true: a long-poll on the server's loop asks it without
        the lock (protocol/async_wait.py)."""
        now_open = self.ctx.open
        return round_ in self.manifests or round_ < now_open.round or now_open.finished

    def wait_manifest(self, round_: int, wait_s: float, *, compact: bool = False) -> swarm_pb2.ManifestReply:
        """compact: the manifest's body zlib-compressed (the caller asked: ManifestRequest.compact)."""
        now_open = self.ctx.open
        deadline = time.monotonic() + max(0.0, min(wait_s, 60.0))
        with self.ctx.round_closed:
            while not self.manifest_news(round_):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self.ctx.round_closed.wait(remaining)
            manifest = self.manifests.get(round_)
            current_round, finished = now_open.round, now_open.finished
        if manifest is not None and compact:
            manifest = self.compact_manifests.of(manifest)  # off the lock: compressed once a manifest
        return swarm_pb2.ManifestReply(ready=manifest is not None, manifest=manifest, current_round=current_round, finished=finished)
