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
    from protocol.envelope import UPDATE_TAG, header_body

    resigned = sign_body(mallory, UPDATE_TAG, header_body(header_for(mallory, peer_id=alice.peer_id)))
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
    assert (header.payload_sha256, header.payload_size, header.round, header.slices_root, header.num_slices) == (
        sha256_hex(PAYLOAD), 1000, 3, "", 0)
    entry = ManifestEntry(peer_id=peer.peer_id, payload_sha256=header.payload_sha256, payload_size=header.payload_size,
                          header=signed_to_json(sign_update(peer, header)), holders=[])
    check_entry(entry, header)
    for forged in (dataclasses.replace(entry, payload_sha256=sha256_hex(b"other")), dataclasses.replace(entry, peer_id=other.peer_id)):
        with pytest.raises(EnvelopeError) as err:
            check_entry(forged, header)
        assert err.value.reason == "forged"


def test_packed_digests_round_trip_and_bad_ones_are_malformed():
    from protocol.envelope import pack_digests, unpack_digests

    hashes = [sha256_hex(bytes([i])) for i in range(28)]
    packed = pack_digests(hashes)
    assert unpack_digests(packed, field_name="x") == hashes
    assert len(packed) == 4 * -(-28 * 32 // 3)  # 1,196 characters, against 1,848 of hex inside a JSON list
    for bad in (packed[:-4], packed + "AAAA", "not base64!", ["a" * 64], 7, pack_digests(hashes * 200)):
        with pytest.raises(EnvelopeError) as err:
            unpack_digests(bad, field_name="x", limit=4096)
        assert err.value.reason == "malformed"


def sliced_header(identity, num_slices=28, **changes):
    digests = [sha256_hex(i.to_bytes(2, "big")) for i in range(num_slices)]
    base = build_update_header(run_id="run", round_=3, peer_id=identity.peer_id, codec="fp16", numel=1000, layout_hash="L",
                               base_param_hash="B", payload=PAYLOAD, slices=digests)
    return dataclasses.replace(base, **changes)


def test_sliced_header_commits_to_a_merkle_root_whatever_the_slice_count():
    import base64

    from protocol import merkle

    me = Identity.generate()
    header = sliced_header(me)
    digests = [bytes.fromhex(sha256_hex(i.to_bytes(2, "big"))) for i in range(28)]
    assert header.num_slices == 28 and base64.b64decode(header.slices_root) == merkle.root(digests)
    opened = open_update(sign_update(me, header), **EXPECT, num_slices=28)
    assert opened == header
    # the signed body is the same size for 28 and 4,096 slices: O(1) per header, not O(S)
    big = sign_update(me, sliced_header(me, num_slices=4096))
    assert len(big.body) - len(sign_update(me, header).body) == 2  # "28" -> "4096"
    for changes, reason in ((dict(num_slices=27), "wrong-layout"), (dict(slices_root=""), "malformed"),
                            (dict(slices_root="AAAA"), "malformed"), (dict(slices_root="not base64!"), "malformed")):
        with pytest.raises(EnvelopeError) as err:
            open_update(sign_update(me, dataclasses.replace(header, **changes)), **EXPECT, num_slices=28)
        assert err.value.reason == reason, changes
    with pytest.raises(EnvelopeError) as err:  # a root on a run that is not sliced
        open_update(sign_update(me, header), **EXPECT, num_slices=0)
    assert err.value.reason == "wrong-layout"


def test_a_sliced_headers_payload_sha256_is_the_commitment_to_its_root_and_size():
    """A sliced update commits through its Merkle root: payload_sha256 is sha256 over the root and
    the size (not a second hash of the whole payload), and a header whose payload_sha256 is anything
    else (the whole payload's sha256 as v4 signed, or another root's commitment: two roots under one
    commitment) is refused; its payload is never checked whole."""
    from protocol.envelope import sliced_payload_sha256

    me = Identity.generate()
    header = sliced_header(me)
    assert header.payload_sha256 == sliced_payload_sha256(header.root_bytes(), len(PAYLOAD)) != sha256_hex(PAYLOAD)
    other_root = sliced_header(me, num_slices=27)
    assert other_root.payload_sha256 != header.payload_sha256
    for sha in (sha256_hex(PAYLOAD), sliced_payload_sha256(header.root_bytes(), len(PAYLOAD) + 1), other_root.payload_sha256):
        with pytest.raises(EnvelopeError, match="commitment to its slices_root") as err:
            open_update(sign_update(me, dataclasses.replace(header, payload_sha256=sha)), **EXPECT, num_slices=28)
        assert err.value.reason == "malformed"
    with pytest.raises(EnvelopeError, match="slice by slice"):
        check_payload(header, PAYLOAD)


def test_a_v4_update_header_is_refused_with_what_to_do():
    from protocol.signing import sign_body

    me = Identity.generate()
    old = sign_body(me, "swarmloco/update-header/v4", dataclasses.asdict(sliced_header(me, payload_sha256=sha256_hex(PAYLOAD))))
    with pytest.raises(EnvelopeError, match="old format 'swarmloco/update-header/v4'.*upgrade swarmloco") as err:
        open_update(old, **EXPECT, num_slices=28)
    assert err.value.reason == "wrong-tag"


def test_old_update_header_format_is_refused_with_what_to_do():
    from protocol.envelope import pack_digests
    from protocol.signing import sign_body

    me = Identity.generate()
    fields = {k: v for k, v in dataclasses.asdict(header_for(me)).items() if k not in ("slices_root", "num_slices")}
    old = sign_body(me, "swarmloco/update-header/v2", {**fields, "slices": pack_digests([sha256_hex(b"x")] * 28)})
    with pytest.raises(EnvelopeError, match="old format 'swarmloco/update-header/v2'.*upgrade swarmloco") as err:
        open_update(old, **EXPECT, num_slices=28)
    assert err.value.reason == "wrong-tag"


def test_signed_messages_inside_json_keep_their_exact_bytes():
    from protocol._generated import swarm_pb2
    from protocol.envelope import signed_from_json

    peer = Identity.generate()
    header = sign_update(peer, header_for(peer))
    as_json = signed_to_json(header)
    assert "body_text" in as_json and signed_from_json(as_json) == header
    odd = swarm_pb2.Signed(body=b"\xff\xfe not utf-8", signature=b"s" * 64, public_key=b"k" * 32)
    assert "body" in signed_to_json(odd) and signed_from_json(signed_to_json(odd)) == odd


def test_manifest_owners_travel_as_entry_indices_and_must_name_an_entry():
    from protocol.envelope import MANIFEST_TAG
    from protocol.signing import sign_body

    coordinator, a, b = Identity.generate(), Identity.generate(), Identity.generate()
    entries = sorted((ManifestEntry(peer_id=p.peer_id, payload_sha256=sha256_hex(PAYLOAD), payload_size=len(PAYLOAD),
                                    header=signed_to_json(sign_update(p, header_for(p))), holders=[], serves=True)
                      for p in (a, b)), key=lambda e: e.peer_id)
    ids = [e.peer_id for e in entries]
    manifest = RoundManifest(run_id="run", round=3, base_param_hash="B", entries=entries, excluded={},
                             owners=[[ids[0], ids[1]], [ids[1], ids[0]], []])
    keys = CoordinatorKeys.of_key(coordinator.public_key)
    signed = sign_manifest(coordinator, manifest)
    assert b'"owners":[[0,1],[1,0],[]]' in signed.body
    assert open_manifest(signed, keys=keys, run_id="run", round_=3).owners == manifest.owners
    with pytest.raises(ValueError):
        sign_manifest(coordinator, dataclasses.replace(manifest, owners=[[Identity.generate().peer_id]]))
    fields = {**dataclasses.asdict(manifest)}
    for bad in ([[2]], [[-1]], [["0"]], [[True]], [0], "0,1"):
        forged = sign_body(coordinator, MANIFEST_TAG, {**fields, "owners": bad})
        with pytest.raises(EnvelopeError) as err:
            open_manifest(forged, keys=keys, run_id="run", round_=3)
        assert err.value.reason == "malformed", bad


def _entry(identity, signed, header):
    return ManifestEntry(peer_id=identity.peer_id, payload_sha256=header.payload_sha256, payload_size=header.payload_size,
                         header=signed_to_json(signed), holders=["127.0.0.1:1"], serves=True)


def test_manifest_carries_shared_header_fields_once_and_every_header_rebuilds_to_its_signed_bytes():
    import json

    from protocol.envelope import MANIFEST_TAG, UPDATE_TAG, signed_from_json
    from protocol.signing import sign_body

    coordinator = Identity.generate()
    keys = CoordinatorKeys.of_key(coordinator.public_key)
    peers = [Identity.generate() for _ in range(5)]
    signed_headers, entries = {}, []
    for k, p in enumerate(peers):
        header = sliced_header(p, payload_size=1000 - k) if k != 4 else sliced_header(p)
        # peer 3 signs a body that is not canonical (spaces): it must travel whole, untouched
        signed = sign_update(p, header)
        if k == 3:
            body = UPDATE_TAG.encode() + b"\n" + json.dumps(dataclasses.asdict(header), sort_keys=True).encode()
            signed = type(signed)(body=body, signature=p.sign(body), public_key=p.public_key)
        # peer 1 has another slice count: not shared, travels in its own fields
        if k == 1:
            header = sliced_header(p, num_slices=27)
            signed = sign_update(p, header)
        signed_headers[p.peer_id] = signed
        entries.append(_entry(p, signed, header))
    entries.sort(key=lambda e: e.peer_id)
    manifest = RoundManifest(run_id="run", round=3, base_param_hash="B", entries=entries, excluded={})
    signed_manifest = sign_manifest(coordinator, manifest)
    body = json.loads(signed_manifest.body.split(b"\n", 1)[1])
    assert set(body["header_common"]) == {"run_id", "round", "codec", "numel", "layout_hash", "base_param_hash", "inner_steps",
                                          "tokens"}
    assert signed_manifest.body.count(b'layout_hash') == 1 + 1  # once shared, once in peer 3's whole header
    opened = open_manifest(signed_manifest, keys=keys, run_id="run", round_=3)
    for entry in opened.entries:
        assert signed_from_json(entry.header) == signed_headers[entry.peer_id]  # the author's exact bytes
    # each compact header is shorter than its whole form by at least the shared fields and the
    # three its entry repeats (peer 3's travels whole)
    shared = len(json.dumps(body["header_common"], separators=(",", ":")))
    by_peer = {e["peer_id"]: e["header"] for e in body["entries"]}
    assert sum("fields" in h for h in by_peer.values()) == 4 and "body_text" in by_peer[peers[3].peer_id]
    for entry in entries:
        compact = by_peer[entry.peer_id]
        if "fields" in compact:
            assert len(json.dumps(compact)) < len(json.dumps(entry.header)) - shared - 32 - 64

    # a coordinator that changes a compact header's field gets a header its author did not sign
    tampered = json.loads(signed_manifest.body.split(b"\n", 1)[1])
    compact = next(e for e in tampered["entries"] if "fields" in e["header"])
    compact["header"]["fields"]["slices_root"] = base64_root(b"\x07" * 32)
    reopened = open_manifest(sign_body(coordinator, MANIFEST_TAG, tampered), keys=keys, run_id="run", round_=3)
    entry = next(e for e in reopened.entries if e.peer_id == compact["peer_id"])
    with pytest.raises(EnvelopeError) as err:
        open_update(signed_from_json(entry.header), **EXPECT, num_slices=28)
    assert err.value.reason == "bad-signature"
    for bad in ({**tampered, "header_common": []}, {**tampered, "entries": [{**compact, "header": {"fields": 3}}]}):
        with pytest.raises(EnvelopeError) as err:
            open_manifest(sign_body(coordinator, MANIFEST_TAG, bad), keys=keys, run_id="run", round_=3)
        assert err.value.reason == "malformed"


def test_shared_fields_compare_as_json_so_true_is_not_one():
    """A header signing numel=true must not make an honest numel=1 header rebuild as true."""
    from protocol.envelope import UPDATE_TAG, signed_from_json
    from protocol.signing import sign_body

    coordinator, a, b = Identity.generate(), Identity.generate(), Identity.generate()
    entries = []
    for p, numel in ((a, 1), (b, True)):
        header = sliced_header(p)
        signed = sign_body(p, UPDATE_TAG, {**dataclasses.asdict(header), "numel": numel})
        entries.append(_entry(p, signed, header))
    entries.sort(key=lambda e: e.peer_id)
    manifest = RoundManifest(run_id="run", round=3, base_param_hash="B", entries=entries, excluded={})
    opened = open_manifest(sign_manifest(coordinator, manifest), keys=CoordinatorKeys.of_key(coordinator.public_key),
                           run_id="run", round_=3)
    for before, after in zip(entries, opened.entries):
        assert signed_from_json(after.header) == signed_from_json(before.header)


def base64_root(raw: bytes) -> str:
    import base64

    return base64.b64encode(raw).decode()


def test_a_manifest_window_is_signed_when_set_and_absent_otherwise():
    """RoundManifest.window_ms (overlapped rounds on the swarm's clock): signed and read back when
    set; a manifest without one has the body it always had; anything but a whole number of ms from
    0 to a day is malformed."""
    from protocol.envelope import MANIFEST_TAG, MAX_WINDOW_MS
    from protocol.signing import open_signed, sign_body

    coordinator = Identity.generate()
    keys = CoordinatorKeys.of_key(coordinator.public_key)
    plain = RoundManifest(run_id="run", round=3, base_param_hash="B", entries=[], excluded={})
    fields, _ = open_signed(sign_manifest(coordinator, plain), MANIFEST_TAG)
    assert "window_ms" not in fields
    signed = sign_manifest(coordinator, dataclasses.replace(plain, window_ms=2750))
    assert open_manifest(signed, keys=keys, run_id="run", round_=3).window_ms == 2750
    fields, _ = open_signed(signed, MANIFEST_TAG)
    for bad in (-1, 2.5, "2750", True, MAX_WINDOW_MS + 1):
        with pytest.raises(EnvelopeError) as refused:
            open_manifest(sign_body(coordinator, MANIFEST_TAG, {**fields, "window_ms": bad}), keys=keys, run_id="run", round_=3)
        assert refused.value.reason == "malformed"
