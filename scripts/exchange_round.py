"""One swarmloco exchange round through the real exchange code, minus training and the coordinator process.

Used by scripts/bench_vs_hivemind.py (one ExchangePeer per worker process, the parent process as
BenchCoordinator) and by its smoke test (a few peers in one process). Every step is the code a
node and the coordinator run; only the transport of headers, manifest and results between them
is the caller's (a pipe instead of the coordinator's gRPC service).

sliced (`exchange.mode = "sliced"`, peer/run/slice_exchange.py):
    ExchangePeer.commit()       RoundMath.encode (outer transmit, sliced codec, error feedback) -> sha256
                                of the payload and of every slice -> signed UpdateHeader(slices=...) ->
                                PayloadStore, every slice served by its sha256 (SliceExchange.serve_slices)
    BenchCoordinator.manifest() verifies every signed header, sliced_manifest (entries sorted by peer_id,
                                the owner draw), signs it: the bytes every peer receives
    ExchangePeer.open()         open_manifest (coordinator key, run, round) -> SliceExchange.open_round
                                (every entry's header verified again, the owner draw re-checked)
    ExchangePeer.reduce()       SliceExchange.reduce_owned: for each owned slice, its n inputs traded with
                                the other owners over gRPC (one SwapSlices stream a pair) and checked against
                                the signed slice hashes, decoded, reduced, signed
    ExchangePeer.gather()       SliceExchange.gather over all owners' signed results (one claim: fetch the
                                aggregated slice from an owner; spot checks recompute) -> step_with_aggregate
all-to-all (`exchange.mode = "all-to-all"`, peer/exchange/all_to_all_peer.py AllToAllPeer):
    commit() without slice hashes, open() the manifest; reduce() does nothing; gather() fetches every
    other payload in parallel, decodes each and RoundMath.apply aggregates the (n, d) rows.

The outer optimizer is fedavg at lr 1 from θ = 0, so a peer's parameters after the round are
exactly minus the aggregate: with the `mean` rule, checkable against the exact mean.
Import only after any hivemind DHT of the process has started: gRPC is not fork-safe.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from peer.exchange.all_to_all_peer import AllToAllPeer
from peer.exchange.peer_side import PeerExchangeContext
from peer.run.timeouts import PeerTimeouts
from peer.run.config import RunConfig
from peer.run.round_math import RoundMath
from peer.run.slice_exchange import SliceExchange
from peer.run.slice_round import SliceRound, sliced_manifest
from protocol.keys import CoordinatorKeys
from protocol.accounting import ByteCounter
from protocol.envelope import (ManifestEntry, RoundManifest, UpdateHeader, build_update_header, open_manifest, sign_manifest,
                               sign_update, signed_to_json)
from protocol.identity import Identity
from protocol.payload_fetch import ChannelPool
from protocol.payload_service import PayloadServicer, serve_payloads
from protocol.payload_store import PayloadStore, StoredPayload
from protocol.wire import swarm_pb2

RUN_ID = "bench"
LAYOUT = "bench"
BASE_HASH = "0" * 64
FETCH_THREADS = 8  # as peer/node/node.py

Header = tuple[str, bytes, str]  # (peer_id, serialized signed UpdateHeader, HOST:PORT)


@dataclass(frozen=True, slots=True)
class ExchangeSpec:
    """How a benchmark round exchanges: what the row of a report states."""

    codec: str = "fp16"
    mode: str = "sliced"  # or "all-to-all"
    slices: int = 32
    replicas: int = 2
    spot_checks: int = 1  # slices every peer recomputes per round (peer/exchange/sliced_peer.py uses the config's)
    aggregator: str = "mean"
    error_feedback: bool = True  # the node's default for a lossy codec (hivemind's compression has none)

    def config(self) -> RunConfig:
        return RunConfig.from_dict({
            "run_id": RUN_ID, "outer": {"name": "fedavg", "lr": 1.0}, "compression": {"codec": self.codec, "error_feedback": self.error_feedback},
            "aggregation": {"name": self.aggregator},
            "exchange": {"mode": self.mode, "slices": self.slices, "replicas": self.replicas, "spot_checks": min(self.spot_checks, self.slices)},
        })

    @property
    def label(self) -> str:
        ef = "" if self.error_feedback else " no-EF"
        if self.mode == "sliced":
            return f"sliced S={self.slices} r={self.replicas} k={self.spot_checks} {self.codec}{ef} {self.aggregator}"
        return f"all-to-all {self.codec}{ef} {self.aggregator}"


class BenchCoordinator:
    """The coordinator's part of a round: verify the headers, sign the manifest (with the owner draw)."""

    def __init__(self, spec: ExchangeSpec, numel: int) -> None:
        self.identity = Identity.generate()
        self.math = RoundMath(spec.config(), numel)
        self.sliced = self.math.mode.name == "sliced"  # this harness drives each mode's engine directly

    @property
    def public_key(self) -> bytes:
        return self.identity.public_key

    def manifest(self, headers: list[Header], round_: int) -> bytes:
        entries = []
        for peer_id, signed_bytes, endpoint in headers:
            signed = swarm_pb2.Signed.FromString(signed_bytes)
            header = self.math.open_update(signed, round_=round_, layout_hash=LAYOUT)
            assert header.peer_id == peer_id
            entries.append(ManifestEntry(peer_id=peer_id, payload_sha256=header.payload_sha256, payload_size=header.payload_size,
                                         header=signed_to_json(signed), holders=[endpoint], serves=True))
        if self.sliced:
            manifest = sliced_manifest(self.math, round_, entries, base_param_hash=BASE_HASH)
        else:
            manifest = RoundManifest(run_id=RUN_ID, round=round_, base_param_hash=BASE_HASH,
                                     entries=sorted(entries, key=lambda e: e.peer_id), excluded={})
        return sign_manifest(self.identity, manifest).SerializeToString()


class ExchangePeer:
    """A peer's transport (gRPC server, byte counter, channel pool, fetch threads) and its round math."""

    def __init__(self, update: torch.Tensor, spec: ExchangeSpec) -> None:
        self.update = update  # (d,) what this peer contributes every round
        self.numel = update.numel()
        self.spec = spec
        self.identity = Identity.generate()
        self.counter = ByteCounter(self.identity.peer_id)
        self.store = PayloadStore(keep_rounds=1)
        # as a peer's (peer/node/node.py): owners trade the slices they own (SwapSlices), checked
        servicer = PayloadServicer(self.store, verify_header=lambda signed: self.verify_header(signed, None), accept_pushes=False,
                                   accept_slice_pushes=True, own_peer_id=self.identity.peer_id)
        self.server, port = serve_payloads(servicer, self.counter, host="127.0.0.1", port=0)
        self.endpoint = f"127.0.0.1:{port}"
        self.pool = ChannelPool(self.counter)
        self.pool.aio.share_loop(self.server.loop)  # as a node does (peer/node/node.py)
        self.workers = ThreadPoolExecutor(max_workers=FETCH_THREADS, thread_name_prefix="bench-fetch")
        self.math = RoundMath(spec.config(), self.numel)
        self.sliced = self.math.mode.name == "sliced"  # this harness drives each mode's engine directly
        self.exchange = SliceExchange(self.math, self.pool, self.store, self.workers, own_endpoint=self.endpoint,
                                      identity=self.identity)
        self.payload = b""
        self.round: SliceRound | None = None
        self.manifest: RoundManifest | None = None
        self.outcome: Any = None  # the last GatherOutcome (sliced)

    @property
    def peer_id(self) -> str:
        return self.identity.peer_id

    def verify_header(self, signed: swarm_pb2.Signed, round_: int | None) -> UpdateHeader:
        return self.math.open_update(signed, round_=round_, layout_hash=LAYOUT)

    def commit(self, round_: int) -> Header:
        payload = self.math.encode(self.update, round_)
        slices = tuple(self.exchange.slice_hashes(payload)) if self.sliced else ()
        header = build_update_header(run_id=RUN_ID, round_=round_, peer_id=self.peer_id, codec=self.spec.codec, numel=self.numel,
                                     layout_hash=LAYOUT, base_param_hash=BASE_HASH, payload=payload, slices=slices)
        signed = sign_update(self.identity, header)
        self.store.put(StoredPayload(header, signed, payload), verified=True)  # we just hashed it
        if self.sliced:
            self.exchange.serve_slices(header, payload)
        self.payload = payload
        return self.peer_id, signed.SerializeToString(), self.endpoint

    def open(self, signed_manifest: bytes, coordinator_key: bytes, round_: int) -> None:
        signed = swarm_pb2.Signed.FromString(signed_manifest)
        self.manifest = open_manifest(signed, keys=CoordinatorKeys.of_key(coordinator_key), run_id=RUN_ID, round_=round_)
        if self.sliced:
            self.round = self.exchange.open_round(self.manifest, signed, round_, self.verify_header)

    def reduce(self) -> list[bytes]:
        """Reduce-scatter: this peer's owned slices, reduced and signed (serialized)."""
        if not self.sliced:
            return []
        assert self.round is not None
        return [s.SerializeToString() for s in self.exchange.reduce_owned(self.round)]

    def gather(self, results: list[bytes], round_: int) -> torch.Tensor:
        """All-gather (sliced) or fetch-all + aggregate (all-to-all); returns θ after the outer step from 0."""
        params = torch.zeros(self.numel)
        if self.sliced:
            assert self.round is not None
            signed = [swarm_pb2.Signed.FromString(b) for b in results]
            x = self.math.cfg.exchange  # spot checks as a peer runs them (peer/exchange/sliced_peer.py)
            self.outcome = self.exchange.gather(self.round, signed, spot_checks=x.spot_checks, coverage=x.spot_check_coverage)
            self.math.step_with_aggregate(params, self.outcome.combined, round_=round_)
            return params
        assert self.manifest is not None
        # Only the fetch-and-decode half of the all-to-all mode: no coordinator to wait on here.
        fetcher = AllToAllPeer(PeerExchangeContext(
            client=None, math=self.math, identity=self.identity, store=self.store, pool=self.pool, workers=self.workers,
            verify_header=self.verify_header, own_endpoint=self.endpoint, stop=threading.Event(), timeouts=PeerTimeouts()))
        updates = fetcher.updates(self.manifest, round_)
        self.math.apply(params, updates, round_=round_)
        return params

    def close(self) -> None:
        self.exchange.close()
        self.workers.shutdown(wait=False, cancel_futures=True)
        self.pool.close()
        self.server.stop(grace=0.5)


def run_round(peers: list[ExchangePeer], coordinator: BenchCoordinator, round_: int) -> list[torch.Tensor]:
    """One round of `peers` in this process, in the order a swarm runs it; θ of every peer after it."""
    signed_manifest = coordinator.manifest([p.commit(round_) for p in peers], round_)
    for p in peers:
        p.open(signed_manifest, coordinator.public_key, round_)
    with ThreadPoolExecutor(len(peers)) as pool:  # at once, as peers run it: an owner awaits the trades others open with it
        results = [r for batch in pool.map(ExchangePeer.reduce, peers) for r in batch]
    return [p.gather(results, round_) for p in peers]
