"""Signed slice results: what an owner says it computed in round r, one signed batch per owner.

An owner fetches slice j of every update the manifest lists, verifies each against the author's
signed header, runs the robust rule on that slice alone, and, once every slice it owns is done,
signs ONE body for all of them:

    {run_id, round, owner, manifest_sha256,
     results:  [[slice, result_sha256, result_size], ...]   strictly by slice: exactly its slices
     excluded: {peer_id: {reason: [slice, ...]}}}            only the peers left out somewhere

(both sha256 as base64 of the raw 32 bytes, 44 characters instead of 64 of hex: every peer
downloads every owner's batch each round, ~S·r rows in all).

`excluded` names the listed peers left out of a slice, with why (unreachable, non-finite,
undecodable, hash-mismatch). Keyed by peer, an update unreachable for the whole round costs one
entry, not one per slice, and a slice-local fault (a NaN in one slice) names just that slice: the
same per-slice information as a per-slice map, in the smaller form. A slice's `inputs` are the
manifest's other entries, in its order: not signed as a list, since the manifest (bound by its
sha256) fixes them, and n peer ids per slice would grow the round's control traffic as n².

One body per owner instead of one per (slice, owner): the S·r signed results every peer downloads
were ~55% of a round's control bytes at 4 peers (each ~411 B: hex hashes, its own run/round/owner/manifest
fields, a 64 B signature and a 32 B key); a batch repeats those once and pays ~80 B per slice.

Receivers open a batch into per-slice `SliceResult`s, each kept beside the signed batch it came
from: that batch is the evidence. Anyone holding the same signed inputs can recompute slice j bit
for bit and check `result_sha256`: two owners that signed different hashes over the same inputs
prove one of them wrong, and a recomputation says which. Two different batches from one owner for
one round are equivocation.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from protocol._generated import swarm_pb2
from protocol.envelope import EnvelopeError, open_envelope
from protocol.identity import Identity
from protocol.reasons import Reason
from protocol.signing import sign_body

SLICE_RESULTS_TAG = "swarmloco/slice-results/v3"  # v3: sha256 as base64 of raw digests (v2: hex)
OLD_SLICE_RESULTS_TAGS = ("swarmloco/slice-results/v2",)
MISMATCH_TAG = "swarmloco/slice-mismatch/v1"
HEX = frozenset("0123456789abcdef")
MAX_REASON_CHARS = 32  # the longest protocol.reasons.Reason is 17
BODY_FIELDS = frozenset({"run_id", "round", "owner", "manifest_sha256", "results", "excluded"})
# Body bound, by what an honest batch can hold: a result row `[slice,"<64 hex>",size],` is under
# 100 bytes; a peer excluded from a slice under a reason of its own `"<reason>":[slice],` under 64,
# plus its id and braces once. Anything larger is refused before it is believed.
BODY_OVERHEAD_BYTES = 512
RESULT_ROW_BYTES = 100
EXCLUSION_BYTES = 64
PEER_KEY_BYTES = 48


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
    excluded: dict[str, dict[str, list[int]]] = {}
    for res in ordered:
        for peer_id, reason in res.excluded.items():
            excluded.setdefault(peer_id, {}).setdefault(str(reason), []).append(res.slice)
    body = {"run_id": first.run_id, "round": first.round, "owner": first.owner, "manifest_sha256": digest_b64(first.manifest_sha256),
            "results": [[r.slice, digest_b64(r.result_sha256), r.result_size] for r in ordered], "excluded": excluded}
    return sign_body(identity, SLICE_RESULTS_TAG, body)


def batch_body_limit(owned: int, peers: int, run_id: str) -> int:
    """The largest body an honest owner of `owned` slices signs for a manifest of `peers` entries
    (every peer left out of every slice, each time for another reason; a clean round's batch is a
    few hundred bytes plus ~80 per slice)."""
    run_id_bytes = len(json.dumps(run_id))
    return BODY_OVERHEAD_BYTES + run_id_bytes + owned * RESULT_ROW_BYTES + peers * (PEER_KEY_BYTES + owned * EXCLUSION_BYTES)


def digest_b64(hex_digest: str) -> str:
    """A sha256 as it travels in a batch: base64 of its 32 raw bytes (ValueError if not 64 hex)."""
    if not _is_hex64(hex_digest):
        raise ValueError(f"not a sha256 in lowercase hex: {hex_digest!r}")
    return base64.b64encode(bytes.fromhex(hex_digest)).decode()


def _digest_hex(value: Any) -> str | None:
    """digest_b64's inverse for an untrusted field; None when it is not the base64 of 32 bytes."""
    if not isinstance(value, str) or len(value) != 44:
        return None
    try:
        raw = base64.b64decode(value, validate=True)
    except ValueError:
        return None
    return raw.hex() if len(raw) == 32 and base64.b64encode(raw).decode() == value else None


def _is_hex64(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and set(value) <= HEX


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _malformed(message: str) -> EnvelopeError:
    return EnvelopeError(Reason.MALFORMED, f"slice results refused: {message}")


def open_slice_results(
    signed: swarm_pb2.Signed, *, run_id: str, round_: int, manifest_sha256: str, owners: Sequence[Sequence[str]],
    max_result_bytes: int, peer_ids: Sequence[str],
) -> tuple[SliceResult, ...]:
    """Verify an owner's signed batch against the round's manifest (its sha256, `owners`: slice ->
    owner peer_ids, `peer_ids`: its entries in order) and open it into per-slice results, by
    slice; raise EnvelopeError (its reason counted) when anything does not hold."""
    for old in OLD_SLICE_RESULTS_TAGS:
        if signed.body.startswith(old.encode() + b"\n"):
            raise EnvelopeError(Reason.WRONG_TAG, f"slice results in the old format {old!r}; this swarm signs "
                                                  f"{SLICE_RESULTS_TAG!r}: upgrade swarmloco on that owner")
    fields, signer = open_envelope(signed, SLICE_RESULTS_TAG, "slice results")
    if set(fields) != BODY_FIELDS:
        raise _malformed(f"the body's fields are {sorted(fields)}, expected {sorted(BODY_FIELDS)}")
    owner, rows, excluded = fields["owner"], fields["results"], fields["excluded"]
    if not isinstance(owner, str) or not isinstance(fields["run_id"], str) or not _is_int(fields["round"]):
        raise _malformed("run_id, round and owner must be a string, an integer and a string")
    if owner != signer:
        raise EnvelopeError(Reason.FORGED, f"slice results name owner {owner[:8]} but are signed by {signer[:8]}")
    if fields["run_id"] != run_id:
        raise EnvelopeError(Reason.WRONG_RUN, f"slice results are for run {fields['run_id']!r}, this run is {run_id!r}")
    if fields["round"] != round_:
        raise EnvelopeError(Reason.WRONG_ROUND, f"slice results are for round {fields['round']}, expected round {round_}")
    signed_manifest = _digest_hex(fields["manifest_sha256"])
    if signed_manifest is None:
        raise _malformed("manifest_sha256 is not the base64 of a 32-byte sha256")
    if signed_manifest != manifest_sha256:
        raise EnvelopeError(Reason.WRONG_ROUND, f"slice results are signed over another manifest of round {round_}")
    owned = [j for j, slice_owners in enumerate(owners) if signer in slice_owners]
    if not owned:
        raise EnvelopeError(Reason.NOT_OWNER, f"{signer[:8]} owns no slice of this manifest")
    limit = batch_body_limit(len(owned), len(peer_ids), run_id)
    if len(signed.body) > limit:
        raise EnvelopeError(Reason.OVERSIZED, f"slice results body of {len(signed.body)} bytes exceeds {limit} "
                                              f"for {len(owned)} owned slices and {len(peer_ids)} peers")
    slices = _result_rows(rows, num_slices=len(owners), max_result_bytes=max_result_bytes)
    if slices.keys() != set(owned):
        not_owned = sorted(slices.keys() - set(owned))
        if not_owned:
            raise EnvelopeError(Reason.NOT_OWNER, f"{signer[:8]} does not own slice {not_owned[0]} of this manifest")
        raise _malformed(f"the batch covers {len(slices)} of the {len(owned)} slices the manifest gives {signer[:8]}")
    by_slice = _exclusions(excluded, slices=slices.keys(), peer_ids=peer_ids)
    return tuple(
        SliceResult(run_id=run_id, round=round_, slice=j, owner=signer, manifest_sha256=manifest_sha256,
                    result_sha256=sha, result_size=size, inputs=tuple(p for p in peer_ids if p not in by_slice.get(j, {})),
                    excluded=by_slice.get(j, {}))
        for j, (sha, size) in slices.items()
    )


def _result_rows(rows: Any, *, num_slices: int, max_result_bytes: int) -> dict[int, tuple[str, int]]:
    """The batch's [slice, result_sha256, result_size] rows -> {slice: (sha, size)}, in slice order."""
    if not isinstance(rows, list) or not rows:
        raise _malformed("results must be a non-empty list of [slice, result_sha256, result_size]")
    slices: dict[int, tuple[str, int]] = {}
    for row in rows:
        if not (isinstance(row, list) and len(row) == 3 and _is_int(row[0]) and _is_int(row[2])):
            raise _malformed("each result must be [slice, result_sha256, result_size] with integer slice and size")
        j, sha, size = row
        if not 0 <= j < num_slices:
            raise _malformed(f"slice {j} outside 0..{num_slices - 1}")
        if slices and j <= next(reversed(slices)):
            raise _malformed(f"slice {j} out of order or named twice (results are strictly by slice)")
        sha_hex = _digest_hex(sha)
        if sha_hex is None:
            raise _malformed(f"result_sha256 of slice {j} is not the base64 of a 32-byte sha256")
        if not 0 < size <= max_result_bytes:
            raise EnvelopeError(Reason.OVERSIZED, f"declared result size {size} of slice {j} is outside (0, {max_result_bytes}]")
        slices[j] = (sha_hex, size)
    return slices


def _exclusions(excluded: Any, *, slices: Any, peer_ids: Sequence[str]) -> dict[int, dict[str, str]]:
    """{peer_id: {reason: [slice, ...]}} -> slice -> {peer_id: reason}, checked against the batch."""
    if not isinstance(excluded, dict):
        raise _malformed("excluded must be a map peer_id -> {reason: [slice, ...]}")
    listed = set(peer_ids)
    by_slice: dict[int, dict[str, str]] = {}
    for peer_id, by_reason in excluded.items():
        if peer_id not in listed:
            raise _malformed(f"slice results exclude {peer_id[:8]}, whom the manifest does not list")
        if not isinstance(by_reason, dict) or not by_reason:
            raise _malformed(f"the exclusions of {peer_id[:8]} must be a non-empty map reason -> [slice, ...]")
        for reason, where in by_reason.items():
            if not 0 < len(reason) <= MAX_REASON_CHARS:
                raise _malformed(f"an exclusion reason must be 1..{MAX_REASON_CHARS} characters")
            if not isinstance(where, list) or not where or not all(_is_int(j) for j in where):
                raise _malformed(f"the slices {peer_id[:8]} is excluded from must be a non-empty list of integers")
            if any(b <= a for a, b in zip(where, where[1:])):
                raise _malformed(f"the slices {peer_id[:8]} is excluded from must be strictly increasing")
            for j in where:
                if j not in slices:
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
