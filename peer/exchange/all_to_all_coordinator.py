"""The coordinator's side of the all-to-all exchange: it pulls and verifies every update itself.

Each committed payload is fetched from its author (or taken as pushed), checked (size, sha256,
decode, finite values) and kept; the manifest lists only verified updates, with every node that
holds one (the author, us, the round's other public peers, who re-serve what they verify). Once
the commit phase closes the round is applied at once: the robust rule over the n updates, without
the lock.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch

from peer.coordinator.round_book import Commitment, RoundBook
from peer.exchange.coordinator_side import Aggregated, CoordinatorExchange
from peer.run.round_math import UpdateRejected
from protocol.channels import TRANSFER_DEADLINE
from protocol.envelope import EnvelopeError, ManifestEntry, RoundManifest
from protocol.payload_fetch import fetch_payload
from protocol.payload_store import StoredPayload
from protocol.reasons import Reason, count_for_cause
from protocol.wire import swarm_pb2


class AllToAllCoordinator(CoordinatorExchange):
    name = "all-to-all"

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._listed: dict[int, list[str]] = {}  # round -> the verified updates its manifest lists

    def admit(self, commitment: Commitment, pushed: StoredPayload | None) -> None:
        if pushed is not None:
            self._verify_payload(commitment, pushed.payload)
        elif commitment.endpoint:
            self.ctx.fetchers.submit(self._fetch, commitment)
        else:
            self.ctx.exclude(commitment, Reason.NO_PAYLOAD, "client-mode peer committed without pushing its payload first")

    def _fetch(self, commitment: Commitment) -> None:
        try:
            # Bounded by the payload's size (at >= 256 KiB/s), so a slow author cannot hold a fetch thread for long.
            seconds = min(TRANSFER_DEADLINE.total_seconds(), 10.0 + commitment.header.payload_size / (256 << 10))
            payload = fetch_payload(self.ctx.channels, [commitment.endpoint], commitment.header, deadline=timedelta(seconds=seconds))
        except Exception as exc:  # unreachable author, broken stream: excluded, the round goes on
            self.ctx.exclude(commitment, Reason.UNREACHABLE, f"could not fetch the payload from {commitment.endpoint}: {exc}")
            return
        self._verify_payload(commitment, payload)

    def _verify_payload(self, commitment: Commitment, payload: bytes) -> None:
        """Decode and admit a payload whose sha256 already matched the commitment's (both callers
        got it through receive_chunks against that hash), so only its size is left to check."""
        ctx = self.ctx
        try:
            if len(payload) != commitment.header.payload_size:
                raise EnvelopeError(
                    Reason.SIZE_MISMATCH, f"payload has {len(payload)} bytes, header declares {commitment.header.payload_size}"
                )
            update = ctx.math.decode(payload, commitment.header.round)
        except (EnvelopeError, UpdateRejected) as exc:
            ctx.exclude(commitment, exc.reason, str(exc))
            return
        ctx.store.put(StoredPayload(commitment.header, commitment.signed, payload), verified=True)
        with ctx.lock:
            if commitment.status == "pending" and commitment.header.round == ctx.open.book.round:
                commitment.status, commitment.update = "verified", update

    def holders(self, commitment: Commitment, public: list[str]) -> list[str]:
        # the author, ourselves, and the round's other public peers (who re-serve what they verify)
        own = [commitment.endpoint] if commitment.endpoint else []
        return own + [self.ctx.endpoint()] + [e for e in public if e != commitment.endpoint]

    def manifest(self, book: RoundBook, entries: list[ManifestEntry], base_param_hash: str) -> RoundManifest:
        return RoundManifest(run_id=self.ctx.cfg.run_id, round=book.round, base_param_hash=base_param_hash, entries=entries,
                             excluded=dict(book.excluded))

    def commits_closed(self, book: RoundBook, manifest: RoundManifest, signed: swarm_pb2.Signed, verified: list[str]) -> bool:
        self._listed = {book.round: verified}  # late commitments are refused while the aggregate is computed
        return True

    def ready_to_apply(self, now: float) -> tuple[bool, str]:
        return False, ""  # the closer applies the round itself (commits_closed)

    def aggregate(self, book: RoundBook, params: torch.Tensor) -> Aggregated:
        """The robust rule over the round's verified updates (the slow part), on a copy of θ_r."""
        verified = self._listed[book.round]
        updates = [book.commitments[p].update for p in verified]
        params = params.clone()
        report = self.ctx.math.apply(params, updates, round_=book.round, excluded_for_cause=count_for_cause(book.excluded))
        return Aggregated(params=params, used=verified, detail=report)

    def applied(self, book: RoundBook, aggregated: Aggregated, param_hash: str) -> None:
        self.ctx.registry.record_aggregation(book.round, aggregated.used, aggregated.detail)

    def status(self) -> dict[str, Any]:
        return {"mode": self.name, "slices": None, "replicas": None}
