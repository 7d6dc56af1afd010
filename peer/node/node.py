"""A training peer: joins a run, trains H inner steps per round, exchanges updates, applies the outer step.

Round r, as DESIGN.md fixes it:
  θ_r -> H AdamW steps -> Δ = θ_r − θ_local -> encode -> sign header -> serve payload (or push it)
  -> commit to the coordinator -> wait for the signed manifest -> fetch listed payloads from any
  holder, verify -> aggregate + outer step -> θ_{r+1}; compare its hash with the coordinator's and
  resynchronise from the checkpoint instead of drifting.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
import torch

from peer import VERSION

from peer.run import checkpoint
from peer.run.config import RunConfig
from peer.node.coordinator_client import CoordinatorClient
from peer.learn.data import DeviceSampler, ShardSampler, load_corpus, shard_for_peer
from peer.learn.model import build_model, flat_params, layout_hash, load_flat_params, param_hash
from peer.node.heartbeat import heartbeat_loop
from peer.node.overlap import run_overlapped
from peer.run.progress import format_bytes, round_line, step_line
from peer.node.round_exchange import Exchange, ManifestFetcher, Update
from peer.run.round_math import RoundMath, UpdateRejected, count_for_cause
from peer.learn.training import InnerTrainer
from protocol import discovery
from protocol.wire import swarm_pb2_grpc
from protocol.accounting import ByteCounter
from protocol.channels import create_server
from protocol.envelope import JOIN_TAG, EnvelopeError, UpdateHeader, open_manifest, sign_update
from protocol.identity import Identity
from protocol.payload_fetch import ChannelPool
from protocol.payload_service import PayloadServicer, PayloadStore, StoredPayload, push_chunks
from protocol.signing import sign_body

log = logging.getLogger("swarmloco.peer")
MANIFEST_POLL_S = 5.0  # long-poll slice; between slices the peer re-checks that its commitment is held


class PeerExit(Exception):
    """The peer must stop; the message says why and what to do."""


@dataclass(kw_only=True, slots=True)
class PeerOptions:
    coordinator: str | None = None  # HOST:PORT of the coordinator's gRPC port
    initial_peers: list[str] = field(default_factory=list)  # DHT multiaddrs
    run_id: str | None = None
    identity_path: str | None = None
    data: str | None = None
    client_mode: bool = False
    device: str = "cpu"
    host: str = "0.0.0.0"
    port: int = 0
    announce_host: str = "127.0.0.1"
    host_maddrs: list[str] = field(default_factory=lambda: ["/ip4/0.0.0.0/tcp/0"])
    announce_maddrs: list[str] = field(default_factory=list)
    shard: int | None = None
    num_shards: int | None = None
    threads: int | None = None
    state_dir: str | None = None  # where --resume state is kept (default: next to the identity)
    resume: bool = False
    log_every: int = 5
    connect_timeout_s: float = 10.0
    attack: str | None = None  # test-only: a Byzantine peer for integration tests
    attack_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.coordinator and not self.initial_peers:
            raise ValueError("give --coordinator HOST:PORT or --initial-peers MULTIADDR (the coordinator prints both)")
        if self.coordinator and (":" not in self.coordinator or not self.coordinator.rsplit(":", 1)[1].isdigit()):
            raise ValueError(f"--coordinator {self.coordinator!r}: expected HOST:PORT, e.g. 127.0.0.1:31338")
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"--device {self.device!r}: use cpu or cuda")
        if (self.shard is None) != (self.num_shards is None):
            raise ValueError("--shard needs the form I/N")
        if self.log_every < 1:
            raise ValueError("--log-every must be at least 1")


class PeerNode:
    def __init__(self, options: PeerOptions) -> None:
        self.options = options
        state_dir = Path(options.state_dir or (Path(options.identity_path).parent if options.identity_path else "."))
        self.identity = Identity.load_or_create(options.identity_path) if options.identity_path else Identity.generate()
        self.state_path = state_dir / f"peer-{self.identity.peer_id[:16]}.state"
        self.counter = ByteCounter(self.identity.peer_id)
        self.short = self.identity.peer_id[:8]
        self.dht = None
        self.server = None
        self.client: CoordinatorClient | None = None
        self.stop = threading.Event()
        self.heartbeat_now = threading.Event()
        self.state = "starting"
        self.round = 0
        self.step = 0
        self.last_loss: float | None = None
        self.finished = False
        self.banned_reason = ""
        self.compute_s = 0.0
        self.started = time.monotonic()
        self.training_started: float | None = None  # first inner step: utilization excludes start-up
        self.round_traffic: dict[str, int] = {}
        self.history: list[dict[str, Any]] = []

    # --- setup ---------------------------------------------------------------------------

    def connect(self) -> None:
        o = self.options
        endpoint = o.coordinator
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
            run = discovery.find_run(self.dht, o.run_id, timeout_s=o.connect_timeout_s)
            endpoint = endpoint or run.endpoint
            log.info("found run %s: coordinator %s at %s", run.run_id, run.coordinator_id[:8], run.endpoint)
        assert endpoint is not None
        self.client = CoordinatorClient(endpoint, self.counter)
        self.client.wait_ready(timedelta(seconds=o.connect_timeout_s))
        info = self.client.run_info()
        if o.run_id and info.run_id != o.run_id:
            raise PeerExit(f"coordinator at {endpoint} runs {info.run_id!r}, not {o.run_id!r}")
        self.cfg = RunConfig.from_json(info.config_json)
        self.coordinator_key = bytes(info.coordinator_public_key)
        if info.finished:
            raise PeerExit(f"run {info.run_id} has already finished all its rounds")
        self._build(info)
        self._serve()
        self.manifest_fetcher = ManifestFetcher(
            self.store, self.pool, self.fetchers, self.math, self._verify_header, self.endpoint
        )
        self._join()

    def _build(self, info) -> None:
        cfg, o = self.cfg, self.options
        if o.threads:
            torch.set_num_threads(o.threads)
        self.model = build_model(cfg.model, cfg.seed).to(o.device)
        self.layout_hash = layout_hash(self.model)
        self.params = flat_params(self.model).cpu()  # θ_r on CPU: the round math is CPU float32
        self.numel = self.params.numel()
        self.math = RoundMath(cfg, self.numel)
        data_cfg = cfg.data if o.data is None else dataclasses.replace(cfg.data, path=o.data)
        corpus = load_corpus(data_cfg, seq_len=cfg.model.seq_len)
        if o.shard is not None:
            shard, num_shards = o.shard, o.num_shards
        else:
            num_shards = 16
            shard = shard_for_peer(self.identity.peer_id, num_shards)
        self.sampler = ShardSampler(
            corpus.train, shard=shard, num_shards=num_shards, batch_size=cfg.data.batch_size, seq_len=cfg.model.seq_len, seed=cfg.seed
        )
        poison = None
        self.attack = None
        if o.attack:
            from optim import attacks

            self.attack = attacks.build(o.attack, **o.attack_options)
            if self.attack.data_poisoning:
                poison = attacks.poison_batch
        self.trainer = InnerTrainer(self.model, cfg.inner, DeviceSampler(self.sampler, o.device), poison_batch=poison)
        self.round = info.round
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

    def _join(self) -> None:
        self._send_join()
        if self.dht is not None:
            discovery.announce_peer(
                self.dht, self.identity, run_id=self.cfg.run_id, endpoint=self.endpoint,
                client_mode=self.options.client_mode, version=VERSION,
            )
        self.heartbeat_thread = threading.Thread(target=heartbeat_loop, args=(self,), name="swarmloco-heartbeat", daemon=True)
        self.heartbeat_thread.start()

    def _send_join(self) -> None:
        """Join (or rejoin: a restarted coordinator that lost us, a new endpoint); same identity."""
        assert self.client is not None
        body = {
            "run_id": self.cfg.run_id,
            "endpoint": self.endpoint,
            "client_mode": self.options.client_mode,
            "version": VERSION,
            "timestamp": time.time(),
        }
        reply = self.client.join(sign_body(self.identity, JOIN_TAG, body))
        if not reply.accepted:
            if reply.reason.startswith("banned"):
                self.banned_reason = reply.reason
            raise PeerExit(f"the coordinator refused to admit this peer: {reply.reason}")
        log.info("peer %s joined run %s at round %d (%d params, codec %s)", self.short, self.cfg.run_id, reply.round, self.numel, self.cfg.compression.codec)

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
        """Download the coordinator's checkpoint and continue from it (keeps local optimizer state)."""
        self.state = "syncing"
        data, round_ = self.client.checkpoint()
        ckpt = checkpoint.from_bytes(data)
        if ckpt.config_hash != self.cfg.config_hash():
            raise PeerExit("the coordinator's checkpoint is for another run config; restart the peer to pick up the new config")
        self.math.load_global_state_dict(ckpt.outer_state)
        self._set_params(ckpt.params, ckpt.round)
        if self._hash != ckpt.param_hash:
            raise PeerExit("downloaded checkpoint does not match its declared parameter hash; retry later")
        log.info("peer %s resynchronised to round %d (%s, %s)", self.short, ckpt.round, why, format_bytes(len(data)))

    def run(self, max_rounds: int | None = None) -> dict[str, Any]:
        info = self.client.run_info()
        self._hash = param_hash(self.params)
        if info.param_hash != self._hash or info.round != self.round:
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
        self.state = "finished" if self.finished else "stopped"
        return {"rounds": done, "round": self.round, "param_hash": self._hash, "history": self.history}

    def one_round(self) -> None:
        """Train, commit, wait for the manifest, fetch, aggregate: one synchronous round."""
        r, base = self.round, self.params.clone()  # θ_r, (d,)
        started = time.monotonic()
        before = self.counter.total()
        stats, compute = self._train(r)
        local = flat_params(self.model).cpu()
        update = self._make_update(r, base - local)  # pseudo-gradient Δ = θ_r − θ_local
        if not self._commit(update.signed, update.payload, r):
            return
        result = self._exchange(r, base, update)
        self._finish_round(r, result, update, stats, compute, started, before)

    def utilization(self) -> float:
        """Share of wall time spent in inner steps since the first one (start-up excluded)."""
        if self.training_started is None:
            return 0.0
        return self.compute_s / max(1e-9, time.monotonic() - self.training_started)

    def _train(self, r: int) -> tuple[Any, float]:
        if self.training_started is None:
            self.training_started = time.monotonic()
        self.counter.round = r
        self.state = "training"
        cfg = self.cfg
        first_step = self.trainer.step
        t0 = time.monotonic()

        def on_step(step: int, loss: float) -> None:
            self.step, self.last_loss = step, loss
            local_step = step - first_step
            if local_step % self.options.log_every == 0 or local_step == cfg.inner.steps:
                elapsed = time.monotonic() - t0
                print(step_line(self.short, r, cfg.rounds.rounds, local_step, cfg.inner.steps, loss,
                                local_step * cfg.data.batch_size * cfg.model.seq_len / max(elapsed, 1e-9),
                                self.counter.total()), flush=True)

        stats = self.trainer.run(cfg.inner.steps, on_step)
        compute = time.monotonic() - t0
        self.compute_s += compute
        return stats, compute

    def _make_update(self, r: int, delta: torch.Tensor) -> Update:
        """Encode and sign this peer's pseudo-gradient for round r; serve it from our store."""
        t0 = time.monotonic()
        cfg = self.cfg
        if self.attack is not None and not self.attack.data_poisoning:
            gen = torch.Generator().manual_seed(r)
            delta = self.attack(delta, delta[None, :], round=r, rng=gen, num_byzantine=1, history=None)
        payload = self.math.encode(delta, r)
        header = UpdateHeader(
            run_id=cfg.run_id, round=r, peer_id=self.identity.peer_id, codec=cfg.compression.codec, numel=self.numel,
            layout_hash=self.layout_hash, base_param_hash=self._hash,
            payload_sha256=hashlib.sha256(payload).hexdigest(), payload_size=len(payload),
        )
        signed = sign_update(self.identity, header)
        self.store.put(StoredPayload(header, signed, payload), verified=True)  # we just hashed it
        self.state = "committing"
        return Update(signed=signed, payload=payload, encode_s=time.monotonic() - t0)

    def _exchange(self, r: int, base: torch.Tensor, update: Update) -> Exchange:
        """Wait for round r's manifest, fetch and verify its updates, aggregate: θ_{r+1}.

        Touches neither the model nor self.params, so it can run beside the next inner phase.
        """
        cfg = self.cfg
        t_wait = time.monotonic()
        if self.state != "training":
            self.state = "waiting"
        manifest_reply = None
        while not self.stop.is_set():
            manifest_reply = self.client.manifest(r, wait_s=MANIFEST_POLL_S)
            if manifest_reply.ready or manifest_reply.current_round > r or manifest_reply.finished:
                break
            # Still open: make sure the coordinator holds our commitment; a restarted coordinator
            # has forgotten it (re-committing the same header is idempotent).
            if not self._commit(update.signed, update.payload, r, resync=False):
                return Exchange(resync="our update was refused")
        wait_s = time.monotonic() - t_wait
        if manifest_reply is None or not manifest_reply.ready:
            if manifest_reply is not None and manifest_reply.finished and manifest_reply.current_round <= r:
                return Exchange(finished=True, wait_s=wait_s)
            return Exchange(resync=f"missed the manifest of round {r}", wait_s=wait_s)
        manifest = open_manifest(manifest_reply.manifest, coordinator_key=self.coordinator_key, run_id=cfg.run_id, round_=r)

        t_fetch = time.monotonic()
        try:
            updates = self.manifest_fetcher.updates(manifest, r)
        except (EnvelopeError, UpdateRejected, IOError) as exc:
            # The coordinator verified every listed update; failing here means we cannot
            # follow this round identically: resync rather than drift.
            log.warning("peer %s: cannot use an update of round %d (%s)", self.short, r, exc)
            return Exchange(resync="could not verify a manifest entry", wait_s=wait_s)
        fetch_s = time.monotonic() - t_fetch

        t_agg = time.monotonic()
        new_params = base.clone()
        self.math.apply(new_params, updates, round_=r, excluded_for_cause=count_for_cause(manifest.excluded))
        aggregate_s = time.monotonic() - t_agg
        return Exchange(
            params=new_params, updates=len(updates), excluded=manifest.excluded,
            wait_s=wait_s, fetch_s=fetch_s, aggregate_s=aggregate_s,
            info=self.client.run_info(),  # the coordinator's hash of θ_{r+1}, to compare with ours
        )

    def _finish_round(self, r: int, result: Exchange, update: Update, stats: Any, compute: float,
                      started: float, before: Any, round_s: float | None = None, after: Any = None) -> None:
        """`round_s`: this round's own wall time when it is not now − started (overlapped phases)."""
        """Adopt θ_{r+1}, check it against the coordinator's hash, record and print the round."""
        if result.finished:
            self.finished = True
            return
        if result.params is None:
            self.resync(result.resync)
            return
        self._set_params(result.params, r + 1)
        after = after or self.counter.total()
        self.round_traffic = {"round": r, "sent": after.sent - before.sent, "received": after.received - before.received}

        # The coordinator states the authoritative hash of θ_{r+1}; compare instead of drifting.
        info = result.info or self.client.run_info()
        # Behind (the swarm closed later rounds without us, e.g. while the coordinator restarted):
        # not in sync either; the checkpoint brings us to the current round (also at the run's end).
        in_sync = info.round == r + 1 and info.param_hash == self._hash
        record = {
            "round": r, "updates": result.updates, "excluded": result.excluded, "train_loss": stats.mean_loss,
            "bytes_sent": self.round_traffic["sent"], "bytes_received": self.round_traffic["received"],
            "payload_bytes": len(update.payload), "compute_s": compute, "encode_s": update.encode_s,
            "wait_s": result.wait_s, "fetch_s": result.fetch_s, "aggregate_s": result.aggregate_s,
            "round_s": round_s if round_s is not None else time.monotonic() - started, "in_sync": in_sync,
            "exchange_s": result.exchange_s, "utilization": self.utilization(),
        }
        self.history.append(record)
        self.heartbeat_now.set()
        print(round_line(self.short, r, self.cfg.rounds.rounds, record, self.utilization()), flush=True)
        if not in_sync:
            self.resync(f"parameter hash differs from the coordinator's after round {r}")
        self._save_local_state()
        if info.finished:
            self.finished = True

    def _commit(self, signed, payload: bytes, r: int, *, resync: bool = True) -> bool:
        """Push (client mode) and commit the round's update; False when we resynchronised instead.

        A coordinator that does not know us (it restarted from a checkpoint without us, or we
        changed endpoint) gets one fresh Join, then the same signed update again.
        """
        for attempt in range(2):
            try:
                if self.options.client_mode:
                    self.client.push(push_chunks(signed, payload))
                reply = self.client.submit(signed, self.endpoint)
            except grpc.RpcError as exc:
                if attempt == 0 and exc.code() == grpc.StatusCode.PERMISSION_DENIED and "unknown peer" in (exc.details() or ""):
                    self._send_join()
                    continue
                raise
            if reply.accepted:
                return True
            if attempt == 0 and reply.reason.startswith(("unknown-peer", "wrong-endpoint")):
                self._send_join()
                continue
            break
        log.warning("peer %s: round %d update refused: %s", self.short, r, reply.reason)
        if reply.reason.startswith(("stale-round", "wrong-base")):
            if resync:
                self.resync(reply.reason.split(":")[0])
            return False
        if reply.reason.startswith("equivocation") or "banned" in reply.reason:
            raise PeerExit(reply.reason)
        return True  # e.g. the run just finished: the manifest wait tells

    # --- local state (--resume) ---------------------------------------------------------

    def _save_local_state(self) -> None:
        if not self.options.identity_path:
            return  # an ephemeral identity cannot resume anyway
        ckpt = checkpoint.Checkpoint(
            round=self.round, params=self.params, param_hash=self._hash, config_hash=self.cfg.config_hash(),
            outer_state=self.math.global_state_dict(),
            local_state={
                "trainer": self.trainer.state_dict(),
                "math": self.math.local_state_dict(),
            },
        )
        if self.cfg.rounds.overlap_communication:
            # Written beside the next inner phase; the snapshot above is already a copy.
            self.writer.submit(checkpoint.save, self.state_path, copy.deepcopy(ckpt))
        else:
            checkpoint.save(self.state_path, ckpt)

    def _load_local_state(self) -> None:
        ckpt = checkpoint.load(self.state_path)
        if ckpt.config_hash != self.cfg.config_hash():
            log.warning("resume state %s is for another run config; starting fresh", self.state_path)
            return
        self.trainer.load_state_dict(ckpt.local_state["trainer"])
        self.math.load_local_state_dict(ckpt.local_state.get("math") or {})
        self.math.load_global_state_dict(ckpt.outer_state)
        self._set_params(ckpt.params, ckpt.round)
        log.info("peer %s resumed local state at round %d", self.short, ckpt.round)

    # --- teardown ------------------------------------------------------------------------

    def quiesce(self) -> None:
        """Stop background calls so the byte counters hold still (for a final summary)."""
        self.stop.set()
        self.heartbeat_now.set()
        thread = getattr(self, "heartbeat_thread", None)
        if thread is not None:
            thread.join(timeout=15)

    def close(self) -> None:
        self.quiesce()
        if self.server is not None:
            self.server.stop(grace=1.0).wait(2.0)
        if self.client is not None:
            self.client.close()
        if getattr(self, "pool", None) is not None:
            self.pool.close()
        if getattr(self, "fetchers", None) is not None:
            self.fetchers.shutdown(wait=False, cancel_futures=True)
        if getattr(self, "writer", None) is not None:
            self.writer.shutdown(wait=True)  # a state write in flight must land whole
        if self.dht is not None:
            self.dht.shutdown()
