"""The signed slice-results batch (protocol/slice_result.py): one body per owner per round.

Round trip (sign -> open gives back every per-slice result, inputs derived from the manifest),
the compact form of its exclusions, and every way a batch can be malformed, each refused with
its own EnvelopeError reason.
"""

from __future__ import annotations

import json

import pytest

from protocol.envelope import EnvelopeError
from protocol.identity import Identity
from protocol.signing import canonical_body, sign_body
from protocol.slice_result import (
    SLICE_RESULTS_TAG, SliceResult, batch_body_limit, digest_b64, open_slice_results, sign_slice_results,
)
from protocol.wire import swarm_pb2

OWNER, OTHER = Identity.generate(), Identity.generate()
B, C = "b" * 32, "c" * 32
MANIFEST = "0" * 64
MAX_RESULT = 1000
RUN, ROUND = "run", 4


def D(c: str) -> str:
    """The wire form (base64 of the raw digest) of the sha256 written as 64 times `c` in hex."""
    return digest_b64(c * 64)


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


def body_of(results: list[SliceResult]) -> dict:
    signed = sign_slice_results(OWNER, results)
    return json.loads(signed.body.split(b"\n", 1)[1])


def test_a_batch_opens_into_the_per_slice_results_it_was_signed_from():
    results = honest()
    signed = sign_slice_results(OWNER, list(reversed(results)))  # any order in, slice order out
    assert open_(signed) == tuple(results)
    assert [r.inputs for r in open_(signed)] == [(OWNER.peer_id, C), (OWNER.peer_id,), (OWNER.peer_id, C)]
    body = body_of(results)
    assert body["results"] == [[0, D("0"), 100], [2, D("2"), 102], [3, D("3"), 103]]
    # keyed by peer: unreachable all round is one entry, a slice-local fault names its slice
    assert body["excluded"] == {B: {"unreachable": [0, 2, 3]}, C: {"non-finite": [2]}}
    assert b'"inputs"' not in signed.body
    # A clean batch: the round's fields once, ~60 bytes per slice, one signature.
    clean = sign_slice_results(OWNER, [result(j) for j in (0, 2, 3)])
    assert len(clean.body) < 180 + 60 * 3
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


def signed_body(fields: dict, identity: Identity = OWNER, tag: str = SLICE_RESULTS_TAG) -> swarm_pb2.Signed:
    return sign_body(identity, tag, fields)


def good_body() -> dict:
    return body_of(honest())


def with_(**fields) -> dict:
    return {**good_body(), **fields}


o = OWNER.peer_id
MALFORMED = {  # case -> (body, reason)
    "missing field": ({k: v for k, v in good_body().items() if k != "excluded"}, "malformed"),
    "extra field": (with_(inputs=[o]), "malformed"),
    "round not an integer": (with_(round=str(ROUND)), "malformed"),
    "round a boolean": (with_(round=True), "malformed"),
    "owner not a string": (with_(owner=7), "malformed"),
    "owner is not the signer": (with_(owner=B), "forged"),
    "another run": (with_(run_id="other"), "wrong-run"),
    "another round (replay)": (with_(round=ROUND - 1), "wrong-round"),
    "another manifest": (with_(manifest_sha256=D("1")), "wrong-round"),
    "manifest hash in hex (the old form)": (with_(manifest_sha256="1" * 64), "malformed"),
    "manifest hash not hex": (with_(manifest_sha256="M" * 64), "malformed"),
    "results not a list": (with_(results={"0": "x"}), "malformed"),
    "results empty": (with_(results=[]), "malformed"),
    "row too short": (with_(results=[[0, D("0")]]), "malformed"),
    "slice not an integer": (with_(results=[[0.0, D("0"), 100], [2, D("2"), 102], [3, D("3"), 103]]), "malformed"),
    "slice out of range": (with_(results=[[0, D("0"), 100], [2, D("2"), 102], [4, D("3"), 103]]), "malformed"),
    "negative slice": (with_(results=[[-1, D("0"), 100], [2, D("2"), 102], [3, D("3"), 103]]), "malformed"),
    "slice twice": (with_(results=[[0, D("0"), 100], [2, D("2"), 102], [2, D("2"), 102], [3, D("3"), 103]]), "malformed"),
    "slices out of order": (with_(results=[[2, D("2"), 102], [0, D("0"), 100], [3, D("3"), 103]]), "malformed"),
    "a slice the signer does not own": (with_(results=[[0, D("0"), 100], [1, D("1"), 101], [2, D("2"), 102],
                                                       [3, D("3"), 103]]), "not-owner"),
    "an owned slice left out": (with_(results=[[0, D("0"), 100], [2, D("2"), 102]],
                                      excluded={B: {"unreachable": [0, 2]}}), "malformed"),
    "result hash not hex": (with_(results=[[0, "not-hex", 100], [2, D("2"), 102], [3, D("3"), 103]]), "malformed"),
    "result hash upper case": (with_(results=[[0, "A" * 64, 100], [2, D("2"), 102], [3, D("3"), 103]]), "malformed"),
    "size zero": (with_(results=[[0, D("0"), 0], [2, D("2"), 102], [3, D("3"), 103]]), "oversized"),
    "size over the bound": (with_(results=[[0, D("0"), MAX_RESULT + 1], [2, D("2"), 102], [3, D("3"), 103]]), "oversized"),
    "size a string": (with_(results=[[0, D("0"), "100"], [2, D("2"), 102], [3, D("3"), 103]]), "malformed"),
    "excluded not a map": (with_(excluded=[B]), "malformed"),
    "excludes a peer the manifest does not list": (with_(excluded={"d" * 32: {"unreachable": [0]}}), "malformed"),
    "empty reasons of a peer": (with_(excluded={B: {}}), "malformed"),
    "reason too long": (with_(excluded={B: {"x" * 33: [0]}}), "malformed"),
    "reason empty": (with_(excluded={B: {"": [0]}}), "malformed"),
    "excluded slices not a list": (with_(excluded={B: {"unreachable": 0}}), "malformed"),
    "excluded slices empty": (with_(excluded={B: {"unreachable": []}}), "malformed"),
    "excluded slices unsorted": (with_(excluded={B: {"unreachable": [2, 0]}}), "malformed"),
    "excluded from a slice twice": (with_(excluded={B: {"unreachable": [0, 0]}}), "malformed"),
    "excluded from a slice not in the batch": (with_(excluded={B: {"unreachable": [1]}}), "malformed"),
    "two reasons for one slice": (with_(excluded={B: {"unreachable": [0], "non-finite": [0]}}), "malformed"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_batch_is_refused_with_its_reason(case):
    body, reason = MALFORMED[case]
    with pytest.raises(EnvelopeError) as err:
        open_(signed_body(body))
    assert err.value.reason == reason, err.value
    assert str(err.value)  # says what is wrong


def test_a_batch_with_a_broken_envelope_is_refused():
    signed = sign_slice_results(OWNER, honest())
    cases = {
        "bad-signature": swarm_pb2.Signed(body=signed.body, signature=bytes(64), public_key=signed.public_key),
        # another key over the same body: the signature does not verify under it
        "bad-signature ": swarm_pb2.Signed(body=signed.body, signature=signed.signature, public_key=OTHER.public_key),
        "wrong-tag": signed_body(good_body(), tag="swarmloco/slice-result/v1"),
        "malformed": (lambda b: swarm_pb2.Signed(body=b, signature=OWNER.sign(b), public_key=OWNER.public_key))(
            SLICE_RESULTS_TAG.encode() + b"\n[1, 2]"),
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
    peers = [OWNER.peer_id] + [f"{i:032x}" for i in range(50)]
    many = [[OWNER.peer_id]] * 40
    reasons = ["unreachable", "non-finite", "undecodable", "hash-mismatch"]
    worst = [SliceResult(run_id=RUN, round=ROUND, slice=j, owner=OWNER.peer_id, manifest_sha256=MANIFEST,
                         result_sha256="a" * 64, result_size=MAX_RESULT, inputs=(),
                         excluded={p: reasons[(j + k) % 4] for k, p in enumerate(peers)}) for j in range(40)]
    signed = sign_slice_results(OWNER, worst)
    assert len(signed.body) <= batch_body_limit(40, len(peers), RUN)
    assert len(open_(signed, owners=many, peer_ids=peers)) == 40
    # the same fields padded with whitespace (still valid JSON, still signed) are refused
    fields = json.loads(signed.body.split(b"\n", 1)[1])
    padded = canonical_body(SLICE_RESULTS_TAG, fields).replace(b",", b"," + b" " * 400)
    hostile = swarm_pb2.Signed(body=padded, signature=OWNER.sign(padded), public_key=OWNER.public_key)
    with pytest.raises(EnvelopeError) as err:
        open_(hostile, owners=many, peer_ids=peers)
    assert err.value.reason == "oversized" and "exceeds" in str(err.value)


def test_a_batch_in_the_old_hex_format_is_refused_with_what_to_do():
    old = sign_body(OWNER, "swarmloco/slice-results/v2", {**good_body(), "manifest_sha256": MANIFEST})
    with pytest.raises(EnvelopeError, match="old format 'swarmloco/slice-results/v2'.*upgrade swarmloco") as err:
        open_(old)
    assert err.value.reason == "wrong-tag"
