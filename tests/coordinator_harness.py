"""An in-process coordinator on a real gRPC server on 127.0.0.1, and the signed messages a peer
sends it: the harness of the coordinator's unit and fuzz tests (test_coordinator_unit,
test_fuzz_rpc, test_rpc_limits, test_slice_rounds, test_fault_tolerance, test_tokenizer)."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import grpc
import torch

from peer.coordinator.server import build_coordinator_server
from peer.coordinator.service import CoordinatorServicer
from peer.coordinator.state import Coordinator
from peer.run.config import RunConfig
from peer.run.round_math import RoundMath
from protocol.envelope import HEARTBEAT_TAG, JOIN_TAG, UpdateHeader, build_update_header, sign_update
from protocol.identity import Identity
from protocol.payload_service import PayloadServicer, push_chunks
from protocol.ratelimit import CallerLimits
from protocol.signing import sign_body
from protocol.wire import swarm_pb2, swarm_pb2_grpc
from tests.helpers import tiny_run_config


def tiny_config(**rounds) -> RunConfig:
    """The one tiny run config (tests/conftest.py), a little smaller still for these in-process tests.

    They drive the coordinator's own payload verification, which only the all-to-all exchange
    has; the sliced round is covered by tests/test_slice_exchange.py and the swarm tests."""
    return tiny_run_config(
        data={"val_batches": 2, "max_corpus_bytes": 300_000}, inner={"steps": 4, "warmup_steps": 2},
        rounds={"rounds": 3, "min_deadline_s": 2.0, "deadline_s": 30.0, "peer_timeout_s": 6.0, **rounds},
        exchange={"mode": "all-to-all"},
    )


@dataclass
class Served:
    coordinator: Coordinator
    servicer: CoordinatorServicer
    payloads: PayloadServicer
    endpoint: str
    channel: grpc.Channel
    stub: swarm_pb2_grpc.CoordinatorStub
    peer_stub: swarm_pb2_grpc.PeerStub

    def status(self) -> dict:
        return json.loads(self.stub.Status(swarm_pb2.StatusRequest(), timeout=10).json)

    def rejections(self) -> dict[str, int]:
        return dict(self.coordinator.registry.rejections)


@contextmanager
def serve_coordinator(
    cfg: RunConfig,
    *,
    checkpoint_path: Path | None = None,
    generous_limits: bool = False,
    limits: CallerLimits | None = None,
    identity: Identity | None = None,
    **servicer_options,
) -> Iterator[Served]:
    """A Coordinator on 127.0.0.1, served by build_coordinator_server exactly as the CLI serves it,
    except that a Join's endpoint is not dialled back unless a test asks (dial_back=True): the
    tests' peers announce placeholder endpoints (127.0.0.1:9) that serve nothing."""
    servicer_options.setdefault("dial_back", False)
    coordinator = Coordinator(cfg, identity or Identity.generate(), checkpoint_path=checkpoint_path)
    if generous_limits:  # let hostile calls reach the handlers (rate limiting has its own test)
        limits = CallerLimits(per_peer_rate=1e6, per_peer_burst=1e6)
    built = build_coordinator_server(coordinator, host="127.0.0.1", port=0, limits=limits, **servicer_options)
    built.server.start()
    channel = grpc.insecure_channel(coordinator.endpoint)
    try:
        yield Served(
            coordinator, built.servicer, built.payloads, coordinator.endpoint, channel,
            swarm_pb2_grpc.CoordinatorStub(channel), swarm_pb2_grpc.PeerStub(channel),
        )
    finally:
        channel.close()
        built.server.stop(0).wait(5)
        coordinator.fetchers.shutdown(wait=False, cancel_futures=True)
        coordinator.channels.close()


@contextmanager
def round_clock(coordinator: Coordinator, period_s: float = 0.05) -> Iterator[None]:
    """What coordinator_main's loop does: tick the round clock until the block ends."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(period_s):
            coordinator.tick()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)


def join_body(served: Served, endpoint: str = "", **extra) -> dict:
    return {"run_id": served.coordinator.cfg.run_id, "endpoint": endpoint, "client_mode": not endpoint,
            "version": "test", "timestamp": time.time(), **extra}


def join(served: Served, identity: Identity, endpoint: str = "") -> swarm_pb2.JoinReply:
    return served.stub.Join(sign_body(identity, JOIN_TAG, join_body(served, endpoint)), timeout=10)


def heartbeat(served: Served, identity: Identity, **fields) -> swarm_pb2.HeartbeatReply:
    c = served.coordinator
    body = {"peer_id": identity.peer_id, "round": c.round, "param_hash": c.param_hash, "state": "training",
            "timestamp": time.time(), **fields}
    return served.stub.Heartbeat(sign_body(identity, HEARTBEAT_TAG, body), timeout=10)


def make_update(served: Served, identity: Identity, *, seed: int = 0, round_: int | None = None) -> tuple[swarm_pb2.Signed, bytes, UpdateHeader]:
    """A valid signed update for the open round: a small random pseudo-gradient, encoded with the run's codec."""
    c = served.coordinator
    r = c.round if round_ is None else round_
    math = RoundMath(c.cfg, c.numel)
    payload = math.encode(torch.randn(c.numel, generator=torch.Generator().manual_seed(seed)) * 1e-3, r)
    header = build_update_header(
        run_id=c.cfg.run_id, round_=r, peer_id=identity.peer_id, codec=c.cfg.compression.codec, numel=c.numel,
        layout_hash=c.layout_hash, base_param_hash=c.param_hash, payload=payload,
        slices=tuple(hashlib.sha256(part).hexdigest() for part in math.sliced_codec.split(payload)) if math.mode.header_slices(math.layout) else (),
    )
    return sign_update(identity, header), payload, header


def push_and_commit(served: Served, signed: swarm_pb2.Signed, payload: bytes) -> swarm_pb2.CommitReply:
    """Client-mode path: push the payload, then commit with no endpoint (verified synchronously)."""
    reply = served.peer_stub.PushPayload(push_chunks(signed, payload), timeout=10)
    assert reply.accepted
    return served.stub.SubmitCommitment(swarm_pb2.CommitRequest(header=signed), timeout=10)


def equivocate(served: Served, identity: Identity) -> swarm_pb2.CommitReply:
    """`identity` commits one update of the open round, then a second, different one: the reply
    to the second (an EQUIVOCATION refusal that bans it)."""
    first, payload, _ = make_update(served, identity, seed=1)
    second, _, _ = make_update(served, identity, seed=2)
    assert push_and_commit(served, first, payload).accepted
    return served.stub.SubmitCommitment(swarm_pb2.CommitRequest(header=second), timeout=10)
