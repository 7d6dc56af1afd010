"""What one round hands between a peer's phases; waiting for the round's signed manifest and
checking that it lists our update; the all-to-all exchange: fetch a manifest's payloads, verify,
aggregate (the sliced exchange is peer/node/sliced_round.py).

Fetching touches neither the model nor the peer's parameters, so the overlapped schedule can
run it beside the next inner phase.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from peer.run.faults import fail_point
from peer.run.round_math import RoundMath, UpdateRejected
from protocol.reasons import count_for_cause
from protocol.envelope import EnvelopeError, RoundManifest, UpdateHeader, signed_from_json
from protocol.payload_fetch import ChannelPool, fetch_payload
from protocol.payload_service import PayloadStore, StoredPayload

log = logging.getLogger("swarmloco.peer")
MANIFEST_POLL_S = 5.0  # long-poll slice; between slices the peer re-checks that its commitment is held


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
    landed_after_steps: int | None = None  # overlapped: inner steps of the next phase run before it finished
    fetch_s: float = 0.0
    aggregate_s: float = 0.0
    resync: str = ""
    finished: bool = False
    unreachable: str = ""  # no coordinator of the run answered: the peer gives up with this message
    fatal: str = ""  # the peer must stop (e.g. the coordinator signs with a key that is not the run's)
    slices: dict[str, int] = field(default_factory=dict)  # sliced exchange: owned, recomputed, spot-checked, liars


def await_manifest(client: Any, r: int, *, stop: threading.Event, changed: Callable[[], bool],
                   recommit: Callable[[], bool]) -> tuple[Any, float] | Exchange:
    """Long-poll the coordinator (`client`) for round r's signed manifest: (the ready reply, seconds
    waited), or the Exchange that ends the round here: the coordinator changed (`changed()`), our
    update was refused on re-commit, the run finished, or the round closed without the manifest.
    Between polls `recommit()` makes sure the coordinator holds our commitment: a restarted one has
    forgotten it (re-committing the same header is idempotent)."""
    t_wait = time.monotonic()
    reply = None
    while not stop.is_set():
        reply = client.manifest(r, wait_s=MANIFEST_POLL_S)
        if changed():
            return Exchange(resync="coordinator changed")
        if reply.ready or reply.current_round > r or reply.finished:
            break
        if not recommit():
            return Exchange(resync="our update was refused")
    wait_s = time.monotonic() - t_wait
    if reply is not None and reply.ready:
        return reply, wait_s
    if reply is not None and reply.finished and reply.current_round <= r:
        return Exchange(finished=True, wait_s=wait_s)
    return Exchange(resync=f"missed the manifest of round {r}", wait_s=wait_s)


def check_listed(manifest: RoundManifest, update: Update, r: int, *, peer_id: str, left_out: list[int]) -> None:
    """Censorship made visible: our committed update must be in the signed manifest, or be excluded
    with a reason. Otherwise the log says so, `left_out` gets the round, and status shows it (the
    heartbeat carries it)."""
    short = peer_id[:8]
    if peer_id in manifest.excluded:
        log.warning("peer %s: round %d: the manifest excludes our update: %s", short, r, manifest.excluded[peer_id])
    elif not any(e.peer_id == peer_id for e in manifest.entries):
        left_out.append(r)
        print(f"peer {short} | WARNING: round {r}: the coordinator's signed manifest leaves out our committed update "
              f"{hashlib.sha256(update.signed.body).hexdigest()[:12]} without a reason ({len(left_out)} round(s) so far)", flush=True)


@dataclass(slots=True)
class ManifestFetcher:
    """Fetch, verify and decode every update a signed manifest lists (in its peer_id order)."""

    store: PayloadStore
    pool: ChannelPool
    workers: ThreadPoolExecutor
    math: RoundMath
    verify_header: Callable[[Any, int | None], UpdateHeader]
    own_endpoint: str

    def exchange(self, manifest: RoundManifest, r: int, base: torch.Tensor, wait_s: float) -> Exchange:
        """The all-to-all exchange once the signed manifest is in hand: every listed update,
        verified, aggregated onto θ_r (base, (d,)) -> θ_{r+1}. Touches no node state."""
        t_fetch = time.monotonic()
        try:
            updates = self.updates(manifest, r)
        except (EnvelopeError, UpdateRejected, IOError) as exc:
            # The coordinator verified every listed update; failing here means we cannot
            # follow this round identically: resync rather than drift.
            log.warning("round %d: cannot use an update of the manifest (%s)", r, exc)
            return Exchange(resync="could not verify a manifest entry", wait_s=wait_s)
        fetch_s = time.monotonic() - t_fetch
        fail_point("fetched", r)

        t_agg = time.monotonic()
        new_params = base.clone()
        self.math.apply(new_params, updates, round_=r, excluded_for_cause=count_for_cause(manifest.excluded))
        aggregate_s = time.monotonic() - t_agg
        fail_point("aggregated", r)
        return Exchange(params=new_params, updates=len(updates), excluded=manifest.excluded,
                        wait_s=wait_s, fetch_s=fetch_s, aggregate_s=aggregate_s)

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
