"""The peer's side of an exchange mode: what it adds to an update, and one round's exchange once
the signed manifest is in hand (the coordinator's side: peer/exchange/coordinator_side.py).

A mode's peer side touches neither the model nor the node's parameters: it gets θ_r and returns
a RoundOutcome, so the overlapped schedule can run it beside the next inner phase.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

import torch

from peer.exchange.outcome import Landing, RoundOutcome
from peer.run.round_math import RoundMath
from peer.run.timeouts import PeerTimeouts
from protocol.coordinator_port import CoordinatorPort
from protocol.envelope import RoundManifest, UpdateHeader
from protocol.identity import Identity
from protocol.payload_fetch import ChannelPool
from protocol.payload_store import PayloadStore
from protocol.wire import swarm_pb2


@dataclass(frozen=True, slots=True)
class PeerExchangeContext:
    """What a peer's exchange may use: the node's wire, store and math, nothing of its state."""

    client: CoordinatorPort
    math: RoundMath
    identity: Identity
    store: PayloadStore
    pool: ChannelPool
    workers: ThreadPoolExecutor
    verify_header: Callable[[Any, int | None], UpdateHeader]  # (signed header, round or None) -> header
    own_endpoint: str  # "" in client mode
    stop: threading.Event
    timeouts: PeerTimeouts


@dataclass(frozen=True, slots=True)
class ManifestInHand:
    """Round r's signed manifest, opened and checked (signature, run, round) by the node."""

    r: int
    manifest: RoundManifest
    signed: swarm_pb2.Signed
    base: torch.Tensor  # θ_r, (d,)
    wait_s: float  # how long the peer waited for it
    moved: Callable[[], bool]  # the run's coordinator changed since the round was committed
    # overlapped rounds: told θ_{r+1} as soon as it is computed, before the coordinator's word on it
    landed: Callable[[Landing], None] | None = None


class PeerExchange(ABC):
    # A client-mode peer pushes its whole payload to the coordinator before committing (all-to-all);
    # the sliced exchange pushes each slice to its owners once the manifest names them instead.
    pushes_to_coordinator = True

    def __init__(self, ctx: PeerExchangeContext) -> None:
        self.ctx = ctx

    def slice_hashes(self, payload: bytes) -> tuple[str, ...]:
        """What the signed header commits to beside the payload's sha256 (per-slice hashes)."""
        return ()

    def serve(self, header: UpdateHeader, payload: bytes) -> None:
        """Make our own signed update fetchable the way this mode fetches it (it is in the store)."""

    @abstractmethod
    def run(self, round_: ManifestInHand) -> RoundOutcome:
        """The exchange after the manifest: θ_{r+1}, or why not. Raises nothing it can turn into
        an outcome; a coordinator change (round_.moved()) ends it with Resync."""

    def close(self) -> None:
        pass
