"""Whether a round in flight must restart because the run's coordinator changed under it.

A peer's client switches to another coordinator when the one it talked to is gone or superseded
(failover: peer/node/coordinator_client.py counts switches in `generation`). Before the round's
manifest is in hand, any switch restarts the round there (commit again, wait for its manifest).
After it, a successor that *continues* that manifest (a standby that took over with it:
peer/coordinator/continuation.py) is no change for the round: its manifest is the same body signed
again in a higher term (protocol/envelope.py checks `continues` against the body), so the round's
owners, inputs and θ_r are the ones this peer already worked on, and the result batches it signed
stay bound to that body. The round goes on where it was, instead of fetching and reducing again.

The successor's manifest is checked like any (a run key, the run, the round) and its term goes
through the peer's fence; anything else (no manifest there yet, another body, a lower term, no
answer) is a change, and the round restarts as before.
"""

from __future__ import annotations

import hashlib
import logging

import grpc

from protocol.coordinator_port import CoordinatorPort
from protocol.envelope import EnvelopeError, RoundManifest, open_manifest
from protocol.identity import peer_id_of
from protocol.run_state import CoordinatorKeys, TermFence
from protocol.wire import swarm_pb2

log = logging.getLogger("swarmloco.peer")


def first_body(manifest: RoundManifest, signed: swarm_pb2.Signed) -> str:
    """The sha256 of the signed body a manifest is (or continues): what owners' results are bound to."""
    return manifest.continues or hashlib.sha256(signed.body).hexdigest()


class CoordinatorChange:
    """Called as `moved()`: True once the client switched coordinators since the round was
    committed, unless the one it switched to continues the manifest the round holds (`hold`)."""

    def __init__(self, client: CoordinatorPort, *, r: int, keys: CoordinatorKeys, run_id: str, fence: TermFence | None) -> None:
        self.client, self.r, self.keys, self.run_id, self.fence = client, r, keys, run_id, fence
        self.generation = client.generation
        self.body = ""  # first_body of the manifest the round runs under, once in hand
        self.reported = False  # a call returned True: the round may have stopped for it (it restarts)

    def hold(self, manifest: RoundManifest, signed: swarm_pb2.Signed) -> None:
        self.body = first_body(manifest, signed)

    def __call__(self) -> bool:
        generation = self.client.generation
        if generation == self.generation:
            return False
        if self.body and self._continues_here():
            log.info("round %d: the run's new coordinator %s continues its manifest: the round goes on", self.r, self.client.endpoint)
            self.generation = generation
            return False
        self.reported = True
        return True

    def _continues_here(self) -> bool:
        try:
            reply = self.client.manifest(self.r, wait_s=0.0)
            if not reply.ready:
                return False
            manifest = open_manifest(reply.manifest, keys=self.keys, run_id=self.run_id, round_=self.r)
        except (grpc.RpcError, ConnectionError, EnvelopeError) as exc:
            log.info("round %d: the new coordinator's manifest: %s", self.r, exc)
            return False
        if self.fence is not None and not self.fence.observe(manifest.term, peer_id_of(bytes(reply.manifest.public_key)), reply.manifest):
            return False
        return first_body(manifest, reply.manifest) == self.body
