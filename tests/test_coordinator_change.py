"""A round in flight and a coordinator switch (failover): a successor that continues the manifest
the round holds is no change (the round goes on, nothing fetched or reduced again); any other
switch restarts the round (peer/node/coordinator_change.py)."""

from __future__ import annotations

import hashlib

from peer.node.coordinator_change import CoordinatorChange
from protocol.envelope import RoundManifest, open_manifest, sign_manifest
from protocol.identity import Identity
from protocol.run_state import CoordinatorKeys, TermFence
from protocol.wire import swarm_pb2

OLD, NEW = Identity.generate(), Identity.generate()
KEYS = CoordinatorKeys.of([OLD.peer_id, NEW.peer_id])


class Client:
    """A coordinator client after a switch: its generation and the successor's manifest of round 2."""

    def __init__(self) -> None:
        self.generation, self.endpoint, self.asked = 0, "127.0.0.1:1", 0
        self.reply = swarm_pb2.ManifestReply(ready=False, current_round=2)

    def manifest(self, round_: int, wait_s: float) -> swarm_pb2.ManifestReply:
        assert (round_, wait_s) == (2, 0.0)
        self.asked += 1
        return self.reply


def manifest(term: int, excluded: dict[str, str], continues: str = "", continues_term: int = 0) -> RoundManifest:
    return RoundManifest(run_id="r", round=2, base_param_hash="B", entries=[], excluded=excluded, term=term, continues=continues,
                         continues_term=continues_term)


def held_round(client: Client, fence: TermFence) -> tuple[CoordinatorChange, str]:
    signed = sign_manifest(OLD, manifest(0, {"x" * 32: "late"}))
    moved = CoordinatorChange(client, r=2, keys=KEYS, run_id="r", fence=fence)
    moved.hold(open_manifest(signed, keys=KEYS, run_id="r", round_=2), signed)
    return moved, hashlib.sha256(signed.body).hexdigest()


def test_a_successor_that_continues_the_held_manifest_is_no_change():
    client, fence = Client(), TermFence()
    moved, sha = held_round(client, fence)
    assert not moved() and client.asked == 0  # no switch: nothing asked
    client.generation = 1
    assert moved() and client.asked == 1 and moved.reported  # switched, no manifest there yet: the round restarts
    client.reply = swarm_pb2.ManifestReply(ready=True, current_round=2,
                                           manifest=sign_manifest(NEW, manifest(1, {"x" * 32: "late"}, continues=sha)))
    moved.reported = False
    assert not moved() and not moved.reported and fence.term == 1  # the continuation: the round goes on, term 1 seen
    assert not moved() and client.asked == 2  # the switch it continued is not asked about again


def test_a_successor_with_another_manifest_or_a_superseded_term_is_a_change():
    client, fence = Client(), TermFence()
    moved, sha = held_round(client, fence)
    client.generation = 1
    client.reply = swarm_pb2.ManifestReply(ready=True, current_round=2, manifest=sign_manifest(NEW, manifest(1, {})))  # reopened
    assert moved()
    fence.observe(5, NEW.peer_id)
    client.reply = swarm_pb2.ManifestReply(ready=True, current_round=2,
                                           manifest=sign_manifest(NEW, manifest(1, {"x" * 32: "late"}, continues=sha)))
    assert moved()  # the right body, but in a term lower than one this peer has seen


def test_before_the_manifest_is_in_hand_any_switch_is_a_change():
    client = Client()
    moved = CoordinatorChange(client, r=2, keys=KEYS, run_id="r", fence=None)
    client.generation = 1
    assert moved() and client.asked == 0
