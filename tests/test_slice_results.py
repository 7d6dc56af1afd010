"""The signed slice-results batch (protocol/slice_result.py): one binary body per owner per round,
and its packed form on the wire (protocol/slice_result_wire.py).

Round trip (sign -> open gives back every per-slice result, inputs derived from the manifest),
the compact form of its exclusions, packing (a list of batches rebuilt byte for byte, the agreeing
owner's rows copied), and every way a batch can be malformed, each refused with its own
EnvelopeError reason.
"""

from __future__ import annotations

import pytest

from protocol.binary_fields import put_bytes, put_varint
from protocol.envelope import EnvelopeError
from protocol.identity import Identity
from protocol.signing import sign_body
from protocol.slice_result import (
    SLICE_RESULTS_TAG, TAG_PREFIX, SliceResult, batch_body_limit, open_slice_results, sign_slice_results,
)
from protocol.slice_result_wire import BatchUnpacker, pack_batches
from protocol.wire import swarm_pb2

OWNER, OTHER = Identity.generate(), Identity.generate()
B, C = "b" * 32, "c" * 32
MANIFEST = "0" * 64
MAX_RESULT = 1000
RUN, ROUND = "run", 4


def owners() -> list[list[str]]:
    """4 slices; OWNER owns 0, 2 and 3."""
    o = OWNER.peer_id
    return [[o, B], [B, C], [o, C], [C, o]]


def peer_ids() -> tuple[str, ...]:
    return (OWNER.peer_id, B, C)  # the manifest's entries, in its order


def result(j: int, excluded: dict[str, str] | None = None, **fields) -> SliceResult:
    excluded = excluded or {}
    base = dict(run_id=RUN, round=ROUND, slice=j, owner=OWNER.peer_id, manifest_sha256=MANIFEST,
                result_sha256=f"{j:x}" * 64, result_size=100 + j, inputs=tuple(p for p in peer_ids() if p not in excluded),
                excluded=excluded)
    return SliceResult(**{**base, **fields})


def honest() -> list[SliceResult]:
    return [result(0, {B: "unreachable"}), result(2, {B: "unreachable", C: "non-finite"}), result(3, {B: "unreachable"})]


def open_(signed: swarm_pb2.Signed, **overrides) -> tuple[SliceResult, ...]:
    args = dict(run_id=RUN, round_=ROUND, manifest_sha256=MANIFEST, owners=owners(), max_result_bytes=MAX_RESULT,
                peer_ids=peer_ids())
    return open_slice_results(signed, **{**args, **overrides})


def build(*, run: str = RUN, round_: int = ROUND, manifest: str = MANIFEST, rows=None, count=None,
          excluded=None, tail: bytes = b"", prefix: bytes = TAG_PREFIX) -> bytes:
    """A batch body written field by field, any field replaceable (the honest one by default).
    rows: [(size, sha hex)]; excluded: [(peer_id, [(reason bytes, [slice, ...])])], in the order given."""
    rows = [(100 + j, f"{j:x}" * 64) for j in (0, 2, 3)] if rows is None else rows
    excluded = [(B, [(b"unreachable", [0, 2, 3])]), (C, [(b"non-finite", [2])])] if excluded is None else excluded
    out = bytearray(prefix)
    put_bytes(out, run.encode())
    put_varint(out, round_)
    out += bytes.fromhex(manifest)
    put_varint(out, len(rows) if count is None else count)
    for size, sha in rows:
        put_varint(out, size)
        out += bytes.fromhex(sha)
    put_varint(out, len(excluded))
    for peer_id, reasons in excluded:
        out += bytes.fromhex(peer_id)
        put_varint(out, len(reasons))
        for reason, where in reasons:
            put_bytes(out, reason)
            put_varint(out, len(where))
            for j in where:
                put_varint(out, j)
    return bytes(out + tail)


def signed_raw(body: bytes, identity: Identity = OWNER) -> swarm_pb2.Signed:
    return swarm_pb2.Signed(body=body, signature=identity.sign(body), public_key=identity.public_key)


def test_a_batch_opens_into_the_per_slice_results_it_was_signed_from():
    results = honest()
    signed = sign_slice_results(OWNER, list(reversed(results)))  # any order in, slice order out
    assert open_(signed) == tuple(results)
    assert [r.inputs for r in open_(signed)] == [(OWNER.peer_id, C), (OWNER.peer_id,), (OWNER.peer_id, C)]
    # keyed by peer: unreachable all round is one entry, a slice-local fault names its slice
    assert signed.body == build()
    # A clean batch: the round's fields once, a varint size and 32 raw bytes a slice, one signature.
    clean = sign_slice_results(OWNER, [result(j) for j in (0, 2, 3)])
    assert len(clean.body) == len(TAG_PREFIX) + 1 + len(RUN) + 1 + 32 + 1 + 3 * (1 + 32) + 1
    assert open_(clean) == tuple(result(j) for j in (0, 2, 3))


def test_the_signer_refuses_to_sign_what_is_not_one_owners_batch():
    with pytest.raises(ValueError, match="signer"):
        sign_slice_results(OTHER, honest())
    with pytest.raises(ValueError, match="at least one"):
        sign_slice_results(OWNER, [])
    with pytest.raises(ValueError, match="one owner"):
        sign_slice_results(OWNER, [result(0), result(2, round=ROUND + 1)])
    with pytest.raises(ValueError, match="once"):
        sign_slice_results(OWNER, [result(0), result(0)])
    with pytest.raises(ValueError, match="peer_id"):
        sign_slice_results(OWNER, [result(0, {"peer-b": "unreachable"})])


def round_of_three() -> tuple[list[Identity], list[list[str]], list[str], list[swarm_pb2.Signed]]:
    """Three owners of 4 slices (r = 2), each signing the agreed result of its slices; slice 3's
    second owner disagrees."""
    ids = sorted([Identity.generate() for _ in range(3)], key=lambda i: i.peer_id)
    p = [i.peer_id for i in ids]
    own = [[p[0], p[1]], [p[1], p[2]], [p[2], p[0]], [p[0], p[1]]]
    batches = []
    for k, identity in enumerate(ids):
        mine = [j for j, o in enumerate(own) if identity.peer_id in o]
        batches.append(sign_slice_results(identity, [
            SliceResult(run_id=RUN, round=ROUND, slice=j, owner=identity.peer_id, manifest_sha256=MANIFEST,
                        result_sha256=(("e" if (j, k) == (3, 1) else f"{j:x}") * 64), result_size=200 + j, inputs=tuple(p),
                        excluded={p[2]: "unreachable"} if j == 0 else {}) for j in mine]))
    return ids, own, p, batches


def test_packed_batches_travel_without_what_the_receiver_holds_and_rebuild_byte_for_byte():
    ids, own, p, batches = round_of_three()
    packed = pack_batches(batches, peer_ids=p, owners=own)
    unpacker = BatchUnpacker(run_id=RUN, round_=ROUND, manifest_sha256=MANIFEST, peer_ids=p, owners=own,
                             public_keys={i.peer_id: i.public_key for i in ids})
    rebuilt = [unpacker.full(s) for s in packed]
    assert [(s.body, s.signature, s.public_key) for s in rebuilt] == [(s.body, s.signature, s.public_key) for s in batches]
    for s in rebuilt:  # and they open: the signature is over the full body
        open_slice_results(s, run_id=RUN, round_=ROUND, manifest_sha256=MANIFEST, owners=own, max_result_bytes=MAX_RESULT,
                           peer_ids=p)
    assert all(not s.public_key for s in packed)
    # The context (tag, run, round, manifest) and the key are gone; a row the slice's other owner
    # already gave costs one byte instead of 2 + 32: p1's slice 0 and p2's slices 1 and 2 (agreed)
    # are copies, p1's slice 3 (disputed) is not.
    saved = [len(f.body) + len(f.public_key) - len(s.body) for f, s in zip(batches, packed)]
    context = len(TAG_PREFIX) + 1 + len(RUN) + 1 + 32
    assert saved == [context + 32 - 2, context + 32 - 2 + 33, context + 32 - 2 + 2 * 33]
    # A full batch passes through unchanged.
    assert unpacker.full(batches[0]) is batches[0]


def test_a_packer_that_copies_a_row_the_owner_did_not_sign_gets_its_batch_dropped():
    ids, own, p, batches = round_of_three()
    # slice 3's second owner (p[1]) signed another hash; a packer copying p[0]'s row for it forges
    packed = pack_batches(batches, peer_ids=p, owners=own)
    honest_second = packed[1].body
    forged = bytearray(honest_second)
    k = forged.index(bytes.fromhex("e" * 64))  # p[1]'s row of slice 3
    forged[k - 2 : k + 32] = b"\x00"  # its size (203: a 2-byte varint) and sha256 -> "as the last row"
    unpacker = BatchUnpacker(run_id=RUN, round_=ROUND, manifest_sha256=MANIFEST, peer_ids=p, owners=own,
                             public_keys={i.peer_id: i.public_key for i in ids})
    unpacker.full(packed[0])
    with pytest.raises(EnvelopeError) as err:
        open_slice_results(unpacker.full(swarm_pb2.Signed(body=bytes(forged), signature=packed[1].signature)), run_id=RUN,
                           round_=ROUND, manifest_sha256=MANIFEST, owners=own, max_result_bytes=MAX_RESULT, peer_ids=p)
    assert err.value.reason == "bad-signature"
    # a copy of a slice no earlier batch gave, an owner index past the entries, a wrong row count
    fresh = BatchUnpacker(run_id=RUN, round_=ROUND, manifest_sha256=MANIFEST, peer_ids=p, owners=own,
                          public_keys={i.peer_id: i.public_key for i in ids})
    for body in (bytes(forged), b"\x01\x07\x03", b"\x01\x00\x05", b"\x01\x00"):
        with pytest.raises(EnvelopeError) as err:
            fresh.full(swarm_pb2.Signed(body=body, signature=bytes(64)))
        assert err.value.reason == "malformed", body


o = OWNER.peer_id
D0, D2, D3 = "0" * 64, "2" * 64, "3" * 64
MALFORMED = {  # case -> (body, reason)
    "truncated": (build()[:-3], "malformed"),
    "a byte after the last field": (build(tail=b"\x00"), "malformed"),
    "a varint with a redundant byte": (build().replace(TAG_PREFIX + b"\x03", TAG_PREFIX + b"\x83\x00"), "malformed"),
    "another run": (build(run="other"), "wrong-run"),
    "another round (replay)": (build(round_=ROUND - 1), "wrong-round"),
    "another manifest": (build(manifest="1" * 64), "wrong-round"),
    "results empty": (build(rows=[]), "malformed"),
    "a row more than the owner's slices": (build(rows=[(100, D0), (101, D0), (102, D2), (103, D3)]), "malformed"),
    "an owned slice left out": (build(rows=[(100, D0), (102, D2)], excluded=[]), "malformed"),
    "count says more rows than follow": (build(count=4), "malformed"),
    "size zero": (build(rows=[(0, D0), (102, D2), (103, D3)]), "oversized"),
    "size over the bound": (build(rows=[(MAX_RESULT + 1, D0), (102, D2), (103, D3)]), "oversized"),
    "excludes a peer the manifest does not list": (build(excluded=[("d" * 32, [(b"unreachable", [0])])]), "malformed"),
    "excluded peers out of order": (build(excluded=[(C, [(b"non-finite", [2])]), (B, [(b"unreachable", [0])])]), "malformed"),
    "a peer excluded twice": (build(excluded=[(B, [(b"unreachable", [0])]), (B, [(b"non-finite", [2])])]), "malformed"),
    "no reasons for a peer": (build(excluded=[(B, [])]), "malformed"),
    "reason too long": (build(excluded=[(B, [(b"x" * 33, [0])])]), "malformed"),
    "reason empty": (build(excluded=[(B, [(b"", [0])])]), "malformed"),
    "reason not UTF-8": (build(excluded=[(B, [(b"\xff\xfe", [0])])]), "malformed"),
    "reasons out of order": (build(excluded=[(B, [(b"unreachable", [0]), (b"non-finite", [2])])]), "malformed"),
    "excluded slices empty": (build(excluded=[(B, [(b"unreachable", [])])]), "malformed"),
    "excluded slices unsorted": (build(excluded=[(B, [(b"unreachable", [2, 0])])]), "malformed"),
    "excluded from a slice twice": (build(excluded=[(B, [(b"unreachable", [0, 0])])]), "malformed"),
    "excluded from a slice not in the batch": (build(excluded=[(B, [(b"unreachable", [1])])]), "malformed"),
    "two reasons for one slice": (build(excluded=[(B, [(b"non-finite", [0]), (b"unreachable", [0])])]), "malformed"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_batch_is_refused_with_its_reason(case):
    body, reason = MALFORMED[case]
    with pytest.raises(EnvelopeError) as err:
        open_(signed_raw(body))
    assert err.value.reason == reason, err.value
    assert str(err.value)  # says what is wrong


def test_the_honest_builder_is_the_signed_body():
    assert open_(signed_raw(build())) == tuple(honest())


def test_a_batch_with_a_broken_envelope_is_refused():
    signed = sign_slice_results(OWNER, honest())
    cases = {
        "bad-signature": swarm_pb2.Signed(body=signed.body, signature=bytes(64), public_key=signed.public_key),
        # another key over the same body: the signature does not verify under it
        "bad-signature ": swarm_pb2.Signed(body=signed.body, signature=signed.signature, public_key=OTHER.public_key),
        "wrong-tag": signed_raw(build(prefix=b"swarmloco/slice-result/v1\n")),
    }
    for reason, hostile in cases.items():
        with pytest.raises(EnvelopeError) as err:
            open_(hostile)
        assert err.value.reason == reason.strip(), reason
    # another owner's well-formed batch, signed by it, does not hold for slices it does not own
    stranger = sign_slice_results(OTHER, [result(0, owner=OTHER.peer_id)])
    with pytest.raises(EnvelopeError) as err:
        open_(stranger)
    assert err.value.reason == "not-owner"


def test_the_body_is_bounded_by_what_an_honest_owner_can_sign():
    # The honest worst case: every listed peer left out of every slice, each time for another reason.
    peers = sorted([OWNER.peer_id] + [f"{i:032x}" for i in range(50)])
    many = [[OWNER.peer_id]] * 40
    reasons = ["unreachable", "non-finite", "undecodable", "hash-mismatch"]
    worst = [SliceResult(run_id=RUN, round=ROUND, slice=j, owner=OWNER.peer_id, manifest_sha256=MANIFEST,
                         result_sha256="a" * 64, result_size=MAX_RESULT, inputs=(),
                         excluded={p: reasons[(j + k) % 4] for k, p in enumerate(peers)}) for j in range(40)]
    signed = sign_slice_results(OWNER, worst)
    assert len(signed.body) <= batch_body_limit(40, len(peers), RUN)
    assert len(open_(signed, owners=many, peer_ids=peers)) == 40
    # the same fields followed by padding past the bound (still signed) are refused as oversized
    padded = signed.body + bytes(batch_body_limit(40, len(peers), RUN))
    with pytest.raises(EnvelopeError) as err:
        open_(signed_raw(padded), owners=many, peer_ids=peers)
    assert err.value.reason == "oversized" and "exceeds" in str(err.value)


@pytest.mark.parametrize("old", ["swarmloco/slice-results/v2", "swarmloco/slice-results/v3"])
def test_a_batch_in_an_old_format_is_refused_with_what_to_do(old):
    stale = sign_body(OWNER, old, {"run_id": RUN, "round": ROUND})
    with pytest.raises(EnvelopeError, match=f"old format '{old}'.*upgrade swarmloco") as err:
        open_(stale)
    assert err.value.reason == "wrong-tag"
    assert SLICE_RESULTS_TAG.endswith("v4")
