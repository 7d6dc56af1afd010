"""The coordinator's side of an exchange mode, and the narrow round context every side works in.

The coordinator's round clock is the same for every mode: admit commitments, close the commit
phase, sign a manifest, apply the round, open the next. What differs is one `CoordinatorExchange`
(peer/exchange/modes.py picks it by `exchange.mode`):

  admit(commitment, pushed)        an accepted commitment (+ a payload a client-mode peer pushed)
  holders(commitment, public)      who serves an update, as the signed manifest lists it
  manifest(book, entries, base)    the manifest to sign (the sliced one also carries the owner draw)
  commits_closed(...)              the commit phase closed (manifest signed): apply now, or later?
  ready_to_apply(now)              the clock asks, commit phase closed: may the round be applied now?
  aggregate(book, params)          θ_{r+1} from θ_r, without the lock (the slow part)
  applied(book, aggregated, hash)  under the lock, once θ_{r+1} is adopted: record who counted
  status()                         the mode's fields of `swarmloco status --json`
  the slice-result RPCs            SubmitSliceResult, GetSliceResults, ReportEvidence, ReportGathered:
                                   refused (FAILED_PRECONDITION) by a mode without slice results

A mode sees the coordinator only through `RoundContext`: its lock, registry, math, wire and the
open round (`OpenRound`), never the Coordinator object itself.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import grpc
import torch

from peer.coordinator.registry import PeerRegistry
from peer.coordinator.round_book import Commitment, RoundBook
from peer.run.config import RunConfig
from peer.run.round_math import RoundMath
from protocol.envelope import ManifestEntry, RoundManifest
from protocol.identity import Identity
from protocol.payload_fetch import ChannelPool
from protocol.payload_store import PayloadStore, StoredPayload
from protocol.rpc_errors import RpcAbort, refusal_for
from protocol.wire import swarm_pb2

log = logging.getLogger("swarmloco.coordinator")
NO_SLICE_RESULTS = "this run exchanges all-to-all (exchange.mode); it has no slice results"


@dataclass(slots=True)
class OpenRound:
    """Where the run stands: the open round, its book, θ_r and its hash. The round clock moves it
    forward, under the coordinator's lock; everyone else reads it under that lock."""

    round: int
    book: RoundBook
    params: torch.Tensor  # θ_r, (d,) float32
    param_hash: str = ""
    finished: bool = False


@dataclass(frozen=True, slots=True)
class RoundContext:
    """What the coordinator's parts (admission, clock, exchange mode) share of it, and no more."""

    cfg: RunConfig
    math: RoundMath
    identity: Identity
    lock: threading.RLock
    round_closed: threading.Condition  # on `lock`: notified when a round closes, results land, a round is applied
    registry: PeerRegistry
    store: PayloadStore
    channels: ChannelPool
    fetchers: ThreadPoolExecutor
    open: OpenRound
    endpoint: Callable[[], str] = field(default=lambda: "")  # HOST:PORT of our gRPC server, once bound

    def refuse(self, reason: str, message: str, *, count: bool = True) -> swarm_pb2.CommitReply:
        """A refused request: `reason` is the counted name and picks the typed refusal."""
        reason = str(reason)  # a Reason's text: what is counted and kept is plain (checkpoints load no enums)
        if count:
            self.registry.reject(reason)
        return swarm_pb2.CommitReply(accepted=False, reason=message, refusal=refusal_for(reason), current_round=self.open.round)

    def exclude(self, commitment: Commitment, reason: str, message: str) -> None:
        """Leave a commitment out of its round (takes the lock): counted, shown in status."""
        reason = str(reason)  # plain text in the book, the manifest and the checkpoint's history
        with self.lock:
            self.registry.reject(reason)
            commitment.status, commitment.reason = "excluded", reason
            if commitment.header.round == self.open.book.round:
                self.open.book.excluded[commitment.header.peer_id] = reason
            record = self.registry.get(commitment.header.peer_id)
            if record is not None:
                record.exclude(commitment.header.round, reason, message)  # unreachable: the peer is told what to do
        log.warning("excluded %s from round %d: %s", commitment.header.peer_id[:8], commitment.header.round, message)


@dataclass(slots=True)
class Aggregated:
    """A round's outcome, computed by aggregate() without the lock."""

    params: torch.Tensor  # θ_{r+1}
    used: list[str]  # the updates that counted
    excluded: dict[str, str] = field(default_factory=dict)  # left out by the exchange itself (the book's exclusions come on top)
    detail: Any = None  # the mode's own record of it (its applied() reads it)


class CoordinatorExchange(ABC):
    """The coordinator's side of one exchange mode. Methods marked "under the lock" are called
    with ctx.lock held; aggregate() never is."""

    name: ClassVar[str]
    # A takeover continues this mode's round in flight from its signed manifest and the owners'
    # signed results (Coordinator.continue_round): its coordinator holds none of the round's work.
    # A mode whose coordinator fetched and verified the updates itself reopens the round instead.
    continues_in_flight: ClassVar[bool] = False

    def __init__(self, ctx: RoundContext) -> None:
        self.ctx = ctx

    # --- commitments ---------------------------------------------------------------------------

    @abstractmethod
    def admit(self, commitment: Commitment, pushed: StoredPayload | None) -> None:
        """A commitment was accepted (no lock held): verify it, fetch it, or exclude it."""

    # --- the manifest (under the lock) ---------------------------------------------------------

    @abstractmethod
    def holders(self, commitment: Commitment, public: list[str]) -> list[str]:
        """Endpoints the manifest lists as serving this update; `public`: the round's serving peers."""

    @abstractmethod
    def manifest(self, book: RoundBook, entries: list[ManifestEntry], base_param_hash: str) -> RoundManifest:
        """The round's manifest, before it is signed."""

    @abstractmethod
    def commits_closed(self, book: RoundBook, manifest: RoundManifest, signed: swarm_pb2.Signed, verified: list[str]) -> bool:
        """The commit phase closed and its manifest is signed: True to apply the round now (the
        closer calls aggregate()), False when the clock applies it later (ready_to_apply)."""

    # --- applying the round ----------------------------------------------------------------------

    @abstractmethod
    def ready_to_apply(self, now: float) -> tuple[bool, str]:
        """Under the lock, the commit phase closed: (apply now?, why)."""

    @abstractmethod
    def aggregate(self, book: RoundBook, params: torch.Tensor) -> Aggregated:
        """θ_{r+1} from θ_r (`params`, left as it is), without the lock."""

    def applied(self, book: RoundBook, aggregated: Aggregated, param_hash: str) -> None:
        """Under the lock: θ_{r+1} (hash `param_hash`) is the coordinator's; round book.round + 1 is open."""

    def close(self) -> None:
        """Release the mode's own threads: the coordinator stopped, or was demoted and lives on as a
        standby (a new active builds a new mode)."""

    @abstractmethod
    def status(self) -> dict[str, Any]:
        """The `exchange` object of `swarmloco status --json`."""

    # --- the slice-result RPCs: a mode without slice results refuses them --------------------------

    def _no_slice_results(self) -> RpcAbort:
        return RpcAbort(grpc.StatusCode.FAILED_PRECONDITION, NO_SLICE_RESULTS, swarm_pb2.MALFORMED)

    def submit_result(self, signed: swarm_pb2.Signed) -> swarm_pb2.CommitReply:
        """SubmitSliceResult: an owner's signed slice result (takes the lock)."""
        raise self._no_slice_results()

    def submit_followed(self, batches: Sequence[swarm_pb2.Signed]) -> None:
        """A takeover: the owners' batches of the round in flight as the previous active's
        GetSliceResults gave them (in its order: packed ones may refer to earlier ones)."""
        for signed in batches:
            self.submit_result(signed)

    def wait_results(self, r: int, wait_s: float, until_applied: bool) -> swarm_pb2.SliceResultsReply:
        """GetSliceResults: a long-poll, and a read only (takes the lock)."""
        raise self._no_slice_results()

    def results_news(self, r: int, until_applied: bool) -> bool:
        """Whether wait_results(r, ...) has its answer now: reads only, without the lock, and only
        ever turns true (an async long-poll's predicate). Here: at once (the answer is the refusal)."""
        return True

    def report_evidence(self, signed: swarm_pb2.Signed) -> swarm_pb2.CommitReply:
        """ReportEvidence: a peer's signed report of results that did not recompute (takes the lock)."""
        raise self._no_slice_results()

    def report_gathered(self, fields: dict[str, Any], signer: str) -> swarm_pb2.CommitReply:
        """ReportGathered: a verified signed body (protocol.envelope.GATHERED_TAG) and its signer (takes the lock)."""
        raise self._no_slice_results()

    def gathered_elsewhere(self) -> None:
        """Under the lock, after a takeover that continued the open round with the results the
        previous active had made final (peer/coordinator/continuation.py): its peers gathered them
        and reported there, so the round is final and applied once we have gathered, unawaited."""
        raise self._no_slice_results()
