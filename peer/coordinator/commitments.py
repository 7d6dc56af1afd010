"""Admission of a round's commitments: signed update headers, pushed payloads, equivocation.

A commitment is a peer's signed update header for the open round. It is refused (typed, counted)
when its signer is unknown or banned, the round is not open, it was computed from other
parameters or names another endpoint than the one its peer joined with. A second, different
header in one round, committed or pushed, is equivocation: its signer is banned for the run, both
signed headers kept as evidence. An accepted commitment goes to the exchange mode (admit).
"""

from __future__ import annotations

import logging
import time

from peer.coordinator.registry import EQUIVOCATION_ADVICE
from peer.coordinator.round_book import Commitment
from peer.exchange.coordinator_side import CoordinatorExchange, RoundContext
from protocol.envelope import EnvelopeError, UpdateHeader, signed_to_json
from protocol.reasons import Reason
from protocol.wire import swarm_pb2

log = logging.getLogger("swarmloco.coordinator")
EQUIVOCATION_TEXT = f"equivocation: two different updates in one round; banned: {EQUIVOCATION_ADVICE}"


class Admission:
    def __init__(self, ctx: RoundContext, exchange: CoordinatorExchange, layout_hash: str) -> None:
        self.ctx = ctx
        self.exchange = exchange
        self.layout_hash = layout_hash

    def verify_header(self, signed: swarm_pb2.Signed, round_: int | None = None) -> UpdateHeader:
        header = self.ctx.math.open_update(signed, round_=round_, layout_hash=self.layout_hash)
        record = self.ctx.registry.get(header.peer_id)
        if record is None:
            raise EnvelopeError(Reason.UNKNOWN_PEER, "unknown peer: Join the run before submitting updates")
        if record.banned_reason:
            raise EnvelopeError(Reason.BANNED, f"peer {header.peer_id} is banned from this run: {record.banned_reason}")
        return header

    def check_successor(self, header: UpdateHeader) -> None:
        """A process that took over its key after the previous one committed in this round commits
        from the next round (a second update in one round would be equivocation)."""
        record = self.ctx.registry.get(header.peer_id)
        if record is not None and header.round < record.commit_from_round:
            raise EnvelopeError(Reason.STALE_ROUND, f"a previous process of this identity already committed round {header.round}; "
                                f"this one takes part from round {record.commit_from_round}")

    def verify_pushed_header(self, signed: swarm_pb2.Signed) -> UpdateHeader:
        """Admit a client-mode push before a byte of it is read.

        A push is a commitment too: a second, different signed header for the same round (pushed
        or committed) is equivocation, so one identity cannot make us buffer many payloads per round.
        """
        ctx = self.ctx
        with ctx.lock:
            book = ctx.open.book
            try:
                header = self.verify_header(signed, ctx.open.round)
                self.check_successor(header)
            except EnvelopeError as exc:
                if exc.reason == Reason.WRONG_ROUND:
                    raise EnvelopeError(Reason.STALE_ROUND, str(exc)) from None
                raise
            committed = book.commitments.get(header.peer_id)
            first = book.pushed.get(header.peer_id)
            if first is None and committed is not None:
                first = (committed.header, committed.signed)
            if first is not None and first[0].payload_sha256 != header.payload_sha256:
                self._ban_equivocator(header, first[1], signed)
                raise EnvelopeError(Reason.EQUIVOCATION, EQUIVOCATION_TEXT)
            book.pushed.setdefault(header.peer_id, (header, signed))
            return header

    def submit(self, signed: swarm_pb2.Signed, endpoint: str) -> swarm_pb2.CommitReply:
        ctx, now_open = self.ctx, self.ctx.open
        with ctx.lock:
            book = now_open.book
            if now_open.finished:
                return ctx.refuse(Reason.RUN_FINISHED, "the run has finished", count=False)
            try:
                header = self.verify_header(signed)
                self.check_successor(header)
            except EnvelopeError as exc:
                return ctx.refuse(exc.reason, f"{exc.reason}: {exc}")
            if header.round != now_open.round:
                return ctx.refuse(Reason.STALE_ROUND,
                                  f"stale-round: round {header.round} is not open (current round {now_open.round}); resynchronise")
            record = ctx.registry.get(header.peer_id)
            if record is not None and endpoint != record.endpoint:
                # Only the endpoint the peer joined with: a commitment cannot aim our fetcher elsewhere.
                return ctx.refuse(Reason.WRONG_ENDPOINT, f"wrong-endpoint: joined with {record.endpoint!r}; Join again to change it")
            if header.base_param_hash != now_open.param_hash:
                return ctx.refuse(Reason.WRONG_BASE, "wrong-base: the update was computed from other parameters; download the checkpoint")
            pushed_first = book.pushed.get(header.peer_id)
            if pushed_first is not None and pushed_first[0].payload_sha256 != header.payload_sha256:
                self._ban_equivocator(header, pushed_first[1], signed)
                return ctx.refuse(Reason.EQUIVOCATION, EQUIVOCATION_TEXT)
            existing = book.commitments.get(header.peer_id)
            if existing is not None:
                if existing.header.payload_sha256 == header.payload_sha256:
                    return swarm_pb2.CommitReply(accepted=True, reason="already committed", current_round=now_open.round)
                self._equivocation(existing, header, signed)  # counts it
                return ctx.refuse(Reason.EQUIVOCATION, EQUIVOCATION_TEXT, count=False)
            if book.closed:
                return ctx.refuse(Reason.STALE_ROUND, f"stale-round: round {now_open.round}'s commit phase has closed; resynchronise")
            now = time.monotonic()
            commitment = Commitment(header=header, signed=signed, endpoint=endpoint, arrived=now)
            book.commitments[header.peer_id] = commitment
            if book.first_arrival is None:
                book.first_arrival = now
            if record is not None:
                record.state = "committed"
            pushed = ctx.store.get(header.payload_sha256)
        self.exchange.admit(commitment, pushed)
        with ctx.round_closed:  # the clock may close the commit phase now (peer/coordinator/main.py)
            ctx.round_closed.notify_all()
        return swarm_pb2.CommitReply(accepted=True, current_round=now_open.round)

    def _equivocation(self, existing: Commitment, header: UpdateHeader, signed: swarm_pb2.Signed) -> None:
        self.ctx.registry.reject(Reason.EQUIVOCATION)
        self._ban_equivocator(header, existing.signed, signed)
        existing.status, existing.reason, existing.update = "excluded", str(Reason.EQUIVOCATION), None

    def _ban_equivocator(self, header: UpdateHeader, first: swarm_pb2.Signed, second: swarm_pb2.Signed) -> None:
        """Ban for the run; keep both signed headers: anyone can check the two signatures."""
        evidence = {
            "kind": "equivocation",
            "round": header.round,
            "first_header": signed_to_json(first),
            "second_header": signed_to_json(second),
        }
        book = self.ctx.open.book
        self.ctx.registry.ban(header.peer_id, f"equivocation in round {header.round}", evidence)
        book.excluded[header.peer_id] = str(Reason.EQUIVOCATION)  # plain text: it reaches the checkpoint
        existing = book.commitments.get(header.peer_id)
        if existing is not None:
            existing.status, existing.reason, existing.update = "excluded", str(Reason.EQUIVOCATION), None
        log.warning("peer %s equivocated in round %d: banned, evidence kept", header.peer_id[:8], header.round)
