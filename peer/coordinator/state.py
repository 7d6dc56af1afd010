"""The coordinator: bootstraps the DHT, admits peers, keeps the round clock, signs manifests.

This file is its state: θ_r, the signed run states, the checkpoint and state parts that late
joiners download. Admission of commitments is peer/coordinator/commitments.py, the round clock
peer/coordinator/clock.py, and what the exchange mode does with the updates its coordinator
side (peer/exchange/modes.py: sliced, all-to-all). It never trains.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from peer.coordinator.clock import RoundClock
from protocol.async_wait import Announcing
from peer.coordinator.commitments import Admission
from peer.coordinator.followers import Followers
from peer.coordinator.lock_watch import coordinator_lock
from peer.coordinator.lease import ActGuard
from peer.coordinator.registry import PeerRegistry
from peer.coordinator.round_book import AdaptiveDeadline, RoundBook, RoundResult, result_dict
from peer.coordinator.status_view import coordinator_status
from peer.exchange.coordinator_side import OpenRound, RoundContext
from peer.exchange.modes import coordinator_exchange
from peer.learn.data import load_corpus, validation_batches
from peer.learn.model import build_model, flat_params, initial_model, layout_hash, load_flat_params, param_hash
from peer.learn.training import evaluate
from peer.run import checkpoint, state_sync
from peer.run.config import RunConfig
from peer.run.faults import fail_point
from peer.run.round_math import RoundMath
from protocol.accounting import ByteCounter
from protocol.envelope import UpdateHeader
from protocol.identity import Identity
from protocol.payload_fetch import ChannelPool
from protocol.payload_store import PayloadStore
from protocol.run_state import RunState, sign_run_state
from protocol.wire import swarm_pb2

log = logging.getLogger("swarmloco.coordinator")


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
        restore_grace_s: float | None = None,
    ) -> None:
        self.cfg = cfg = with_coordinator_key(cfg, identity.peer_id)
        self.identity = identity
        self.term = term  # bumped by every takeover (peer/coordinator/standby.py)
        self.standby_endpoints: list[str] = []  # the run's other coordinators, for peers' failover
        self.endpoint = endpoint  # HOST:PORT of our gRPC server, set once it is bound
        self.initial_peers: list[str] = []
        self.checkpoint_path = Path(checkpoint_path) if checkpoint_path else None
        self.counter = counter or ByteCounter(identity.peer_id)
        self.lock = coordinator_lock()  # a plain RLock; SWARMLOCO_LOCK_WATCH=1 prints long holds (lock_watch.py)
        self.round_closed = Announcing(self.lock)  # also wakes the long-polls that wait on the server's loop

        restoring = self.checkpoint_path is not None and self.checkpoint_path.exists()
        # θ_0: the seeded init or model.init_from's checkpoint; a checkpoint of this run restores θ_r below instead
        self.model = build_model(cfg.model, cfg.seed) if restoring else initial_model(cfg.model, cfg.seed)
        self.layout_hash = layout_hash(self.model)
        params = flat_params(self.model)  # θ_0, (d,) float32
        self.numel = params.numel()
        self.math = RoundMath(cfg, self.numel)
        self.max_payload_bytes = min(cfg.max_payload_bytes, self.math.codec.max_encoded_size(self.numel))
        corpus = load_corpus(cfg.data, seq_len=cfg.model.seq_len)
        self.val_batches = validation_batches(corpus, cfg.data.batch_size, cfg.model.seq_len, cfg.data.val_batches)

        self.registry = PeerRegistry(cfg.rounds.peer_timeout_s)
        self.store = PayloadStore(keep_rounds=2)
        self.states: dict[int, swarm_pb2.Signed] = {}  # round -> signed RunState (protocol/run_state.py)
        self.history: list[RoundResult] = []
        self.channels = ChannelPool(self.counter)
        self.fetchers = ThreadPoolExecutor(max_workers=8, thread_name_prefix="swarmloco-fetch")
        self.open = OpenRound(round=0, book=RoundBook(round=0), params=params)
        self.ctx = RoundContext(cfg=cfg, math=self.math, identity=identity, lock=self.lock, round_closed=self.round_closed,
                                registry=self.registry, store=self.store, channels=self.channels, fetchers=self.fetchers,
                                open=self.open, endpoint=lambda: self.endpoint)
        self.exchange = coordinator_exchange(self.ctx)  # the run's exchange mode, its coordinator side
        self.admission = Admission(self.ctx, self.exchange, self.layout_hash)
        self.halted: Callable[[], bool] = lambda: False  # the process is stopping (main.py): waits for the lease or standbys give up
        self.clock = RoundClock(self.ctx, self.exchange, sign_state=self.sign_state, persist=self._persist,
                                start_wait_until=time.monotonic() + cfg.rounds.start_timeout_s, term=lambda: self.term,
                                halted=lambda: self.halted())
        self.started_at = time.monotonic()

        self.initial_val_loss: float | None = None  # the run's, kept across restarts and takeovers (checkpoint)
        if restoring:  # restore_grace_s: how long the checkpoint's peers are awaited unless heard from (registry.restore)
            self._restore(checkpoint.load(self.checkpoint_path), restore_grace_s)
        self.param_hash = param_hash(self.params)
        if self.initial_val_loss is None:
            self.initial_val_loss = self.evaluate()
        # The standbys that follow us, and the state they must hold before a round is recorded.
        self.followers = Followers(lambda: self.lease.lease_s or cfg.control.lease_s, recorded=self.round)
        self.checkpoint_bytes = b""
        self._snapshot()
        self.sign_state()

    # --- state ---------------------------------------------------------------------------

    def _restore(self, ckpt: checkpoint.Checkpoint, grace_s: float | None = None) -> None:
        if ckpt.config_hash != self.cfg.config_hash():
            raise checkpoint.CheckpointError(checkpoint.config_mismatch(
                self.checkpoint_path, ckpt.extra.get("config"), self.cfg.to_dict(), own_key=self.identity.peer_id))
        self.params = ckpt.params.clone()
        self.math.load_global_state_dict(ckpt.outer_state)
        self.round = ckpt.round
        self.book = RoundBook(round=self.round)
        self.history = [RoundResult(**r) for r in ckpt.extra.get("history", [])]
        loss = ckpt.extra.get("initial_val_loss")
        self.initial_val_loss = float(loss) if isinstance(loss, (int, float)) and not isinstance(loss, bool) else None
        self.term = max(self.term, int(ckpt.extra.get("term", 0)))  # a takeover's is higher still
        self.registry.restore(ckpt.extra.get("peers", []), joined_round=self.round, grace_s=grace_s)
        self.clock.start_wait_until = time.monotonic()  # peers that were in the run come back on their own
        log.info("restored round %d from %s", self.round, self.checkpoint_path)

    @property
    def lease(self) -> ActGuard:
        """What the clock asks before it signs or records (peer/coordinator/lease.py)."""
        return self.clock.lease

    @lease.setter
    def lease(self, lease: ActGuard) -> None:
        self.clock.lease = lease

    def _snapshot(self, history: list[RoundResult] | None = None) -> None:
        """Serialize θ_r for late joiners and standbys and write it to disk atomically."""
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
            # A standby that takes over from it keeps the run's history, initial loss and term.
            extra={"history": [result_dict(r) for r in (self.history if history is None else history)],
                   "peers": self.registry.to_dicts(), "config": self.cfg.to_dict(),
                   "initial_val_loss": self.initial_val_loss, "term": self.term},
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

    # --- the open round (self.open, shared with admission, the clock and the exchange mode) ---

    round = property(lambda self: self.open.round, lambda self, v: setattr(self.open, "round", v))
    book = property(lambda self: self.open.book, lambda self, v: setattr(self.open, "book", v))
    params = property(lambda self: self.open.params, lambda self, v: setattr(self.open, "params", v))
    param_hash = property(lambda self: self.open.param_hash, lambda self, v: setattr(self.open, "param_hash", v))
    finished = property(lambda self: self.open.finished, lambda self, v: setattr(self.open, "finished", v))

    @property
    def manifests(self) -> dict[int, swarm_pb2.Signed]:
        return self.clock.manifests

    @property
    def deadline(self) -> AdaptiveDeadline:
        return self.clock.deadline

    # --- commitments (peer/coordinator/commitments.py) and the clock (peer/coordinator/clock.py) ---

    def verify_header(self, signed: swarm_pb2.Signed, round_: int | None = None) -> UpdateHeader:
        return self.admission.verify_header(signed, round_)

    def verify_pushed_header(self, signed: swarm_pb2.Signed) -> UpdateHeader:
        return self.admission.verify_pushed_header(signed)

    def submit(self, signed: swarm_pb2.Signed, endpoint: str) -> swarm_pb2.CommitReply:
        return self.admission.submit(signed, endpoint)

    def refuse(self, reason: str, message: str, *, count: bool = True) -> swarm_pb2.CommitReply:
        return self.ctx.refuse(reason, message, count=count)

    def tick(self) -> RoundResult | None:
        return self.clock.tick()

    def wait_for_change(self, timeout_s: float) -> None:
        """Sleep until the round's state changed (a commitment, an owner's results, a gathered
        report: round_closed is notified) or timeout_s passed, so that tick() acts on it at once
        instead of on the next 0.1 s beat (each beat a phase waited cost ~50 ms; on a WAN
        round, three of them)."""
        with self.round_closed:
            self.round_closed.wait(timeout_s)

    def close_round(self, why: str) -> RoundResult | None:
        return self.clock.close_round(why)

    def wait_manifest(self, round_: int, wait_s: float, *, compact: bool = False) -> swarm_pb2.ManifestReply:
        return self.clock.wait_manifest(round_, wait_s, compact=compact)

    def manifest_news(self, round_: int) -> bool:
        return self.clock.manifest_news(round_)

    def _persist(self, result: RoundResult) -> RoundResult:
        """The slow part of a close, beside the RPC handlers (only the clock thread runs it):
        evaluate θ_{r+1}, write the checkpoint and state parts, and record the round once every
        counted standby holds that checkpoint (peer/coordinator/followers.py) and while the lease
        is held. Until the checkpoint is written, joiners get the previous round's, which its own
        signed state covers."""
        result.val_loss = self.evaluate()
        self._snapshot(history=[*self.history, result])
        if not self.followers.wait_for(result.round + 1, stop=lambda: self.halted()):
            return result  # stopping: not recorded
        self.clock.while_held(lambda: self.history.append(result))
        fail_point("round-recorded", result.round)
        return result

    def status(self) -> dict[str, Any]:
        """What `swarmloco status --json` prints (peer/coordinator/status_view.py)."""
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
