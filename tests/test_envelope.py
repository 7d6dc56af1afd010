"""Update envelopes and manifests: every field that is signed is checked, and tampering is caught."""

import dataclasses

import pytest

from protocol.keys import CoordinatorKeys
from protocol.envelope import (
    EnvelopeError, ManifestEntry, RoundManifest, build_update_header, check_entry, check_payload, open_manifest, open_update,
    sha256_hex, sign_manifest, sign_update, signed_to_json,
)
from protocol.identity import Identity

PAYLOAD = b"\x01\x02" * 500
EXPECT = dict(run_id="run", round_=3, codec="fp16", numel=1000, layout_hash="L", max_payload_bytes=10_000)


def header_for(identity, **changes):
    base = build_update_header(run_id="run", round_=3, peer_id=identity.peer_id, codec="fp16", numel=1000, layout_hash="L",
                               base_param_hash="B", payload=PAYLOAD)
    return dataclasses.replace(base, **changes)


def test_valid_update_opens_and_payload_checks():
    me = Identity.generate()
    header = open_update(sign_update(me, header_for(me)), **EXPECT)
    assert header.peer_id == me.peer_id and header.payload_size == 1000
    check_payload(header, PAYLOAD)
    with pytest.raises(EnvelopeError) as err:
        check_payload(header, PAYLOAD[:-1])
    assert err.value.reason == "size-mismatch"
    with pytest.raises(EnvelopeError) as err:
        check_payload(header, b"\x00" + PAYLOAD[1:])
    assert err.value.reason == "hash-mismatch"


@pytest.mark.parametrize(
    "changes, reason",
    [
        (dict(round=2), "wrong-round"),  # replay of an old round
        (dict(run_id="other"), "wrong-run"),
        (dict(codec="int8"), "wrong-codec"),
        (dict(numel=999), "wrong-layout"),
        (dict(payload_size=10_001), "oversized"),
        (dict(payload_size=0), "oversized"),
        (dict(payload_sha256="xyz"), "malformed"),
    ],
)
def test_mismatched_headers_refused(changes, reason):
    me = Identity.generate()
    with pytest.raises(EnvelopeError) as err:
        open_update(sign_update(me, header_for(me, **changes)), **EXPECT)
    assert err.value.reason == reason


def test_update_in_someone_elses_name_is_refused():
    alice, mallory = Identity.generate(), Identity.generate()
    signed = sign_update(mallory, header_for(mallory))
    forged_body = signed.body.replace(mallory.peer_id.encode(), alice.peer_id.encode())
    forged = type(signed)(body=forged_body, signature=signed.signature, public_key=signed.public_key)
    with pytest.raises(EnvelopeError) as err:
        open_update(forged, **EXPECT)
    assert err.value.reason == "bad-signature"
    # Re-signed by mallory, the body now names alice but the key is mallory's.
    from protocol.signing import sign_body
    from protocol.envelope import UPDATE_TAG

    resigned = sign_body(mallory, UPDATE_TAG, dataclasses.asdict(header_for(mallory, peer_id=alice.peer_id)))
    with pytest.raises(EnvelopeError) as err:
        open_update(resigned, **EXPECT)
    assert err.value.reason == "forged"


def test_manifest_signed_by_coordinator_only():
    coordinator, peer, other = Identity.generate(), Identity.generate(), Identity.generate()
    entry = ManifestEntry(peer_id=peer.peer_id, payload_sha256=sha256_hex(PAYLOAD), payload_size=len(PAYLOAD),
                          header=signed_to_json(sign_update(peer, header_for(peer))), holders=["127.0.0.1:1"])
    manifest = RoundManifest(run_id="run", round=3, base_param_hash="B", entries=[entry], excluded={"x": "late"})
    opened = open_manifest(sign_manifest(coordinator, manifest), keys=CoordinatorKeys.of_key(coordinator.public_key), run_id="run", round_=3)
    assert opened.entries[0].peer_id == peer.peer_id and opened.excluded == {"x": "late"}
    with pytest.raises(EnvelopeError):
        open_manifest(sign_manifest(other, manifest), keys=CoordinatorKeys.of_key(coordinator.public_key), run_id="run", round_=3)
    with pytest.raises(EnvelopeError):
        open_manifest(sign_manifest(coordinator, manifest), keys=CoordinatorKeys.of_key(coordinator.public_key), run_id="run", round_=4)


def test_build_update_header_hashes_its_payload_and_check_entry_catches_a_swapped_entry():
    peer, other = Identity.generate(), Identity.generate()
    header = header_for(peer)
    assert (header.payload_sha256, header.payload_size, header.round, header.slices) == (sha256_hex(PAYLOAD), 1000, 3, ())
    entry = ManifestEntry(peer_id=peer.peer_id, payload_sha256=header.payload_sha256, payload_size=header.payload_size,
                          header=signed_to_json(sign_update(peer, header)), holders=[])
    check_entry(entry, header)
    for forged in (dataclasses.replace(entry, payload_sha256=sha256_hex(b"other")), dataclasses.replace(entry, peer_id=other.peer_id)):
        with pytest.raises(EnvelopeError) as err:
            check_entry(forged, header)
        assert err.value.reason == "forged"
