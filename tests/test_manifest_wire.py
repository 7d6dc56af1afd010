"""The compact manifest on the wire (protocol/manifest_wire.py): the coordinator's exact signed
body comes back, and a damaged one is refused with a clear error."""

import dataclasses
import zlib

import pytest

from protocol import manifest_wire
from protocol._generated import swarm_pb2
from protocol.envelope import EnvelopeError, MANIFEST_TAG, RoundManifest, open_manifest, sign_manifest, sign_update
from protocol.identity import Identity
from protocol.keys import CoordinatorKeys
from protocol.signing import MAX_BODY_BYTES
from tests.test_envelope import _entry, sliced_header

COORDINATOR = Identity.generate()
KEYS = CoordinatorKeys.of_key(COORDINATOR.public_key)


def manifest(n: int) -> RoundManifest:
    entries = []
    for k in range(n):
        p = Identity.generate()
        header = sliced_header(p, payload_size=1000 + k, inner_steps=k % 3)
        entries.append(_entry(p, sign_update(p, header), header))
    entries.sort(key=lambda e: e.peer_id)
    owners = [[entries[j % n].peer_id, entries[(j + 1) % n].peer_id] for j in range(32)]
    return RoundManifest(run_id="run", round=3, base_param_hash="B", entries=entries, excluded={"ab" * 16: "late"},
                         owners=owners, last=True, term=2, work_history={e.peer_id: 7 for e in entries[:3]})


def test_compact_manifest_rebuilds_the_signed_body_bit_exact_at_half_the_bytes():
    full = sign_manifest(COORDINATOR, manifest(48))
    compact = manifest_wire.compress(full)
    assert compact.body.startswith(manifest_wire.COMPRESSED) and not full.body.startswith(manifest_wire.COMPRESSED)
    assert (compact.signature, compact.public_key) == (full.signature, full.public_key)
    assert len(compact.SerializeToString()) < 0.6 * len(full.SerializeToString())  # 48 peers: ~22 KB -> ~11 KB
    travelled = swarm_pb2.Signed.FromString(compact.SerializeToString())
    rebuilt = manifest_wire.expand(travelled)
    assert rebuilt.SerializeToString() == full.SerializeToString()  # the coordinator's exact bytes, signature included
    assert open_manifest(rebuilt, keys=KEYS, run_id="run", round_=3) == open_manifest(full, keys=KEYS, run_id="run", round_=3)
    assert manifest_wire.expand(full) is full  # a full body passes through
    with pytest.raises(EnvelopeError):  # the compact form itself is not what was signed
        open_manifest(compact, keys=KEYS, run_id="run", round_=3)


def test_compact_manifests_are_compressed_once_each():
    made = manifest_wire.CompactManifests()
    a, b = sign_manifest(COORDINATOR, manifest(4)), sign_manifest(COORDINATOR, dataclasses.replace(manifest(4), term=3))
    assert made.of(a) is made.of(a)
    assert manifest_wire.expand(made.of(b)) == b and manifest_wire.expand(made.of(a)) == a


def damaged(body: bytes) -> swarm_pb2.Signed:
    full = sign_manifest(COORDINATOR, manifest(4))
    return swarm_pb2.Signed(body=body, signature=full.signature, public_key=full.public_key)


@pytest.mark.parametrize("how", ["truncated", "garbage", "trailing", "empty"])
def test_a_damaged_compact_manifest_is_refused_as_malformed(how):
    body = manifest_wire.compress(sign_manifest(COORDINATOR, manifest(4))).body
    body = {"truncated": body[:len(body) // 2], "garbage": manifest_wire.COMPRESSED + b"\x00not zlib" * 9,
            "trailing": body + b"\x00", "empty": manifest_wire.COMPRESSED}[how]
    with pytest.raises(EnvelopeError, match="compressed manifest") as caught:
        manifest_wire.expand(damaged(body))
    assert caught.value.reason == "malformed"


def test_a_compact_manifest_that_inflates_past_the_body_limit_is_refused_unread():
    bomb = manifest_wire.COMPRESSED + zlib.compress(MANIFEST_TAG.encode() + b"\n" + b" " * (4 * MAX_BODY_BYTES), 9)
    assert len(bomb) < MAX_BODY_BYTES // 64
    with pytest.raises(EnvelopeError, match="inflates past") as caught:
        manifest_wire.expand(damaged(bomb))
    assert caught.value.reason == "oversized"


def test_a_tampered_compact_manifest_never_opens():
    full = sign_manifest(COORDINATOR, manifest(8))
    body = bytearray(manifest_wire.compress(full).body)
    for at in range(1, len(body), max(1, len(body) // 40)):
        flipped = bytearray(body)
        flipped[at] ^= 0x01
        with pytest.raises(EnvelopeError):
            open_manifest(manifest_wire.expand(damaged(bytes(flipped))), keys=KEYS, run_id="run", round_=3)


def test_a_real_coordinator_sends_the_compact_form_to_peers_that_ask_and_the_full_form_otherwise():
    from peer.node.coordinator_client import CoordinatorClient
    from protocol.accounting import ByteCounter
    from tests.coordinator_harness import serve_coordinator, tiny_config

    identity = Identity.generate()
    with serve_coordinator(tiny_config(), identity=identity) as served:
        run_id = served.coordinator.cfg.run_id
        full = sign_manifest(identity, dataclasses.replace(manifest(16), run_id=run_id, round=0))
        served.coordinator.manifests[0] = full
        asked = served.stub.GetManifest(swarm_pb2.ManifestRequest(round=0, wait_s=0.0, compact=True), timeout=10)
        plain = served.stub.GetManifest(swarm_pb2.ManifestRequest(round=0, wait_s=0.0), timeout=10)
        assert plain.ready and plain.manifest == full  # an older peer, a standby: the full form
        assert asked.ready and asked.manifest.body.startswith(manifest_wire.COMPRESSED)
        assert asked.ByteSize() < 0.6 * plain.ByteSize()
        counter = ByteCounter(identity.peer_id)
        client = CoordinatorClient(served.endpoint, counter)
        try:
            reply = client.manifest(0, 0.0)  # how every peer asks
        finally:
            client.close()
        assert reply.manifest == full
        assert open_manifest(reply.manifest, keys=CoordinatorKeys.of_key(identity.public_key), run_id=run_id, round_=0).round == 0
