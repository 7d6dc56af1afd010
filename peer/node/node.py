"""A training peer: joins a run, trains H inner steps per round, exchanges updates, applies the outer step.

Round r, as DESIGN.md fixes it:
  θ_r -> H AdamW steps -> Δ = θ_r − θ_local -> encode -> sign header -> serve payload (or push it)
  -> commit to the coordinator -> wait for the signed manifest -> fetch listed payloads from any
  holder, verify -> aggregate + outer step -> θ_{r+1}; compare its hash with the coordinator's and
  resynchronise from the checkpoint instead of drifting.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch

from peer import VERSION

from peer.run import state_sync
from peer.node.resync import StateSource
from peer.node.coordinator_client import CoordinatorClient, CoordinatorUnavailable
from peer.node.local_state import load_local_state, save_local_state
from peer.node.trust import RunAuthority, find_coordinator, trust_run
from peer.node.errors import PeerExit
from peer.node.options import PeerOptions
from peer.node.phase import RoundPhase
from peer.node import ranks
from peer.learn.data import DeviceSampler, peer_sampler
from peer.learn.model import build_model, flat_params, layout_hash, load_flat_params, param_hash
from peer.node.heartbeat import beat, heartbeat_loop
from peer.run.faults import check_environment, fail_point
from peer.node.overlap import run_overlapped
from peer.run.progress import round_line, step_line
from peer.node.round_exchange import Exchange, ManifestFetcher, Update, await_manifest, check_listed
from peer.node.sliced_round import sliced_exchange
from peer.run.slice_exchange import SliceExchange
from peer.run.round_math import RoundMath
from peer.learn.training import InnerTrainer
from protocol import discovery
from protocol.wire import swarm_pb2, swarm_pb2_grpc
from protocol.accounting import ByteCounter
from protocol.channels import create_server
from protocol.envelope import JOIN_TAG, UpdateHeader, open_manifest, sign_update
from protocol.identity import Identity
from protocol.payload_fetch import ChannelPool
from protocol.payload_service import PayloadServicer, PayloadStore, StoredPayload, push_chunks
from protocol.rpc_errors import Refused
from protocol.run_state import ImpersonationError
from protocol.signing import sign_body

__all__ = ["PeerExit", "PeerNode", "PeerOptions"]  # the first and last live in peer.node.errors / .options
log = logging.getLogger("swarmloco.peer")
REJOIN = {swarm_pb2.UNKNOWN_PEER, swarm_pb2.WRONG_ENDPOINT}  # join again, then commit the same update
RESYNC = {swarm_pb2.STALE_ROUND, swarm_pb2.WRONG_BASE}  # download the checkpoint instead
FATAL = {swarm_pb2.EQUIVOCATION, swarm_pb2.BANNED}


class PeerNode:
    """One training peer. A round's phases are public methods (train, make_update, commit,
    exchange, finish_round), composed by one_round (synchronous) or peer.node.overlap."""

    def __init__(self, options: PeerOptions) -> None:
        check_environment()  # a bad SWARMLOCO_FAIL_AT fails here, before anything starts
        self.options = options
        state_dir = Path(options.state_dir or (Path(options.identity_path).parent if options.identity_path else "."))
        self.identity = Identity.load_or_create(options.identity_path) if options.identity_path else Identity.generate()
        self.state_path = state_dir / f"peer-{self.identity.peer_id[:16]}.state"
        self.counter = ByteCounter(self.identity.peer_id)
        self.short = self.identity.peer_id[:8]
        self.dht = None
        self.server = None
        self.client: CoordinatorClient | None = None
        self.endpoint = ""  # HOST:PORT of our payload server; "" in client mode
        self.pool: ChannelPool | None = None
        self.slice_exchange: SliceExchange | None = None
        self.fetchers: ThreadPoolExecutor | None = None
        self.writer: ThreadPoolExecutor | None = None
        self.heartbeat_thread: threading.Thread | None = None
        self.stop = threading.Event()
        self.heartbeat_now = threading.Event()
        self.phase = RoundPhase.STARTING
        self.round = 0
        self._hash = ""  # sha256 of self.params once built; the heartbeat thread reads it
        self.step = 0
        self.phase_first_step = 0  # the trainer's step count when this round's inner phase began
        self.last_loss: float | None = None
        self.finished = False
        self.banned_reason = ""
        self.compute_s = 0.0
        self.started = time.monotonic()
        self.training_started: float | None = None  # first inner step: utilization excludes start-up
        self.round_traffic: dict[str, int] = {}
        self.history: list[dict[str, Any]] = []
        self.left_out: list[int] = []  # rounds whose signed manifest left our valid commitment out without a reason

    # --- setup ---------------------------------------------------------------------------

    def connect(self) -> None:
        o = self.options
        if o.initial_peers:
            # The DHT first: it forks a child process, and gRPC is not fork-safe.
            self.dht = discovery.start_dht(
                self.identity,
                initial_peers=o.initial_peers,
                host_maddrs=o.host_maddrs,
                announce_maddrs=o.announce_maddrs,
                client_mode=o.client_mode,
                timeout_s=o.connect_timeout_s,
            )
            for maddr in discovery.visible_maddrs(self.dht):  # this peer is a way into the swarm too
                print(f"peer {self.short} | DHT: --initial-peers {maddr}", flush=True)
        endpoint, pinned, pinned_by = find_coordinator(self.dht, coordinator=o.coordinator, pinned=o.coordinator_key,
                                                       run_id=o.run_id, timeout_s=o.connect_timeout_s)
        self.client = CoordinatorClient(endpoint, self.counter)
        self.client.wait_ready(timedelta(seconds=o.connect_timeout_s))
        info = self.client.run_info()
        trusted = trust_run(info, pinned=pinned, pinned_by=pinned_by, endpoint=endpoint, run_id=o.run_id)
        self.cfg = trusted.cfg
        self.authority = RunAuthority(keys=trusted.keys, run_id=self.cfg.run_id, client=self.client, counter=self.counter,
                                      endpoints=list(info.coordinator_endpoints), dht=self.dht)
        self.client.locate = self.authority.locate  # failover: the run's active coordinator, wherever it is now
        if trusted.state.finished:
            raise PeerExit(f"run {trusted.state.run_id} has already finished all its rounds (final hash {trusted.state.param_hash[:16]})")
        self._build(trusted.state.round)
        self._serve()
        self.manifest_fetcher = ManifestFetcher(
            self.store, self.pool, self.fetchers, self.math, self._verify_header, self.endpoint
        )
        self.slice_exchange = self.make_slice_exchange()
        self.send_join()
        self.announce()
        self.heartbeat_thread = threading.Thread(target=heartbeat_loop, args=(self,), name="swarmloco-heartbeat", daemon=True)
        self.heartbeat_thread.start()

    def _build(self, round_: int) -> None:
        cfg, o = self.cfg, self.options
        if o.threads:
            torch.set_num_threads(o.threads)
        self.model = build_model(cfg.model, cfg.seed).to(o.device)
        self.layout_hash = layout_hash(self.model)
        self.params = flat_params(self.model).cpu()  # θ_r on CPU: the round math is CPU float32
        self._hash = param_hash(self.params)
        self.numel = self.params.numel()
        self.math = RoundMath(cfg, self.numel)
        data_cfg = cfg.data if o.data is None else dataclasses.replace(cfg.data, path=o.data)
        self.sampler, corpus = peer_sampler(data_cfg, seq_len=cfg.model.seq_len, seed=cfg.seed, peer_id=self.identity.peer_id,
                                            shard=o.shard, num_shards=o.num_shards)
        self.tokenizer_sha256 = corpus.tokenizer.sha256 if corpus.tokenizer is not None else ""  # said at join
        self.trainer = InnerTrainer(self.model, cfg.inner, DeviceSampler(self.sampler, o.device))
        ranks.attach(self)  # a multi-rank peer steps through DDP (peer/node/ranks.py)
        self.round = round_
        self.store = PayloadStore(keep_rounds=2)
        self.pool = ChannelPool(self.counter)
        self.fetchers = ThreadPoolExecutor(max_workers=8, thread_name_prefix="swarmloco-fetch")
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="swarmloco-state")  # one write at a time, in order
        if o.resume and self.state_path.exists():
            self._load_local_state()

    def _serve(self) -> None:
        o = self.options
        if o.client_mode:
            self.endpoint = ""
            return
        self.server, port = create_server(self.counter, host=o.host, port=o.port)
        servicer = PayloadServicer(self.store, verify_header=lambda s: self._verify_header(s, None), accept_pushes=False)
        swarm_pb2_grpc.add_PeerServicer_to_server(servicer, self.server)
        self.server.start()
        self.endpoint = f"{o.announce_host}:{port}"

    def announce(self) -> None:
        """(Re)write our DHT record; the heartbeat refreshes it before it expires."""
        if self.dht is not None:
            discovery.announce_peer(
                self.dht, self.identity, run_id=self.cfg.run_id, endpoint=self.endpoint,
                client_mode=self.options.client_mode, version=VERSION,
            )

    def send_join(self) -> None:
        """Join (or rejoin: a restarted coordinator that lost us, a new endpoint); same identity."""
        assert self.client is not None
        body = {
            "run_id": self.cfg.run_id,
            "endpoint": self.endpoint,
            "client_mode": self.options.client_mode,
            "version": VERSION,
            "tokenizer_sha256": self.tokenizer_sha256,
            "timestamp": time.time(),
        }
        try:
            reply = self.client.join(sign_body(self.identity, JOIN_TAG, body))
        except Refused as exc:
            if exc.refusal == swarm_pb2.BANNED:
                self.banned_reason = exc.reason
            raise PeerExit(f"the coordinator refused to admit this peer: {exc.reason}") from None
        log.info("peer %s joined run %s at round %d (%d params, codec %s)", self.short, self.cfg.run_id, reply.round, self.numel, self.cfg.compression.codec)

    def make_slice_exchange(self) -> SliceExchange:
        """The sliced exchange's engine for this node (a seam: the tests' Byzantine owners override it)."""
        return SliceExchange(self.math, self.pool, self.store, self.fetchers, own_endpoint=self.endpoint, identity=self.identity)

    def _verify_header(self, signed, round_: int | None) -> UpdateHeader:
        return self.math.open_update(signed, round_=round_, layout_hash=self.layout_hash)

    # --- rounds --------------------------------------------------------------------------

    @property
    def current_hash(self) -> str:
        return self._hash

    def _set_params(self, flat: torch.Tensor, round_: int) -> None:
        self.params = flat.clone()
        self.round = round_
        self._hash = param_hash(self.params)
        load_flat_params(self.model, self.params.to(self.options.device))

    def resync(self, why: str) -> None:
        """Download the swarm's state θ_r and continue from it (keeps local optimizer state):
        from the peers that hold it, part by part, else the coordinator's checkpoint."""
        self.phase = RoundPhase.SYNCING
        source = StateSource(
            client=self.client, pool=self.pool, workers=self.fetchers, config_hash=self.cfg.config_hash(), run_id=self.cfg.run_id,
            keys=self.authority.keys, signed_hash=self.authority.signed_hash, own_endpoint=self.endpoint, max_part_bytes=self.math.max_result_bytes() * 4 + (1 << 20),
        )
        state = source.fetch()
        self.math.load_global_state_dict(state.global_state)
        self._set_params(state.params, state.round)
        print(f"peer {self.short} | resynchronised to round {state.round + 1} ({why}; from {state.source})", flush=True)
        self.publish_state()

    def publish_state(self) -> None:
        """Serve our in-sync θ_r's parts, so joiners can fetch the swarm state from us."""
        if not self.options.client_mode:
            state_sync.publish(self.store, self.identity, run_id=self.cfg.run_id, config_hash=self.cfg.config_hash(),
                               round_=self.round, param_hash=self._hash, params=self.params,
                               global_state=self.math.global_state_dict(), layout=self.math.layout, sign=False)

    def run(self, max_rounds: int | None = None) -> dict[str, Any]:
        state = self.authority.state()
        if state is None or state.param_hash != self._hash or state.round != self.round:
            self.resync("joining" if not self.options.resume else "resume state is behind the swarm")
        done = 0
        if self.cfg.rounds.overlap_communication:
            done = run_overlapped(self, max_rounds)
        while not self.finished and not self.stop.is_set() and not self.cfg.rounds.overlap_communication:
            if self.banned_reason:
                raise PeerExit(f"banned from the run: {self.banned_reason}")
            self.one_round()
            done += 1
            if max_rounds is not None and done >= max_rounds:
                break
        self.phase = RoundPhase.FINISHED if self.finished else RoundPhase.STOPPED
        if self.finished:
            beat(self)  # the coordinator serves the final state until every peer says it holds it
            print(f"peer {self.short} | finished: run {self.cfg.run_id} ended at round {self.round}, final hash {self._hash}", flush=True)
        return {"rounds": done, "round": self.round, "param_hash": self._hash, "history": self.history}

    def one_round(self) -> None:
        """Train, commit, wait for the manifest, fetch, aggregate: one synchronous round."""
        r, base = self.round, self.params.clone()  # θ_r, (d,)
        started = time.monotonic()
        before = self.counter.total()
        stats, compute = self.train(r)
        local = flat_params(self.model).cpu()
        update = self.make_update(r, base - local)  # pseudo-gradient Δ = θ_r − θ_local
        if not self.commit(update, r):
            return
        result = self.exchange(r, base, update)
        self.finish_round(r, result, update, stats, compute, started, before)

    def utilization(self) -> float:
        """Share of wall time spent in inner steps since the first one (start-up excluded)."""
        if self.training_started is None:
            return 0.0
        return self.compute_s / max(1e-9, time.monotonic() - self.training_started)

    def train(self, r: int, *, steps: int | None = None, stop: Callable[[], bool] | None = None) -> tuple[Any, float]:
        """H inner steps on the model (θ_r, or θ_r plus progress when overlapped): (stats, seconds).

        Overlapped rounds split a phase in two: `stop` ends the first call early (after the step
        during which the exchange in flight finished; stats.steps says how many ran), and the
        second call runs the `steps` left. Only a call that ran all it was asked ends the phase."""
        if self.training_started is None:
            self.training_started = time.monotonic()
        self.counter.round = r
        self.phase = RoundPhase.TRAINING
        cfg = self.cfg
        asked = cfg.inner.steps if steps is None else steps
        if steps is None:
            self.phase_first_step = self.trainer.step
        first_step, call_first_step = self.phase_first_step, self.trainer.step
        t0 = time.monotonic()

        def on_step(step: int, loss: float) -> None:
            self.step, self.last_loss = step, loss
            local_step = step - first_step
            if local_step % self.options.log_every == 0 or local_step == cfg.inner.steps:
                tokens_per_s = (step - call_first_step) * cfg.data.batch_size * cfg.model.seq_len / max(time.monotonic() - t0, 1e-9)
                print(step_line(self.short, r, cfg.rounds.rounds, local_step, cfg.inner.steps, loss, tokens_per_s,
                                self.counter.total(), mfu=self.trainer.mfu(tokens_per_s)), flush=True)

        ranks.start_round(self, asked)  # every rank from this θ
        # Followers run the steps they are told in lockstep: with several ranks a phase is not cut.
        stop = stop if ranks.world_size() == 1 else None
        stats = self.trainer.run(asked, on_step, log_every=self.options.log_every, stop=stop)
        compute = time.monotonic() - t0
        self.compute_s += compute
        if stats.steps == asked:
            fail_point("trained", r)
        return stats, compute

    def make_update(self, r: int, delta: torch.Tensor) -> Update:
        """Encode and sign this peer's pseudo-gradient Δ (d,) for round r; serve it from our store."""
        t0 = time.monotonic()
        cfg = self.cfg
        payload = self.math.encode(delta, r)
        header = UpdateHeader(
            run_id=cfg.run_id, round=r, peer_id=self.identity.peer_id, codec=cfg.compression.codec, numel=self.numel,
            layout_hash=self.layout_hash, base_param_hash=self._hash,
            payload_sha256=hashlib.sha256(payload).hexdigest(), payload_size=len(payload),
            slices=tuple(self.slice_exchange.slice_hashes(payload)) if self.math.sliced else (),
        )
        signed = sign_update(self.identity, header)
        self.store.put(StoredPayload(header, signed, payload), verified=True)  # we just hashed it
        if self.math.sliced:
            self.slice_exchange.serve_slices(header, payload)  # owners fetch our slices one by one
        self.phase = RoundPhase.COMMITTING
        return Update(signed=signed, payload=payload, encode_s=time.monotonic() - t0)

    def exchange(self, r: int, base: torch.Tensor, update: Update) -> Exchange:
        """Wait for round r's manifest, fetch and verify its updates, aggregate: θ_{r+1}.

        Touches neither the model nor self.params, so it can run beside the next inner phase.
        Raises nothing (it runs in the overlapped schedule's background thread): a coordinator
        that changed mid-round (failover) gets our update again and the round restarts there; a
        coordinator nobody can reach ends the exchange with `unreachable`.
        """
        while True:
            generation = self.client.generation
            try:
                result = self._exchange(r, base, update, generation)
            except CoordinatorUnavailable as exc:
                return Exchange(unreachable=str(exc))
            except PeerExit as exc:
                return Exchange(fatal=str(exc))
            except Exception as exc:  # never out of the exchange thread; the round resynchronises instead
                log.warning("peer %s: round %d exchange failed (%s: %s)", self.short, r, type(exc).__name__, exc)
                return Exchange(resync=f"the exchange failed ({type(exc).__name__})")
            if self.client.generation == generation:
                return result
            print(f"peer {self.short} | round {r}: the run's coordinator is now {self.client.endpoint}; committing again", flush=True)
            if not self.commit(update, r, resync=False):
                return Exchange(resync="the new coordinator did not take our update")

    def _exchange(self, r: int, base: torch.Tensor, update: Update, generation: int) -> Exchange:
        if self.phase != RoundPhase.TRAINING:  # overlapped: the next inner phase is running
            self.phase = RoundPhase.WAITING
        waited = await_manifest(self.client, r, stop=self.stop, changed=lambda: self.client.generation != generation,
                                recommit=lambda: self.commit(update, r, resync=False))
        if isinstance(waited, Exchange):
            return waited  # after a coordinator change exchange() commits again there
        manifest_reply, wait_s = waited
        try:
            manifest = open_manifest(manifest_reply.manifest, keys=self.authority.keys, run_id=self.cfg.run_id, round_=r)
        except ImpersonationError as exc:
            raise PeerExit(f"the coordinator at {self.client.endpoint} signs manifests with a key that is not the run's: {exc}") from None
        check_listed(manifest, update, r, peer_id=self.identity.peer_id, left_out=self.left_out)
        fail_point("manifest", r)
        if self.math.sliced:
            return sliced_exchange(
                client=self.client, exchange=self.slice_exchange, math=self.math, identity=self.identity, manifest=manifest,
                signed_manifest=manifest_reply.manifest, r=r, base=base, verify_header=self._verify_header, stop=self.stop,
                wait_s=wait_s, moved=lambda: self.client.generation != generation,
            )
        return self.manifest_fetcher.exchange(manifest, r, base, wait_s)

    def finish_round(self, r: int, result: Exchange, update: Update, stats: Any, compute: float,
                     started: float, before: Any, round_s: float | None = None, after: Any = None) -> None:
        """Adopt θ_{r+1}, check it against the coordinator's hash, record and print the round.

        `round_s`: this round's own wall time when it is not now − started (overlapped phases)."""
        if result.fatal:
            raise PeerExit(result.fatal)
        if result.unreachable:
            raise PeerExit(f"no coordinator of the run answered: {result.unreachable}. Giving up at round {r}; "
                           "restart with --resume when the run is back (--initial-peers: list several DHT addresses)")
        if result.finished:
            self.finished = True
            return
        if result.params is None:
            self.resync(result.resync)
            return
        self._set_params(result.params, r + 1)
        after = after or self.counter.total()
        self.round_traffic = {"round": r, "sent": after.sent - before.sent, "received": after.received - before.received}

        # The coordinator signs the authoritative hash of θ_{r+1}; compare instead of drifting.
        # Behind (the swarm closed later rounds without us, e.g. while the coordinator restarted):
        # not in sync either; the checkpoint brings us to the current round (also at the run's end).
        state = self.authority.state(r + 1) or self.authority.state()
        in_sync = state is not None and state.round == r + 1 and state.param_hash == self._hash
        record = {
            "round": r, "updates": result.updates, "excluded": result.excluded, "train_loss": stats.mean_loss,
            "bytes_sent": self.round_traffic["sent"], "bytes_received": self.round_traffic["received"],
            "payload_bytes": len(update.payload), "compute_s": compute, "encode_s": update.encode_s,
            "wait_s": result.wait_s, "fetch_s": result.fetch_s, "aggregate_s": result.aggregate_s,
            "round_s": round_s if round_s is not None else time.monotonic() - started, "in_sync": in_sync,
            "exchange_s": result.exchange_s, "utilization": self.utilization(), "slices": result.slices,
            "landed_after_steps": result.landed_after_steps,
        }
        self.history.append(record)
        if in_sync:
            self.publish_state()  # before the heartbeat that tells the coordinator we hold θ_{r+1}
        self.heartbeat_now.set()
        print(round_line(self.short, r, self.cfg.rounds.rounds, record, self.utilization()), flush=True)
        if not in_sync:
            self.resync(f"parameter hash differs from the coordinator's after round {r}")
        self._save_local_state()
        if state is not None and state.finished:
            self.finished = True

    def commit(self, update: Update, r: int, *, resync: bool = True) -> bool:
        """Push (client mode) and commit the round's update; False when we resynchronised instead.

        A coordinator that does not know us (it restarted from a checkpoint without us, or we
        changed endpoint) gets one fresh Join, then the same signed update again.
        """
        for attempt in range(2):
            try:
                if self.options.client_mode:
                    self.client.push(push_chunks(update.signed, update.payload))
                self.client.submit(update.signed, self.endpoint)
            except Refused as exc:
                refused = exc
                if attempt == 0 and exc.refusal in REJOIN:
                    self.send_join()
                    continue
                break
            fail_point("committed", r)
            return True
        log.warning("peer %s: round %d update refused: %s", self.short, r, refused.reason)
        if refused.refusal in RESYNC:
            if resync:
                self.resync(f"update refused: {refused.name}")
            return False
        if refused.refusal in FATAL:
            raise PeerExit(refused.reason)
        return True  # e.g. the run just finished: the manifest wait tells

    # --- local state (--resume) ---------------------------------------------------------

    def _save_local_state(self) -> None:
        if self.options.identity_path:  # an ephemeral identity cannot resume anyway
            save_local_state(self.state_path, round_=self.round, params=self.params, param_hash=self._hash,
                             config_hash=self.cfg.config_hash(), trainer=self.trainer, math=self.math,
                             writer=self.writer if self.cfg.rounds.overlap_communication else None)

    def _load_local_state(self) -> None:
        ckpt = load_local_state(self.state_path, config_hash=self.cfg.config_hash(), trainer=self.trainer, math=self.math)
        if ckpt is not None:
            self._set_params(ckpt.params, ckpt.round)
            log.info("peer %s resumed local state at round %d", self.short, ckpt.round)

    # --- teardown ------------------------------------------------------------------------

    def quiesce(self) -> None:
        """Stop background calls so the byte counters hold still (for a final summary)."""
        self.stop.set()
        self.heartbeat_now.set()
        if self.heartbeat_thread is not None:
            self.heartbeat_thread.join(timeout=15)

    def close(self) -> None:
        self.quiesce()
        ranks.detach(self)
        if self.server is not None:
            self.server.stop(grace=1.0).wait(2.0)
        if self.client is not None:
            self.client.close()
        if self.pool is not None:
            self.pool.close()
        if self.fetchers is not None:
            self.fetchers.shutdown(wait=False, cancel_futures=True)
        if self.slice_exchange is not None:
            self.slice_exchange.close()
        if self.writer is not None:
            self.writer.shutdown(wait=True)  # a state write in flight must land whole
        if self.dht is not None:
            self.dht.shutdown()
