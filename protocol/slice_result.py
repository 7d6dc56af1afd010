"""Signed slice results: what an owner says it computed in round r, one signed batch per owner.

An owner fetches slice j of every update the manifest lists, verifies each against the author's
signed header, runs the robust rule on that slice alone, and, once every slice it owns is done,
signs ONE body for all of them, in fixed-width binary (protocol/binary_fields.py), since every
peer reads every owner's batch every round:

    TAG "\\n"  run_id (length-prefixed)  round (varint)  manifest sha256 (32 raw bytes)
    rows:      count (varint), then per owned slice, by slice: result_size (varint), result sha256 (32 raw)
    excluded:  count (varint), then per peer left out somewhere, by peer_id: peer_id (16 raw bytes),
               count of reasons (varint), per reason, by reason: reason (length-prefixed),
               count of slices (varint), the slices (varints, strictly increasing)

The owner is the signing key (its peer_id is sha256 of the key); the rows name no slice: they
are the slices the manifest (bound by its sha256) gives the signer, in order. `excluded` names the
listed peers left out of a slice, with why (unreachable, non-finite, undecodable, hash-mismatch);
keyed by peer, an update unreachable for the whole round costs one entry. A slice's `inputs` are
the manifest's other entries, in its order: n peer ids per slice would grow a round's control
traffic as n². The encoding is strict (one byte string per batch): a clean batch is ~35 bytes a
slice plus ~80 bytes, against ~60 a slice plus ~250 as the JSON of v3.

On the wire a batch usually travels packed (protocol/slice_result_wire.py: without the fields its
receiver knows, and without a digest its receiver already got from the slice's other owner); a
receiver rebuilds this full body before checking the signature, and keeps the full one as
evidence. Anyone holding the same signed inputs can recompute slice j bit for bit and check
`result_sha256`: two owners that signed different hashes over the same inputs prove one of them
wrong, and a recomputation says which. Two different batches from one owner for one round are
equivocation.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass, field

from protocol._generated import swarm_pb2
from protocol.binary_fields import BinaryFieldError, Reader, put_bytes, put_varint
from protocol.envelope import EnvelopeError, open_envelope
from protocol.identity import Identity, IdentityError, peer_id_of, verify_signature
from protocol.reasons import Reason
from protocol.signing import MAX_BODY_BYTES, sign_body

SLICE_RESULTS_TAG = "swarmloco/slice-results/v4"  # v4: binary (v3: JSON with base64 digests; v2: hex)
OLD_SLICE_RESULTS_TAGS = ("swarmloco/slice-results/v3", "swarmloco/slice-results/v2")
TAG_PREFIX = SLICE_RESULTS_TAG.encode() + b"\n"
MISMATCH_TAG = "swarmloco/slice-mismatch/v1"
HEX = frozenset("0123456789abcdef")
PEER_ID_BYTES = 16  # a peer_id is 32 hex characters
MAX_REASON_CHARS = 32  # the longest protocol.reasons.Reason is 17
# Body bound, by what an honest batch can hold: a result row is a varint size and 32 bytes; a
# peer left out of a slice under a reason of its own costs at most 1 + 32 + 2 + 3 bytes, plus its
# id and a count once. Anything larger is refused before it is parsed.
BODY_OVERHEAD_BYTES = 64
RESULT_ROW_BYTES = 42
EXCLUSION_BYTES = 40
PEER_KEY_BYTES = 20


@dataclass(frozen=True, slots=True)
class SliceResult:
    """One slice of an owner's signed batch: the view the exchange compares, recomputes and bans on."""

    run_id: str
    round: int
    slice: int
    owner: str  # peer_id of the signer
    manifest_sha256: str  # binds the result to one signed manifest
    result_sha256: str
    result_size: int
    inputs: tuple[str, ...]
    excluded: dict[str, str] = field(default_factory=dict)


def batch_context(run_id: str, round_: int, manifest_sha256: str) -> bytes:
    """The full body's first bytes: its tag and the fields every batch of one round shares."""
    out = bytearray(TAG_PREFIX)
    put_bytes(out, run_id.encode())
    put_varint(out, round_)
    out += _raw_digest(manifest_sha256)
    return bytes(out)


def sign_slice_results(identity: Identity, results: Sequence[SliceResult]) -> swarm_pb2.Signed:
    """An owner's results for one round (every slice it owns), as one signed batch."""
    if not results:
        raise ValueError("a slice-results batch holds at least one slice")
    first = results[0]
    if any((r.run_id, r.round, r.owner, r.manifest_sha256) != (first.run_id, first.round, first.owner, first.manifest_sha256)
           for r in results):
        raise ValueError("a slice-results batch is one owner's results for one manifest")
    if first.owner != identity.peer_id:
        raise ValueError("a slice result must name its signer as owner")
    ordered = sorted(results, key=lambda r: r.slice)
    if len({r.slice for r in ordered}) != len(ordered):
        raise ValueError("a slice-results batch names each slice once")
    body = bytearray(batch_context(first.run_id, first.round, first.manifest_sha256))
    put_varint(body, len(ordered))
    for res in ordered:
        put_varint(body, res.result_size)
        body += _raw_digest(res.result_sha256)
    excluded: dict[str, dict[str, list[int]]] = {}
    for res in ordered:
        for peer_id, reason in res.excluded.items():
            excluded.setdefault(peer_id, {}).setdefault(str(reason), []).append(res.slice)
    put_varint(body, len(excluded))
    for peer_id in sorted(excluded):
        if not _is_hex(peer_id, 32):
            raise ValueError(f"not a peer_id (32 lowercase hex characters): {peer_id!r}")
        body += bytes.fromhex(peer_id)
        put_varint(body, len(excluded[peer_id]))
        for reason in sorted(excluded[peer_id]):
            if not 0 < len(reason.encode()) <= MAX_REASON_CHARS:
                raise ValueError(f"an exclusion reason has 1..{MAX_REASON_CHARS} bytes, got {reason!r}")
            put_bytes(body, reason.encode())
            put_varint(body, len(excluded[peer_id][reason]))
            for j in excluded[peer_id][reason]:
                put_varint(body, j)
    body = bytes(body)
    return swarm_pb2.Signed(body=body, signature=identity.sign(body), public_key=identity.public_key)


def batch_body_limit(owned: int, peers: int, run_id: str) -> int:
    """The largest body an honest owner of `owned` slices signs for a manifest of `peers` entries
    (every peer left out of every slice, each time for another reason; a clean round's batch is
    ~80 bytes plus ~35 per slice)."""
    return BODY_OVERHEAD_BYTES + len(run_id.encode()) + owned * RESULT_ROW_BYTES + peers * (PEER_KEY_BYTES + owned * EXCLUSION_BYTES)


def digest_b64(hex_digest: str) -> str:
    """A sha256 as base64 of its 32 raw bytes (ValueError if not 64 hex)."""
    return base64.b64encode(_raw_digest(hex_digest)).decode()


def _raw_digest(hex_digest: str) -> bytes:
    if not _is_hex(hex_digest, 64):
        raise ValueError(f"not a sha256 in lowercase hex: {hex_digest!r}")
    return bytes.fromhex(hex_digest)


def _is_hex(value: object, length: int) -> bool:
    return isinstance(value, str) and len(value) == length and set(value) <= HEX


def _malformed(message: str) -> EnvelopeError:
    return EnvelopeError(Reason.MALFORMED, f"slice results refused: {message}")


def refuse_old_format(signed: swarm_pb2.Signed) -> None:
    for old in OLD_SLICE_RESULTS_TAGS:
        if signed.body.startswith(old.encode() + b"\n"):
            raise EnvelopeError(Reason.WRONG_TAG, f"slice results in the old format {old!r}; this swarm signs "
                                                  f"{SLICE_RESULTS_TAG!r}: upgrade swarmloco on that owner")


def owned_slices(owners: Sequence[Sequence[str]], owner: str) -> list[int]:
    return [j for j, slice_owners in enumerate(owners) if owner in slice_owners]


def open_slice_results(
    signed: swarm_pb2.Signed, *, run_id: str, round_: int, manifest_sha256: str, owners: Sequence[Sequence[str]],
    max_result_bytes: int, peer_ids: Sequence[str],
) -> tuple[SliceResult, ...]:
    """Verify an owner's signed batch (its full form) against the round's manifest (its sha256,
    `owners`: slice -> owner peer_ids, `peer_ids`: its entries in order) and open it into per-slice
    results, by slice; raise EnvelopeError (its reason counted) when anything does not hold."""
    refuse_old_format(signed)
    body = signed.body
    if len(body) > MAX_BODY_BYTES:
        raise EnvelopeError(Reason.OVERSIZED, f"slice results refused: body of {len(body)} bytes exceeds {MAX_BODY_BYTES}")
    if not verify_signature(signed.public_key, signed.signature, body):
        raise EnvelopeError(Reason.BAD_SIGNATURE, "slice results refused: Ed25519 signature does not verify over the body")
    if not body.startswith(TAG_PREFIX):
        raise EnvelopeError(Reason.WRONG_TAG, f"slice results refused: the body is not a {SLICE_RESULTS_TAG!r}")
    try:
        signer = peer_id_of(signed.public_key)
    except IdentityError as exc:
        raise EnvelopeError(Reason.BAD_KEY, f"slice results refused: {exc}") from None
    reader = Reader(body, len(TAG_PREFIX))
    try:
        signed_run = reader.sized("run_id", limit=len(body))
        signed_round = reader.varint("round")
        signed_manifest = reader.raw(32, "manifest_sha256").hex()
    except BinaryFieldError as exc:
        raise _malformed(str(exc)) from None
    if signed_run != run_id.encode():
        raise EnvelopeError(Reason.WRONG_RUN, f"slice results are for run {signed_run[:64]!r}, this run is {run_id!r}")
    if signed_round != round_:
        raise EnvelopeError(Reason.WRONG_ROUND, f"slice results are for round {signed_round}, expected round {round_}")
    if signed_manifest != manifest_sha256:
        raise EnvelopeError(Reason.WRONG_ROUND, f"slice results are signed over another manifest of round {round_}")
    owned = owned_slices(owners, signer)
    if not owned:
        raise EnvelopeError(Reason.NOT_OWNER, f"{signer[:8]} owns no slice of this manifest")
    limit = batch_body_limit(len(owned), len(peer_ids), run_id)
    if len(body) > limit:
        raise EnvelopeError(Reason.OVERSIZED, f"slice results body of {len(body)} bytes exceeds {limit} "
                                              f"for {len(owned)} owned slices and {len(peer_ids)} peers")
    try:
        rows = _result_rows(reader, owned, signer, max_result_bytes=max_result_bytes)
        by_slice = _exclusions(reader, owned=owned, peer_ids=peer_ids)
        reader.done("slice results")
    except BinaryFieldError as exc:
        raise _malformed(str(exc)) from None
    return tuple(
        SliceResult(run_id=run_id, round=round_, slice=j, owner=signer, manifest_sha256=manifest_sha256,
                    result_sha256=sha, result_size=size, inputs=tuple(p for p in peer_ids if p not in by_slice.get(j, {})),
                    excluded=by_slice.get(j, {}))
        for j, (sha, size) in zip(owned, rows)
    )


def _result_rows(reader: Reader, owned: list[int], signer: str, *, max_result_bytes: int) -> list[tuple[str, int]]:
    """One (sha, size) per owned slice, in slice order."""
    count = reader.varint("results count")
    if count != len(owned):
        raise _malformed(f"the batch covers {count} slices; the manifest gives {signer[:8]} {len(owned)}")
    rows = []
    for j in owned:
        size = reader.varint(f"result_size of slice {j}")
        if not 0 < size <= max_result_bytes:
            raise EnvelopeError(Reason.OVERSIZED, f"declared result size {size} of slice {j} is outside (0, {max_result_bytes}]")
        rows.append((reader.raw(32, f"result_sha256 of slice {j}").hex(), size))
    return rows


def _exclusions(reader: Reader, *, owned: list[int], peer_ids: Sequence[str]) -> dict[int, dict[str, str]]:
    """The batch's exclusions -> slice -> {peer_id: reason}, checked against the manifest and the batch."""
    listed, in_batch = set(peer_ids), set(owned)
    by_slice: dict[int, dict[str, str]] = {}
    last_peer = ""
    for _ in range(reader.varint("excluded count", limit=len(peer_ids))):
        peer_id = reader.raw(PEER_ID_BYTES, "excluded peer_id").hex()
        if peer_id not in listed:
            raise _malformed(f"slice results exclude {peer_id[:8]}, whom the manifest does not list")
        if peer_id <= last_peer:
            raise _malformed("excluded peers must be strictly increasing by peer_id")
        last_peer, last_reason = peer_id, b""
        reasons = reader.varint(f"reasons of {peer_id[:8]}", limit=len(owned))
        if not reasons:
            raise _malformed(f"the exclusions of {peer_id[:8]} name no reason")
        for _ in range(reasons):
            raw_reason = reader.sized("reason", limit=MAX_REASON_CHARS)
            if not raw_reason or raw_reason <= last_reason:
                raise _malformed(f"the reasons {peer_id[:8]} is excluded for must be non-empty and strictly increasing")
            last_reason = raw_reason
            try:
                reason = raw_reason.decode("utf-8")
            except UnicodeDecodeError:
                raise _malformed("an exclusion reason is not UTF-8") from None
            where = [reader.varint("excluded slice") for _ in range(reader.varint("excluded slices", limit=len(owned)))]
            if not where or any(b <= a for a, b in zip(where, where[1:])):
                raise _malformed(f"the slices {peer_id[:8]} is excluded from must be a non-empty, strictly increasing list")
            for j in where:
                if j not in in_batch:
                    raise _malformed(f"{peer_id[:8]} is excluded from slice {j}, which the batch does not hold")
                if peer_id in by_slice.setdefault(j, {}):
                    raise _malformed(f"{peer_id[:8]} is excluded from slice {j} twice")
                by_slice[j][peer_id] = reason
    return by_slice


def signed_to_text(signed: swarm_pb2.Signed) -> str:
    """A signed message as one base64 string (evidence kept in status and checkpoints)."""
    return base64.b64encode(signed.SerializeToString()).decode()


def signed_from_text(text: str) -> swarm_pb2.Signed:
    try:
        return swarm_pb2.Signed.FromString(base64.b64decode(text, validate=True))
    except Exception:  # noqa: BLE001 - any decoding failure is the same refusal
        raise EnvelopeError("malformed", "not a base64 signed message") from None


def sign_mismatch_report(identity: Identity, *, run_id: str, round_: int, slice_: int, results: list[swarm_pb2.Signed]) -> swarm_pb2.Signed:
    """A peer's report that slice `slice_` of these signed batches did not recompute."""
    body = {"run_id": run_id, "round": round_, "slice": slice_, "results": [signed_to_text(s) for s in results[:16]]}
    return sign_body(identity, MISMATCH_TAG, body)


def open_mismatch_report(signed: swarm_pb2.Signed, *, run_id: str) -> tuple[str, int, int, list[swarm_pb2.Signed]]:
    """-> (reporter peer_id, round, slice, the signed batches it disputes); raises EnvelopeError."""
    fields, reporter = open_envelope(signed, MISMATCH_TAG, "report")
    try:
        round_, slice_ = int(fields["round"]), int(fields["slice"])
        texts = list(fields["results"])
        if fields["run_id"] != run_id or not 1 <= len(texts) <= 16:
            raise ValueError
    except (KeyError, TypeError, ValueError):
        raise EnvelopeError("malformed", "report body lacks required fields (run_id, round, slice, 1-16 results)") from None
    return reporter, round_, slice_, [signed_from_text(str(t)) for t in texts]
