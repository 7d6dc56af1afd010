"""All-to-all, the peer's side: fetch every update the manifest lists, verify, aggregate.

Each peer downloads n − 1 payloads and runs the robust rule on the whole (n, d) stack: simple and
exact for whole-vector rules (krum, geometric median), O(n) per peer, so for small swarms.
"""

from __future__ import annotations

import logging
import time

import torch

from peer.exchange.outcome import Applied, Resync, RoundOutcome
from peer.exchange.peer_side import ManifestInHand, PeerExchange
from peer.run.faults import fail_point
from peer.run.round_math import UpdateRejected
from protocol.envelope import EnvelopeError, RoundManifest, check_entry, signed_from_json
from protocol.payload_fetch import fetch_payload
from protocol.payload_store import StoredPayload
from protocol.reasons import count_for_cause

log = logging.getLogger("swarmloco.peer")


class AllToAllPeer(PeerExchange):
    def run(self, round_: ManifestInHand) -> RoundOutcome:
        """Every listed update, verified, aggregated onto θ_r -> θ_{r+1}."""
        r, manifest = round_.r, round_.manifest
        t_fetch = time.monotonic()
        try:
            updates = self.updates(manifest, r)
        except (EnvelopeError, UpdateRejected, IOError) as exc:
            # The coordinator verified every listed update; failing here means we cannot
            # follow this round identically: resync rather than drift.
            log.warning("round %d: cannot use an update of the manifest (%s)", r, exc)
            return Resync("could not verify a manifest entry", wait_s=round_.wait_s)
        fetch_s = time.monotonic() - t_fetch
        fail_point("fetched", r)

        t_agg = time.monotonic()
        new_params = round_.base.clone()
        self.ctx.math.apply(new_params, updates, round_=r, excluded_for_cause=count_for_cause(manifest.excluded))
        aggregate_s = time.monotonic() - t_agg
        fail_point("aggregated", r)
        return Applied(params=new_params, updates=len(updates), excluded=manifest.excluded,
                       wait_s=round_.wait_s, fetch_s=fetch_s, aggregate_s=aggregate_s)

    def updates(self, manifest: RoundManifest, r: int) -> list[torch.Tensor]:
        """Raises EnvelopeError / UpdateRejected / IOError when an entry cannot be used."""
        # All listed payloads at once: n − 1 sequential streams leave a long-RTT link idle
        # while each ramps up. Results keep the manifest's (peer_id-sorted) order.
        payloads = list(self.ctx.workers.map(lambda entry: self.payload(entry, r), manifest.entries))
        return [self.ctx.math.decode(payload, r) for payload in payloads]

    def payload(self, entry, r: int) -> bytes:
        """One manifest entry's payload, from our store or any holder, checked against its signed header."""
        ctx = self.ctx
        item = ctx.store.get(entry.payload_sha256)
        if item is not None:
            return item.payload
        signed = signed_from_json(entry.header)
        entry_header = ctx.verify_header(signed, r)
        check_entry(entry, entry_header)
        holders = [h for h in entry.holders if h and h != ctx.own_endpoint]
        # Gossip: any holder's copy is as good as the author's; a random order spreads the
        # author's upload over the coordinator and the peers that already verified it.
        data = fetch_payload(ctx.pool, holders, entry_header, shuffle=True)
        ctx.store.put(StoredPayload(entry_header, signed, data), verified=True)
        return data
