"""What one round hands between a peer's phases, and fetching a manifest's payloads.

Fetching touches neither the model nor the peer's parameters, so the overlapped schedule can
run it beside the next inner phase.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from peer.run.round_math import RoundMath
from protocol.envelope import EnvelopeError, RoundManifest, UpdateHeader, signed_from_json
from protocol.payload_fetch import ChannelPool, fetch_payload
from protocol.payload_service import PayloadStore, StoredPayload


@dataclass(slots=True)
class Update:
    signed: Any
    payload: bytes
    encode_s: float


@dataclass(slots=True)
class Exchange:
    params: torch.Tensor | None = None  # θ_{r+1}, or None when we must resynchronise
    updates: int = 0
    excluded: dict[str, str] = field(default_factory=dict)
    wait_s: float = 0.0  # idle: waiting for the manifest (overlapped: for the background exchange)
    exchange_s: float = 0.0  # overlapped: time the background exchange took beside training
    fetch_s: float = 0.0
    aggregate_s: float = 0.0
    resync: str = ""
    finished: bool = False
    unreachable: str = ""  # no coordinator of the run answered: the peer gives up with this message
    fatal: str = ""  # the peer must stop (e.g. the coordinator signs with a key that is not the run's)
    info: Any = None  # the coordinator's word on θ_{r+1} (round, param_hash, finished), read after aggregating
    slices: dict[str, int] = field(default_factory=dict)  # sliced exchange: owned, recomputed, spot-checked, liars


@dataclass(slots=True)
class ManifestFetcher:
    """Fetch, verify and decode every update a signed manifest lists (in its peer_id order)."""

    store: PayloadStore
    pool: ChannelPool
    workers: ThreadPoolExecutor
    math: RoundMath
    verify_header: Callable[[Any, int | None], UpdateHeader]
    own_endpoint: str

    def updates(self, manifest: RoundManifest, r: int) -> list[torch.Tensor]:
        """Raises EnvelopeError / UpdateRejected / IOError when an entry cannot be used."""
        # All listed payloads at once: n − 1 sequential streams leave a long-RTT link idle
        # while each ramps up. Results keep the manifest's (peer_id-sorted) order.
        payloads = list(self.workers.map(lambda entry: self.payload(entry, r), manifest.entries))
        return [self.math.decode(payload, r) for payload in payloads]

    def payload(self, entry, r: int) -> bytes:
        """One manifest entry's payload, from our store or any holder, checked against its signed header."""
        item = self.store.get(entry.payload_sha256)
        if item is not None:
            return item.payload
        entry_header = self.verify_header(signed_from_json(entry.header), r)
        if entry_header.payload_sha256 != entry.payload_sha256 or entry_header.peer_id != entry.peer_id:
            raise EnvelopeError("forged", f"manifest entry of {entry.peer_id[:8]} does not match its signed header")
        holders = [h for h in entry.holders if h and h != self.own_endpoint]
        # Gossip: any holder's copy is as good as the author's; a random order spreads the
        # author's upload over the coordinator and the peers that already verified it.
        data = fetch_payload(self.pool, holders, entry_header, shuffle=True)
        self.store.put(StoredPayload(entry_header, signed_from_json(entry.header), data), verified=True)
        return data
