"""A takeover that continues the round in flight instead of reopening it.

A standby follows the active coordinator's signed manifest of the round in flight, and (sliced) its
owners' signed result batches once final (peer/coordinator/standby.py). When it takes over from the
state that manifest is based on, the new active fills the round's book with the manifest's
commitments (the peers' own signed headers) and signs the same manifest again in its term, as a
continuation of the earlier signed body (protocol/envelope.py: `continues`; anyone can check that
only the term differs). The owners' results stay bound to that body, so the batches it followed,
and those owners submit again after moving to it, count as they are: no peer commits a new update,
trains again or waits for a commit phase, and the round's owners, inputs and θ_r are the ones the
peers already worked on.

Safety does not rest on it: the earlier active can record nothing after the takeover (its lease,
the standbys' acks), peers refuse its term once they see ours, and the round's θ_{r+1} is what this
coordinator signs. A round that cannot be continued (no manifest followed, another base, a mode
whose coordinator holds the updates itself) is reopened, as before.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from peer.coordinator.round_book import Commitment
from protocol.envelope import EnvelopeError, check_entry, open_manifest, signed_from_json
from protocol.keys import CoordinatorKeys
from protocol.wire import swarm_pb2

if TYPE_CHECKING:
    from peer.coordinator.state import Coordinator

# After a takeover, the peers of the checkpoint are awaited this long unless they are heard from:
# the live ones are already looking for the new active (they probe the run's coordinators every
# 0.5 s once a call fails), a dead one never comes, and the round in flight, continued or
# reopened, should not wait two peer timeouts for it. Liveness only: a live peer heard later is
# awaited again from its next heartbeat.
TAKEOVER_GRACE_S = 4.0


def continue_round(c: Coordinator, signed: swarm_pb2.Signed, results: Sequence[swarm_pb2.Signed] = (), *,
                   final: bool = False) -> str:
    """Continue the open round under `signed`, the previous active's manifest of it, with the result
    batches followed so far (`final`: the previous active had made them final: the round's peers
    gathered them there, so it is applied as soon as we have, without waiting for their reports
    again; they may be in the next round already). '' when continued; else why not (the round
    stays open: reopened)."""
    cfg, r = c.cfg, c.round
    if not c.exchange.continues_in_flight:
        return f"the {c.exchange.name} exchange's coordinator holds the updates itself"
    try:
        manifest = open_manifest(signed, keys=CoordinatorKeys.of(cfg.control.coordinators), run_id=cfg.run_id, round_=r)
        commitments = {}
        for entry in manifest.entries:
            header_signed = signed_from_json(entry.header)
            header = c.math.open_update(header_signed, round_=r, layout_hash=c.layout_hash)
            check_entry(entry, header)
            commitments[entry.peer_id] = Commitment(header=header, signed=header_signed, endpoint=entry.holders[0] if entry.serves else "",
                                                    arrived=time.monotonic(), status="verified")
    except EnvelopeError as exc:
        return f"its manifest does not hold ({exc})"
    if manifest.term >= c.term or manifest.base_param_hash != c.param_hash:
        return f"its manifest (term {manifest.term}) is not based on the state of round {r} that this coordinator holds"
    # A continuation of a continuation stays bound to the first signed body: the owners signed over it.
    continues = manifest.continues or hashlib.sha256(signed.body).hexdigest()
    continues_term = manifest.continues_term if manifest.continues else manifest.term
    with c.lock:
        if not c.lease.holds():
            return "the lease is not held yet"
        book = c.book
        if book.closed or book.commitments or c.finished:
            return "the round has moved on here"
        book.commitments.update(commitments)
        book.excluded.update(manifest.excluded)
        book.first_arrival = time.monotonic()
        c.clock.continue_manifest(book, manifest, continues=continues, continues_term=continues_term)
    c.exchange.submit_followed(results)  # checked against the manifest like any owner's
    if final and results:
        with c.lock:
            c.exchange.gathered_elsewhere()
    return ""
