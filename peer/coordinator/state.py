"""The coordinator: bootstraps the DHT, admits peers, keeps the round clock, signs manifests.

Sliced exchange (default): it lists the committed headers and the owner draw in the signed
manifest without downloading the updates, collects the owners' signed results
(peer/coordinator/slice_rounds.py) and gathers the aggregate like a peer. All-to-all: it pulls
each committed payload, verifies it (size, sha256, decode, finite values) and lists only verified
updates. Either way it holds the authoritative θ_{r+1}, its hash, and the checkpoint and state
parts that late joiners download. It never trains.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any


from peer.run import checkpoint, state_sync
from peer.run.config import RunConfig
from peer.run.faults import fail_point
from peer.learn.data import load_corpus, validation_batches
from peer.learn.model import build_model, flat_params, layout_hash, load_flat_params, param_hash
from peer.coordinator.registry import PeerRegistry
from peer.coordinator.slice_rounds import SlicedRounds
from peer.coordinator.round_book import AdaptiveDeadline, Commitment, RoundBook, RoundResult, result_dict, should_close
from peer.run.round_math import RoundMath, UpdateRejected
from protocol.reasons import count_for_cause
from peer.run.slice_exchange import sliced_manifest
from peer.learn.training import evaluate
from protocol.wire import swarm_pb2
from protocol.accounting import ByteCounter
from protocol.channels import TRANSFER_DEADLINE
from protocol.envelope import EnvelopeError, ManifestEntry, RoundManifest, UpdateHeader, sign_manifest, signed_to_json
from protocol.identity import Identity
from protocol.payload_fetch import ChannelPool, fetch_payload
from protocol.payload_service import PayloadStore, StoredPayload
from protocol.rpc_errors import refusal_for
from protocol.run_state import RunState, sign_run_state

log = logging.getLogger("swarmloco.coordinator")
EQUIVOCATION_TEXT = "equivocation: two different updates in one round; banned"


def with_coordinator_key(cfg: RunConfig, fingerprint: str) -> RunConfig:
    """The run config with this coordinator's key listed among the run's coordinators (peers accept
    manifests and states from listed keys only; a standby is listed by the active one's operator)."""
    listed = cfg.control.coordinators
    if fingerprint in listed:
        return cfg
    return dataclasses.replace(cfg, control=dataclasses.replace(cfg.control, coordinators=sorted([*listed, fingerprint])))


class Coordinator:
    """Round state of a run. Thread-safe: gRPC handlers and the clock thread share it."""

    def __init__(
        self,
        cfg: RunConfig,
        identity: Identity,
        *,
        endpoint: str = "",
        checkpoint_path: str | Path | None = None,
        counter: ByteCounter | None = None,
        term: int = 0,
    ) -> None:
        self.cfg = cfg = with_coordinator_key(cfg, identity.peer_id)
        self.identity = identity
        self.term = term  # bumped by every takeover (peer/coordinator/standby.py)
        self.standby_endpoints: list[str] = []  # the run's other coordinators, for peers' failover
        self.endpoint = endpoint  # HOST:PORT of our gRPC server, set once it is bound
        self.initial_peers: list[str] = []
        self.checkpoint_path = Path(checkpoint_path) if checkpoint_path else None
        self.counter = counter or ByteCounter(identity.peer_id)
        self.lock = threading.RLock()
        self.round_closed = threading.Condition(self.lock)

        self.model = build_model(cfg.model, cfg.seed)
        self.layout_hash = layout_hash(self.model)
        self.params = flat_params(self.model)  # θ_r, (d,) float32
        self.numel = self.params.numel()
        self.math = RoundMath(cfg, self.numel)
        self.max_payload_bytes = min(cfg.max_payload_bytes, self.math.codec.max_encoded_size(self.numel))
        self.round = 0
        self.finished = False
        corpus = load_corpus(cfg.data, seq_len=cfg.model.seq_len)
        self.val_batches = validation_batches(corpus, cfg.data.batch_size, cfg.model.seq_len, cfg.data.val_batches)

        self.registry = PeerRegistry(cfg.rounds.peer_timeout_s)
        self.store = PayloadStore(keep_rounds=2)
        self.deadline = AdaptiveDeadline(cfg.rounds)
        self.book = RoundBook(round=0)
        self.manifests: dict[int, swarm_pb2.Signed] = {}
        self.states: dict[int, swarm_pb2.Signed] = {}  # round -> signed RunState (protocol/run_state.py)
        self.history: list[RoundResult] = []
        self.channels = ChannelPool(self.counter)
        self.fetchers = ThreadPoolExecutor(max_workers=8, thread_name_prefix="swarmloco-fetch")
        # Sliced exchange: owners aggregate; we only collect their signed results and gather.
        self.sliced = SlicedRounds(self) if self.math.sliced else None
        self.started_at = time.monotonic()
        self.start_wait_until = time.monotonic() + cfg.rounds.start_timeout_s

        if self.checkpoint_path is not None and self.checkpoint_path.exists():
            self._restore(checkpoint.load(self.checkpoint_path))
        self.param_hash = param_hash(self.params)
        self.initial_val_loss = self.evaluate()
        self.checkpoint_bytes = b""
        self._snapshot()
        self.sign_state()

    # --- state ---------------------------------------------------------------------------

    def _restore(self, ckpt: checkpoint.Checkpoint) -> None:
        if ckpt.config_hash != self.cfg.config_hash():
            raise checkpoint.CheckpointError(
                f"{self.checkpoint_path} was written by a different run config; "
                "use the same --config or another --checkpoint path"
            )
        self.params = ckpt.params.clone()
        self.math.load_global_state_dict(ckpt.outer_state)
        self.round = ckpt.round
        self.book = RoundBook(round=self.round)
        self.history = [RoundResult(**r) for r in ckpt.extra.get("history", [])]
        self.registry.restore(ckpt.extra.get("peers", []), joined_round=self.round)
        self.start_wait_until = time.monotonic()  # peers that were in the run come back on their own
        log.info("restored round %d from %s", self.round, self.checkpoint_path)

    def _snapshot(self) -> None:
        """Serialize θ_r for late joiners and write it to disk atomically."""
        config_hash, outer_state = self.cfg.config_hash(), self.math.global_state_dict()
        ckpt = checkpoint.Checkpoint(
            round=self.round,
            params=self.params,
            param_hash=self.param_hash,
            config_hash=config_hash,
            outer_state=outer_state,
            # Peers, bans and evidence survive a coordinator restart: a banned peer stays banned,
            # and the peers of the run are awaited again instead of the first one back closing the round.
            # The run config itself too, so `swarmloco export/sample` need no --config (its hash is above).
            extra={"history": [result_dict(r) for r in self.history], "peers": self.registry.to_dicts(), "config": self.cfg.to_dict()},
        )
        self.checkpoint_bytes = checkpoint.to_bytes(ckpt)
        # The same state as parts every in-sync peer also serves: joiners fetch it from many of them.
        self.state_manifest = state_sync.publish(
            self.store, self.identity, run_id=self.cfg.run_id, config_hash=config_hash, round_=self.round,
            param_hash=self.param_hash, params=self.params, global_state=outer_state,
            layout=self.math.layout, sign=True)
        if self.checkpoint_path is not None:
            checkpoint.write_atomic(self.checkpoint_path, self.checkpoint_bytes)

    def sign_state(self) -> swarm_pb2.Signed:
        """Sign "round r is open on θ_r with this hash" (final once the run is done): what peers
        compare their own θ with, and what a downloaded checkpoint must match. Kept for a few
        rounds, so a peer that asks a little late still gets the state of its round."""
        state = RunState(run_id=self.cfg.run_id, config_hash=self.cfg.config_hash(), term=self.term, role="active",
                         round=self.round, param_hash=self.param_hash, finished=self.finished,
                         active_endpoint=self.endpoint, timestamp=time.time())
        signed = self.states[self.round] = sign_run_state(self.identity, state)
        for old in [r for r in self.states if r < self.round - 8]:
            del self.states[old]
        return signed

    def state_at(self, round_: int | None = None) -> swarm_pb2.Signed | None:
        with self.lock:
            return self.states.get(self.round if round_ is None else round_)

    def evaluate(self) -> float:
        load_flat_params(self.model, self.params)
        return evaluate(self.model, self.val_batches)

    def verify_header(self, signed: swarm_pb2.Signed, round_: int | None = None) -> UpdateHeader:
        header = self.math.open_update(signed, round_=round_, layout_hash=self.layout_hash)
        record = self.registry.get(header.peer_id)
        if record is None:
            raise EnvelopeError("unknown-peer", "unknown peer: Join the run before submitting updates")
        if record.banned_reason:
            raise EnvelopeError("banned", f"peer {header.peer_id} is banned from this run: {record.banned_reason}")
        return header

    def verify_pushed_header(self, signed: swarm_pb2.Signed) -> UpdateHeader:
        """Admit a client-mode push before a byte of it is read.

        A push is a commitment too: a second, different signed header for the same round (pushed
        or committed) is equivocation, so one identity cannot make us buffer many payloads per round.
        """
        with self.lock:
            try:
                header = self.verify_header(signed, self.round)
            except EnvelopeError as exc:
                if exc.reason == "wrong-round":
                    raise EnvelopeError("stale-round", str(exc)) from None
                raise
            committed = self.book.commitments.get(header.peer_id)
            first = self.book.pushed.get(header.peer_id)
            if first is None and committed is not None:
                first = (committed.header, committed.signed)
            if first is not None and first[0].payload_sha256 != header.payload_sha256:
                self._ban_equivocator(header, first[1], signed)
                raise EnvelopeError("equivocation", EQUIVOCATION_TEXT)
            self.book.pushed.setdefault(header.peer_id, (header, signed))
            return header

    # --- commitments ---------------------------------------------------------------------

    def refuse(self, reason: str, message: str, *, count: bool = True) -> swarm_pb2.CommitReply:
        """A refused commitment: `reason` is the counted name and picks the typed refusal."""
        if count:
            self.registry.reject(reason)
        return swarm_pb2.CommitReply(accepted=False, reason=message, refusal=refusal_for(reason), current_round=self.round)

    def submit(self, signed: swarm_pb2.Signed, endpoint: str) -> swarm_pb2.CommitReply:
        with self.lock:
            if self.finished:
                return self.refuse("run-finished", "the run has finished", count=False)
            try:
                header = self.verify_header(signed)
            except EnvelopeError as exc:
                return self.refuse(exc.reason, f"{exc.reason}: {exc}")
            if header.round != self.round:
                return self.refuse(
                    "stale-round", f"stale-round: round {header.round} is not open (current round {self.round}); resynchronise"
                )
            record = self.registry.get(header.peer_id)
            if record is not None and endpoint != record.endpoint:
                # Only the endpoint the peer joined with: a commitment cannot aim our fetcher elsewhere.
                return self.refuse("wrong-endpoint", f"wrong-endpoint: joined with {record.endpoint!r}; Join again to change it")
            if header.base_param_hash != self.param_hash:
                return self.refuse("wrong-base", "wrong-base: the update was computed from other parameters; download the checkpoint")
            pushed_first = self.book.pushed.get(header.peer_id)
            if pushed_first is not None and pushed_first[0].payload_sha256 != header.payload_sha256:
                self._ban_equivocator(header, pushed_first[1], signed)
                return self.refuse("equivocation", EQUIVOCATION_TEXT)
            existing = self.book.commitments.get(header.peer_id)
            if existing is not None:
                if existing.header.payload_sha256 == header.payload_sha256:
                    return swarm_pb2.CommitReply(accepted=True, reason="already committed", current_round=self.round)
                self._equivocation(existing, header, signed)  # counts it
                return self.refuse("equivocation", EQUIVOCATION_TEXT, count=False)
            if self.book.closed:
                return self.refuse("stale-round", f"stale-round: round {self.round}'s commit phase has closed; resynchronise")
            now = time.monotonic()
            commitment = Commitment(header=header, signed=signed, endpoint=endpoint, arrived=now)
            self.book.commitments[header.peer_id] = commitment
            if self.book.first_arrival is None:
                self.book.first_arrival = now
            record = self.registry.get(header.peer_id)
            if record is not None:
                record.state = "committed"
            pushed = self.store.get(header.payload_sha256)
        if self.sliced is not None:
            # Sliced: the owners fetch, verify and decode; we hold only what client-mode peers pushed.
            if pushed is None and not endpoint:
                self._exclude(commitment, "no-payload", "client-mode peer committed without pushing its payload first")
                return swarm_pb2.CommitReply(accepted=True, current_round=self.round)
            if pushed is not None:
                self.sliced.exchange.serve_slices(header, pushed.payload)
            with self.lock:
                if commitment.status == "pending":
                    commitment.status = "verified"
            return swarm_pb2.CommitReply(accepted=True, current_round=self.round)
        if pushed is not None:
            self._verify_payload(commitment, pushed.payload)
        elif endpoint:
            self.fetchers.submit(self._fetch, commitment)
        else:
            self._exclude(commitment, "no-payload", "client-mode peer committed without pushing its payload first")
        return swarm_pb2.CommitReply(accepted=True, current_round=self.round)

    def _equivocation(self, existing: Commitment, header: UpdateHeader, signed: swarm_pb2.Signed) -> None:
        self.registry.reject("equivocation")
        self._ban_equivocator(header, existing.signed, signed)
        existing.status, existing.reason, existing.update = "excluded", "equivocation", None

    def _ban_equivocator(self, header: UpdateHeader, first: swarm_pb2.Signed, second: swarm_pb2.Signed) -> None:
        """Ban for the run; keep both signed headers: anyone can check the two signatures."""
        evidence = {
            "kind": "equivocation",
            "round": header.round,
            "first_header": signed_to_json(first),
            "second_header": signed_to_json(second),
        }
        self.registry.ban(header.peer_id, f"equivocation in round {header.round}", evidence)
        self.book.excluded[header.peer_id] = "equivocation"
        existing = self.book.commitments.get(header.peer_id)
        if existing is not None:
            existing.status, existing.reason, existing.update = "excluded", "equivocation", None
        log.warning("peer %s equivocated in round %d: banned, evidence kept", header.peer_id[:8], header.round)

    def _fetch(self, commitment: Commitment) -> None:
        try:
            # Bounded by the payload's size (at >= 256 KiB/s), so a slow author cannot hold a fetch thread for long.
            seconds = min(TRANSFER_DEADLINE.total_seconds(), 10.0 + commitment.header.payload_size / (256 << 10))
            payload = fetch_payload(self.channels, [commitment.endpoint], commitment.header, deadline=timedelta(seconds=seconds))
        except Exception as exc:  # unreachable author, broken stream: excluded, the round goes on
            self._exclude(commitment, "unreachable", f"could not fetch the payload from {commitment.endpoint}: {exc}")
            return
        self._verify_payload(commitment, payload)

    def _verify_payload(self, commitment: Commitment, payload: bytes) -> None:
        """Decode and admit a payload whose sha256 already matched the commitment's (both callers
        got it through receive_chunks against that hash), so only its size is left to check."""
        try:
            if len(payload) != commitment.header.payload_size:
                raise EnvelopeError(
                    "size-mismatch", f"payload has {len(payload)} bytes, header declares {commitment.header.payload_size}"
                )
            update = self.math.decode(payload, commitment.header.round)
        except (EnvelopeError, UpdateRejected) as exc:
            self._exclude(commitment, exc.reason, str(exc))
            return
        self.store.put(StoredPayload(commitment.header, commitment.signed, payload), verified=True)
        with self.lock:
            if commitment.status == "pending" and commitment.header.round == self.book.round:
                commitment.status, commitment.update = "verified", update

    def _exclude(self, commitment: Commitment, reason: str, message: str) -> None:
        with self.lock:
            self.registry.reject(reason)
            commitment.status, commitment.reason = "excluded", reason
            if commitment.header.round == self.book.round:
                self.book.excluded[commitment.header.peer_id] = reason
            record = self.registry.get(commitment.header.peer_id)
            if record is not None:
                record.excluded_reason = f"round {commitment.header.round}: {message}"
        log.warning("excluded %s from round %d: %s", commitment.header.peer_id[:8], commitment.header.round, message)

    # --- the clock -----------------------------------------------------------------------

    def tick(self) -> RoundResult | None:
        """Close the open round if it is time; returns what happened when it closed."""
        with self.lock:
            if self.finished:
                return None
            self.registry.mark_gone()
            now = time.monotonic()
            expected = self.registry.active(self.round)
            if self.round == 0 and now < self.start_wait_until and len(expected) < self.cfg.rounds.expected_peers:
                return None  # let the expected peers arrive before round 1 can close
            if self.sliced is not None and self.book.closed:
                final, why = self.sliced.should_finalize(now)
                if final:
                    self.sliced.finalize()
                    return None
                ready, why = self.sliced.ready_to_apply(now)
                if not ready:
                    return None
                book, (slice_round, results, reports) = self.book, self.sliced.take_final()
            else:
                close, why = should_close(
                    self.book, expected, self.deadline.current, self.cfg.rounds.min_peers, now
                )
                if not close:
                    return None
                closing = self._close_commits(why)
                if closing is None:
                    return None  # sliced: the owners reduce now
        if self.sliced is None:
            return self._apply_closed(*closing)
        # Sliced, results final: gather the aggregated slices (fetches, maybe recomputations)
        # without the lock, so heartbeats, commits and long-polls are served meanwhile.
        outcome = self.sliced.gather(slice_round, results, reports)
        with self.lock:
            self.math.step_with_aggregate(self.params, outcome.combined, round_=book.round)  # θ_r -> θ_{r+1}, in place
            verified = book.verified()
            self.registry.record_slices(book.round, verified, outcome.excluded, self.math.layout.num_slices)
            excluded = {**outcome.excluded_by_peer(), **book.excluded}
            # An update counts when it took part in at least one slice.
            used = [p for p in verified if not outcome.excluded or not all(p in ex for ex in outcome.excluded.values())]
            result = self._advance(book, used, why, excluded)
            self.sliced.applied(book.round, self.param_hash)
        return self._persist(result)

    def close_round(self, why: str) -> RoundResult | None:
        """Close the commit phase now: sign the manifest; all-to-all, also aggregate and open the
        next round (sliced: the owners reduce, and tick() applies once their results are final)."""
        with self.lock:
            closing = self._close_commits(why)
        return None if closing is None else self._apply_closed(*closing)

    def _close_commits(self, why: str) -> tuple[RoundBook, list[str], str] | None:
        """Under the lock: the manifest of the open round, signed. (book, verified, why) for the
        all-to-all aggregation that follows outside the lock; None when sliced."""
        book = self.book
        verified = book.verified()
        for peer_id, c in book.commitments.items():  # still pending at the deadline: too late
            if c.status == "pending":
                c.status, c.reason = "excluded", "late"
                book.excluded[peer_id] = "late"
        entries = self._manifest_entries(book, verified)
        if self.sliced is not None:
            manifest = sliced_manifest(self.math, book.round, entries, base_param_hash=self.param_hash, excluded=book.excluded)
        else:
            manifest = RoundManifest(
                run_id=self.cfg.run_id, round=book.round, base_param_hash=self.param_hash, entries=entries, excluded=dict(book.excluded)
            )
        manifest = dataclasses.replace(manifest, last=book.round + 1 >= self.cfg.rounds.rounds)
        signed = self.manifests[book.round] = sign_manifest(self.identity, manifest)
        fail_point("manifest-signed", book.round)
        for old in [r for r in self.manifests if r < book.round - 4]:
            del self.manifests[old]
        if self.sliced is not None:  # the owners reduce now; tick() gathers once their results are final
            self.sliced.open(book.round, manifest, signed, {p: book.commitments[p].header for p in verified})
            book.closed = True
            self.round_closed.notify_all()
            return None

        book.closed = True  # late commitments are refused while the aggregate is computed
        return book, verified, why

    def _apply_closed(self, book: RoundBook, verified: list[str], why: str) -> RoundResult:
        """All-to-all: aggregate the round's verified updates without the lock (the slow part:
        robust rules over n updates), then adopt θ_{r+1} under it."""
        updates = [book.commitments[p].update for p in verified]
        params = self.params.clone()
        report = self.math.apply(params, updates, round_=book.round, excluded_for_cause=count_for_cause(book.excluded))  # θ_r -> θ_{r+1}
        with self.lock:
            self.params = params
            self.registry.record_aggregation(book.round, verified, report)
            result = self._advance(book, verified, why, dict(book.excluded))
        return self._persist(result)

    def _manifest_entries(self, book: RoundBook, verified: list[str]) -> list[ManifestEntry]:
        entries = []
        public = [c.endpoint for p, c in sorted(book.commitments.items()) if c.endpoint and p in verified]
        for peer_id in verified:
            c = book.commitments[peer_id]
            holders = [c.endpoint] if c.endpoint else []
            if self.sliced is not None:
                holders = holders or [self.endpoint]  # a pushed payload: we serve its slices
            else:  # the author, ourselves, and the round's other public peers (who re-serve what they verify)
                holders += [self.endpoint] + [e for e in public if e != c.endpoint]
            entries.append(ManifestEntry(peer_id=peer_id, payload_sha256=c.header.payload_sha256, payload_size=c.header.payload_size,
                                         header=signed_to_json(c.signed), holders=holders, serves=bool(c.endpoint)))
        return entries

    def _advance(self, book: RoundBook, verified: list[str], why: str, excluded: dict[str, str]) -> RoundResult:
        """θ_{r+1} is in self.params: record the round, open the next, write the checkpoint."""
        arrivals = [c.arrived for c in book.commitments.values()]
        if len(arrivals) > 1:
            self.deadline.observe(max(arrivals) - min(arrivals))
        self.round += 1
        self.param_hash = param_hash(self.params)
        result = RoundResult(
            round=book.round,
            updates=len(verified),
            excluded=excluded,
            seconds=time.monotonic() - book.opened_at,
            val_loss=float("nan"),  # _persist evaluates, off the lock
            param_hash=self.param_hash,
            close_reason=why,
        )
        self.book = RoundBook(round=self.round)
        if self.round >= self.cfg.rounds.rounds:
            self.finished = True
        self.sign_state()
        self.round_closed.notify_all()
        return result

    def _persist(self, result: RoundResult) -> RoundResult:
        """The slow part of a close, beside the RPC handlers (only the clock thread runs it):
        evaluate θ_{r+1}, then record the round and write the checkpoint and state parts. Until it
        is done, joiners get the previous round's checkpoint, which its own signed state covers."""
        result.val_loss = self.evaluate()
        with self.lock:
            self.history.append(result)
        self._snapshot()
        return result

    def wait_manifest(self, round_: int, wait_s: float) -> swarm_pb2.ManifestReply:
        deadline = time.monotonic() + max(0.0, min(wait_s, 60.0))
        with self.round_closed:
            while round_ not in self.manifests and round_ >= self.round and not self.finished:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self.round_closed.wait(remaining)
            manifest = self.manifests.get(round_)
            return swarm_pb2.ManifestReply(
                ready=manifest is not None, manifest=manifest, current_round=self.round, finished=self.finished
            )

    def status(self) -> dict[str, Any]:
        """What `swarmloco status --json` prints (peer/coordinator/status_view.py)."""
        from peer.coordinator.status_view import coordinator_status

        return coordinator_status(self)

    def final_state_delivered(self) -> bool:
        """The run is over and every live, unbanned peer reported the final parameter hash."""
        with self.lock:
            live = [r for r in self.registry.records() if not r.banned_reason and r.state != "gone"]
            return self.finished and all(r.param_hash == self.param_hash for r in live)

    def state_holders(self) -> list[str]:
        """Endpoints of live serving peers whose last heartbeat reported our θ_r: they hold its parts."""
        return [r.endpoint for r in self.registry.records() if r.endpoint and r.state != "gone" and not r.banned_reason
                and r.param_hash == self.param_hash][:64]
