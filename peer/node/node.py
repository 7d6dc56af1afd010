"""A training peer: joins a run, trains H inner steps per round, exchanges updates, applies the outer step.

Round r, as shared/DESIGN.md ("Roles") fixes it:
  θ_r -> H AdamW steps -> Δ = θ_r − θ_local -> encode -> sign header -> serve payload (or push it)
  -> commit to the coordinator -> wait for the signed manifest -> the run's exchange mode
  (peer/exchange/) -> θ_{r+1}; compare its hash with the coordinator's and resynchronise from the
  swarm's state instead of drifting.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import torch

from peer import VERSION
from peer.exchange import modes
from peer.exchange.outcome import Applied, Fatal, Finished, Resync, RoundOutcome, Unreachable
from peer.exchange.peer_side import PeerExchange, PeerExchangeContext
from peer.learn.data import DeviceSampler, peer_sampler
from peer.learn.model import build_model, flat_params, layout_hash, load_flat_params, param_hash
from peer.learn.training import InnerTrainer
from peer.node import ranks
from peer.node.coordinator_client import CoordinatorClient
from peer.node.errors import NotAdmitted, PeerExit
from peer.node.heartbeat import Banned, Heartbeat, MustStop, NodeSnapshot, NotReachable, RunFinished
from peer.node.inner_phase import InnerPhase
from peer.node.local_state import hold_identity, load_local_state, save_local_state
from peer.node.options import PeerOptions
from peer.node.overlap import outcome_mark, run_overlapped
from peer.node.phase import RoundPhase
from peer.node.resync import StateSource
from peer.node.state_serving import announce_state, state_publication
from peer.node.round import PeerRound, Update, round_record
from peer.node.round_exchange import RoundExchange
from peer.node.trust import join_run
from peer.run import paced_window
from peer.run.faults import check_environment
from peer.run.process_memory import keep_freed_memory
from peer.run.progress import round_line
from peer.run.round_math import RoundMath
from protocol import discovery
from protocol.accounting import ByteCounter, Traffic
from protocol.envelope import JOIN_TAG, UpdateHeader, build_update_header, sign_update
from protocol.identity import Identity
from protocol.lifetime import timed_step
from protocol.payload_fetch import ChannelPool
from protocol.payload_service import PayloadServicer, serve_payloads
from protocol.payload_store import PayloadStore, StoredPayload
from protocol.rpc_errors import Refused
from protocol.signing import sign_body

__all__ = ["PeerExit", "PeerNode", "PeerOptions"]  # the first and last live in peer.node.errors / .options
log = logging.getLogger("swarmloco.peer")


class PeerNode:
    """One training peer. A round's phases are public methods (train, make_update, commit,
    exchange, finish_round), composed by one_round (synchronous) or peer.node.overlap."""

    def __init__(self, options: PeerOptions) -> None:
        check_environment()  # a bad SWARMLOCO_FAIL_AT fails here, before anything starts
        paced_window.check_environment()  # and a bad SWARMLOCO_STEP_S
        self.options = options
        state_dir = Path(options.state_dir or (Path(options.identity_path).parent if options.identity_path else "."))
        # One process per key: IdentityInUse (an OSError: the CLI prints it) when another holds it.
        self.held = hold_identity(options.identity_path)
        self.identity: Identity = self.held.identity
        self.state_path = state_dir / f"peer-{self.identity.peer_id[:16]}.state"
        self.counter = ByteCounter(self.identity.peer_id)
        self.short = self.identity.peer_id[:8]
        self.dht = self.server = None
        self.client: CoordinatorClient | None = None
        self.endpoint = ""  # HOST:PORT of our payload server; "" in client mode
        self.pool: ChannelPool | None = None
        self.exchange_side: PeerExchange | None = None
        self.fetchers: ThreadPoolExecutor | None = None  # manifest fetches, state parts
        self.writer: ThreadPoolExecutor | None = None  # --resume state writes, one at a time, in order
        self.heartbeat: Heartbeat | None = None
        self.inner: InnerPhase | None = None
        self.round_exchange: RoundExchange | None = None
        self.stop = threading.Event()
        self.snapshot = NodeSnapshot()  # what the heartbeat reports: replaced whole, from this thread only
        self._phase = RoundPhase.STARTING
        self.round = 0
        self._hash = ""  # sha256 of self.params once built
        self.finished, self.banned_reason = False, ""
        self._window_from: float | None = None  # when the swarm's next compute window began (one_round)
        self.stop_reason = ""  # the coordinator will not have this process (MustStop)
        self.round_traffic: dict[str, int] = {}
        self.history: list[dict[str, Any]] = []
        self._joined_once = False  # the first accepted join is printed (launchers wait for that line)

    # --- what the heartbeat sees ----------------------------------------------------------

    @property
    def phase(self) -> RoundPhase:
        return self._phase

    @phase.setter
    def phase(self, phase: RoundPhase) -> None:
        self._phase = phase
        self._publish()

    @property
    def left_out(self) -> list[int]:
        """Rounds whose signed manifest left our valid commitment out without a reason."""
        return self.round_exchange.left_out if self.round_exchange is not None else []

    def _publish(self) -> None:
        """Freeze what the heartbeat reports (called on this node's threads after each change)."""
        inner = self.inner
        self.snapshot = NodeSnapshot(
            round=self.round, param_hash=self._hash, state=self._phase.value, round_bytes=tuple(self.round_traffic.items()),
            left_out=tuple(self.left_out), **({} if inner is None else {
                "step": inner.step, "loss": inner.last_loss, "compute_s": inner.compute_s, "training_started": inner.training_started}))

    def _waiting(self) -> None:
        if self.phase != RoundPhase.TRAINING:  # overlapped: the next inner phase is running
            self.phase = RoundPhase.WAITING

    def take_events(self) -> None:
        """What the heartbeat learnt since last time (a ban, the end of the run), on this thread."""
        for event in self.heartbeat.drain() if self.heartbeat is not None else ():
            match event:
                case Banned(reason=reason):
                    self.banned_reason = reason
                case RunFinished():
                    self.finished = True
                case MustStop(reason=reason):
                    self.stop_reason = reason
                case NotReachable(advice=advice):  # said once, loudly: else only a RESYNC would show it
                    print(f"peer {self.short} | WARNING: {advice}", flush=True)

    # --- setup ---------------------------------------------------------------------------

    def connect(self) -> None:
        joined = join_run(self.options, self.identity, self.counter)
        self.dht, self.client, self.cfg, self.authority, self.timeouts = joined.dht, joined.client, joined.cfg, joined.authority, joined.timeouts
        if self.dht is not None:
            for maddr in discovery.visible_maddrs(self.dht):  # this peer is a way into the swarm too
                print(f"peer {self.short} | DHT: --initial-peers {maddr}", flush=True)
        trusted = joined.trusted
        if trusted.state.finished:
            raise PeerExit(f"run {trusted.state.run_id} has already finished all its rounds (final hash {trusted.state.param_hash[:16]})")
        self._build(trusted.state.round)
        self._serve()
        self.exchange_side = self.make_exchange()
        self.round_exchange = RoundExchange(
            client=self.client, keys=self.authority.keys, run_id=self.cfg.run_id, peer_id=self.identity.peer_id,
            side=self.exchange_side, timeouts=self.timeouts, stop=self.stop,
            endpoint=self.endpoint, client_mode=self.options.client_mode, rejoin=self.send_join, waiting=self._waiting,
            fence=self.authority.fence, relocate=self.authority.relocate)
        self.send_join()
        self.announce()
        self.heartbeat = Heartbeat(client=self.client, identity=self.identity, counter=self.counter,
                                   snapshot=lambda: self.snapshot, announce=self.announce, rejoin=self.send_join, stop=self.stop,
                                   session=self.held.session, keepalive_s=self.cfg.rounds.peer_timeout_s / 4)
        self.heartbeat.start()

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
        self.inner = InnerPhase(cfg, self.counter, short=self.short, log_every=o.log_every, on_progress=self._publish)
        ranks.attach(self)  # a multi-rank peer steps through DDP (peer/node/ranks.py)
        self.round = round_
        self.store = PayloadStore(keep_rounds=2)
        self.pool = ChannelPool(self.counter)
        self.fetchers = ThreadPoolExecutor(max_workers=8, thread_name_prefix="swarmloco-fetch")
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="swarmloco-state")  # one write at a time, in order
        # Its thread starts now, at our priority: one the training thread started after lowering itself
        # (peer/node/thread_priority.py) would inherit SCHED_IDLE, and serving the state to joiners, the
        # heartbeat's wake-up and the --resume save would wait for idle cores.
        self.writer.submit(lambda: None).result()
        resumed = o.resume and self.state_path.exists() and load_local_state(
            self.state_path, config_hash=cfg.config_hash(), trainer=self.trainer, math=self.math)
        if resumed:  # --resume: θ_r and every local state as this peer last saved them
            self._set_params(resumed.params, resumed.round)
            # said on the terminal: a volunteer rerunning the join line sees that nothing was lost
            print(f"peer {self.short} | resumed its saved local state (round {resumed.round}) from {self.state_path}", flush=True)
        self._publish()

    def _serve(self) -> None:
        o = self.options
        if o.client_mode:
            self.endpoint = ""
            return
        servicer = PayloadServicer(self.store, verify_header=lambda s: self._verify_header(s, None), accept_pushes=False,
                                    accept_slice_pushes=True,  # sliced: owners trade, client-mode authors push us what we own
                                    current_round=lambda: self.round, own_peer_id=self.identity.peer_id)
        self.server, port = serve_payloads(servicer, self.counter, host=o.host, port=o.port)
        self.pool.aio.share_loop(self.server.loop)  # one gRPC loop in the process (protocol/aio_channels.py)
        self.endpoint = f"{o.announce_host}:{port}"

    def exchange_context(self) -> PeerExchangeContext:
        return PeerExchangeContext(client=self.client, math=self.math, identity=self.identity, store=self.store, pool=self.pool,
                                   workers=self.fetchers, verify_header=self._verify_header, own_endpoint=self.endpoint,
                                   stop=self.stop, timeouts=self.timeouts)

    def make_exchange(self) -> PeerExchange:
        """The run's exchange mode, the peer's side (a seam: the tests' Byzantine owners override it)."""
        return modes.peer_exchange(self.cfg.exchange.mode, self.exchange_context())

    def announce(self) -> None:
        """(Re)write our DHT record; the heartbeat refreshes it before it expires."""
        if self.dht is not None:
            discovery.announce_peer(self.dht, self.identity, run_id=self.cfg.run_id, endpoint=self.endpoint,
                                    client_mode=self.options.client_mode, version=VERSION)

    def send_join(self) -> None:
        """Join (or rejoin: a restarted coordinator that lost us, a new endpoint); same identity.
        Raises NotAdmitted when refused. May run on the heartbeat's thread: writes no node state
        (but the flag of the first join, which connect() sends before the heartbeat starts)."""
        body = {"run_id": self.cfg.run_id, "endpoint": self.endpoint, "client_mode": self.options.client_mode,
                "version": VERSION, "tokenizer_sha256": self.tokenizer_sha256, "timestamp": time.time(),
                # this process's session, and the one whose lock it took over (a restart after a crash)
                "session": self.held.session, "succeeds": self.held.succeeds}
        try:
            reply = self.client.join(sign_body(self.identity, JOIN_TAG, body))
        except Refused as exc:
            raise NotAdmitted(f"the coordinator refused to admit this peer: {exc.reason}", exc.refusal, exc.reason) from None
        joined = f"joined run {self.cfg.run_id} at round {reply.round} ({self.numel} params, codec {self.cfg.compression.codec})"
        if self._joined_once:  # a rejoin (a restarted coordinator, a new endpoint): the log has it
            log.info("peer %s %s", self.short, joined)
        else:  # said once on the terminal: launchers count the peers that joined by this line (peer/cli/launcher.py)
            print(f"peer {self.short} | {joined}", flush=True)
            self._joined_once = True

    def _verify_header(self, signed, round_: int | None) -> UpdateHeader:
        return self.math.open_update(signed, round_=round_, layout_hash=self.layout_hash)

    # --- state ---------------------------------------------------------------------------

    @property
    def current_hash(self) -> str:
        return self._hash

    def _set_params(self, flat: torch.Tensor, round_: int) -> None:
        self.params = flat.clone()
        self.round = round_
        self._hash = param_hash(self.params)
        load_flat_params(self.model, self.params.to(self.options.device))
        self._publish()

    def resync(self, why: str) -> None:
        """Download the swarm's state θ_r and continue from it (keeps local optimizer state):
        from the peers that hold it, part by part, else the coordinator's checkpoint."""
        self.phase = RoundPhase.SYNCING
        state = StateSource(client=self.client, pool=self.pool, workers=self.fetchers, config_hash=self.cfg.config_hash(),
                            run_id=self.cfg.run_id, keys=self.authority.keys, signed_hash=self.authority.signed_hash,
                            own_endpoint=self.endpoint, max_part_bytes=self.math.max_result_bytes() * 4 + (1 << 20)).fetch()
        self.math.load_global_state_dict(state.global_state)
        self._set_params(state.params, state.round)
        print(f"peer {self.short} | resynchronised to round {state.round + 1} ({why}; from {state.source})", flush=True)
        self.publish_state()

    def publish_state(self) -> None:
        """Serve our in-sync θ_r's parts, so joiners can fetch the swarm state from us."""
        state_publication(self)()

    def running(self, done: int, max_rounds: int | None) -> bool:
        """Whether to start another round: not finished, stopped, banned or at --max-rounds."""
        self.take_events()
        if self.finished or self.stop.is_set() or (max_rounds is not None and done >= max_rounds):
            return False
        if self.banned_reason:
            raise PeerExit(f"banned from the run: {self.banned_reason}")
        if self.stop_reason:
            raise PeerExit(self.stop_reason)
        return True

    def run(self, max_rounds: int | None = None) -> dict[str, Any]:
        # Everything set up so far (torch, hivemind, the model, gRPC) lives as long as the node: out of
        # the collector's sight, a full collection no longer walks ~200k objects (86 ms of CPU in
        # bench_vs_hivemind's worker; 0.13-0.28 s stalls of a peer mid-exchange on 2 loaded cores).
        gc.freeze()
        keep_freed_memory()  # a round's large temporaries reuse freed memory (peer/run/process_memory.py)
        state = self.authority.state()
        if state is None or state.param_hash != self._hash or state.round != self.round:
            self.resync("joining" if not self.options.resume else "resume state is behind the swarm")
        if self.cfg.rounds.overlap_communication:
            done = run_overlapped(self, max_rounds)
        else:
            done = 0
            while self.running(done, max_rounds):
                self.one_round()
                done += 1
        self.take_events()
        self.phase = RoundPhase.FINISHED if self.finished else RoundPhase.STOPPED
        if self.finished:
            self.heartbeat.beat()  # the coordinator serves the final state until every peer says it holds it
            print(f"peer {self.short} | finished: run {self.cfg.run_id} ended at round {self.round}, final hash {self._hash}", flush=True)
        fence = self.authority.fence  # the coordinator term it ended under, and any two actives in one term it saw
        return {"rounds": done, "round": self.round, "param_hash": self._hash, "history": self.history,
                "coordinator_term": fence.term, "coordinator_evidence": fence.evidence}

    # --- one round -----------------------------------------------------------------------

    def open_round(self, r: int) -> PeerRound:
        return PeerRound(r=r, base=self.params.clone(), started=time.monotonic(), before=self.counter.total())

    def one_round(self) -> None:
        """Train, commit, wait for the manifest, exchange: one synchronous round.

        A compute window (rounds.window_s) runs on the swarm's clock: it begins when the coordinator
        applied the last round, which every peer hears at once. A peer that is slow to take up θ_{r+1}
        (on a 0.1-core volunteer, 2 s of saving its state and checks) trains that much less, instead of
        committing that much later while the others wait for its commit."""
        rnd = self.open_round(self.round)
        window_from, self._window_from = self._window_from, None
        rnd.stats, rnd.compute_s = self.train(rnd.r, window_from=window_from)
        rnd.window_late_s = self.inner.window_late_s
        rnd.update = self.make_update(rnd.r, rnd.base - flat_params(self.model).cpu(), rnd.stats)  # Δ = θ_r − θ_local
        self.phase = RoundPhase.COMMITTING
        if self.commit(rnd.update, rnd.r):
            outcome = self.exchange(rnd)
            self.finish_round(rnd, outcome)
            in_sync = bool(self.history) and self.history[-1]["round"] == rnd.r and self.history[-1]["in_sync"]
            if self.cfg.rounds.window_s and in_sync and self.round == rnd.r + 1:  # not after a resync
                self._window_from = outcome_mark(outcome, "applied")

    def utilization(self) -> float:  # share of wall time in inner steps since the first one (start-up excluded)
        return self.snapshot.utilization(time.monotonic())

    def train(self, r: int, *, steps: int | None = None, stop: Callable[[], bool] | None = None,
              closes: float | None = None, window_from: float | None = None) -> tuple[Any, float]:
        """Round r's inner steps (peer/node/inner_phase.py) from the model as it is: (stats, seconds)."""
        self.phase = RoundPhase.TRAINING
        if self.cfg.rounds.window_s and ranks.world_size() > 1:
            raise PeerExit("this run sizes rounds by a compute window (rounds.window_s), which multi-rank peers do not "
                           "run yet: start this peer with one rank")
        ranks.start_round(self, self.cfg.inner.steps if steps is None else steps)  # every rank from this θ
        # Followers run the steps they are told in lockstep: with several ranks a phase is not cut.
        return self.inner.run(self.trainer, r, steps=steps, stop=stop if ranks.world_size() == 1 else None, closes=closes,
                              window_from=window_from)

    def make_update(self, r: int, delta: torch.Tensor, stats: Any) -> Update:
        """Encode and sign this peer's pseudo-gradient Δ (d,) for round r, with the work behind it
        (`stats`: the inner phase's steps and tokens); serve it from our store."""
        t0 = time.monotonic()
        payload = self.math.encode(delta, r)
        header = build_update_header(run_id=self.cfg.run_id, round_=r, peer_id=self.identity.peer_id, codec=self.cfg.compression.codec,
                                     numel=self.numel, layout_hash=self.layout_hash, base_param_hash=self._hash, payload=payload,
                                     slices=self.exchange_side.slice_hashes(payload), inner_steps=stats.steps, tokens=stats.tokens)
        signed = sign_update(self.identity, header)
        self.store.put(StoredPayload(header, signed, payload), verified=True)  # we just hashed it
        self.exchange_side.serve(header, payload)
        return Update(signed=signed, payload=payload, encode_s=time.monotonic() - t0)

    def commit(self, update: Update, r: int, *, resync: bool = True) -> bool:
        """Push (client mode) and commit the round's update (peer/node/round_exchange.py); False
        when it was refused for a reason that needs the swarm's state (then resynchronised, unless
        `resync` is False)."""
        refused = self.round_exchange.commit(update, r, poll_ahead=True)  # exchange() takes the manifest's long-poll sent with it
        if refused is None:
            return True
        if resync:
            self.resync(f"update refused: {refused}")
        return False

    def exchange(self, rnd: PeerRound) -> RoundOutcome:
        """Wait for round r's manifest and run the exchange mode on it (peer/node/round_exchange.py).
        Touches neither the model nor self.params, so it can run beside the next inner phase."""
        return self.round_exchange.run(rnd)

    def finish_round(self, rnd: PeerRound, outcome: RoundOutcome, *, round_s: float | None = None,
                     after: Traffic | None = None) -> None:
        """Handle the round's one outcome. Applied: adopt θ_{r+1}, check it against the
        coordinator's hash, record and print the round.

        `round_s`: this round's own wall time when it is not now − started (overlapped phases)."""
        match outcome:
            case Fatal(why=why):
                raise PeerExit(why)
            case Unreachable(why=why):
                raise PeerExit(f"no coordinator of the run answered: {why}. Giving up at round {rnd.r}; "
                               "restart with --resume when the run is back (--initial-peers: list several DHT addresses)")
            case Finished():
                self.finished = True
            case Resync(why=why):
                self.resync(why)
            case Applied():
                self._applied(rnd, outcome, round_s=round_s, after=after or self.counter.total())

    def _applied(self, rnd: PeerRound, result: Applied, *, round_s: float | None, after: Traffic) -> None:
        r = rnd.r
        self._set_params(result.params, r + 1)
        self.round_traffic = {"round": r, "sent": after.sent - rnd.before.sent, "received": after.received - rnd.before.received}
        # The coordinator signs the authoritative hash of θ_{r+1}; compare instead of drifting.
        # Behind (the swarm closed later rounds without us, e.g. while the coordinator restarted):
        # not in sync either; the checkpoint brings us to the current round (also at the run's end).
        state = self.authority.state(r + 1, carried=result.run_state) or self.authority.state()
        in_sync = state is not None and state.round == r + 1 and state.param_hash == self._hash
        record = round_record(rnd, result, traffic=self.round_traffic, in_sync=in_sync, utilization=self.utilization(),
                              round_s=round_s if round_s is not None else time.monotonic() - rnd.started)
        self.history.append(record)
        self._publish()
        beside = self.writer if self.cfg.rounds.overlap_communication else None  # overlapped: off the training thread
        announce_state(state_publication(self) if in_sync else None, heartbeat=self.heartbeat, round_=self.round, writer=beside)
        print(round_line(self.short, r, self.cfg.rounds.rounds, record, self.utilization()), flush=True)
        if not in_sync:
            self.resync(f"parameter hash differs from the coordinator's after round {r}")
        if self.options.identity_path:  # --resume state (an ephemeral identity cannot resume anyway)
            save_local_state(self.state_path, round_=self.round, params=self.params, param_hash=self._hash,
                             config_hash=self.cfg.config_hash(), trainer=self.trainer, math=self.math,
                             writer=beside)
        if state is not None and state.finished:
            self.finished = True

    # --- teardown ------------------------------------------------------------------------

    def quiesce(self) -> None:
        """Stop background calls so the byte counters hold still (for a final summary)."""
        self.stop.set()
        if self.heartbeat is not None:
            self.heartbeat.join()

    def close(self) -> None:
        with timed_step(log, "heartbeat thread"):
            self.quiesce()
        ranks.detach(self)
        if self.server is not None:
            with timed_step(log, "gRPC server"):
                self.server.stop(grace=1.0).wait(2.0)
        for part in (self.round_exchange, self.client, self.pool, self.exchange_side):
            if part is not None:
                part.close()
        if self.fetchers is not None:
            self.fetchers.shutdown(wait=False, cancel_futures=True)
        if self.writer is not None:
            with timed_step(log, "state writer"):
                self.writer.shutdown(wait=True)  # a state write in flight must land whole
        if self.dht is not None:
            with timed_step(log, "DHT process and p2pd"):
                discovery.stop_dht(self.dht)  # bounded: terminated, then killed, if its own shutdown hangs
        self.held.release()  # last: the state file is whole before another process may take this key
