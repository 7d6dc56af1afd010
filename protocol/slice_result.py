"""Signed slice results: what an owner of slice j says it computed in round r.

An owner fetches slice j of every update the manifest lists, verifies each against the author's
signed header, runs the robust rule on that slice alone and signs

    {run_id, round, slice, owner, manifest_sha256, result_sha256, result_size, excluded}

`excluded` names the listed peers left out, with why (unreachable, non-finite, undecodable,
hash-mismatch); the result's `inputs` are the manifest's other entries, in its order. They are
not signed as a list: the manifest (bound by its sha256) already fixes them, and a list of n peer
ids in each of the S·r results every peer downloads would grow the round's control traffic as n².
Anyone holding the same signed inputs can recompute the result bit for bit and check
`result_sha256`: two owners that signed different hashes over the same inputs prove one of them
wrong, and a recomputation says which (the signed result is the evidence).
"""

from __future__ import annotations

import base64
from dataclasses import asdict, dataclass, field
from collections.abc import Sequence
from typing import Any

from protocol._generated import swarm_pb2
from protocol.envelope import EnvelopeError, open_envelope
from protocol.signing import sign_body
from protocol.identity import Identity

SLICE_RESULT_TAG = "swarmloco/slice-result/v1"
MISMATCH_TAG = "swarmloco/slice-mismatch/v1"
HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True, slots=True)
class SliceResult:
    run_id: str
    round: int
    slice: int
    owner: str  # peer_id of the signer
    manifest_sha256: str  # binds the result to one signed manifest
    result_sha256: str
    result_size: int
    inputs: tuple[str, ...]
    excluded: dict[str, str] = field(default_factory=dict)


def sign_slice_result(identity: Identity, result: SliceResult) -> swarm_pb2.Signed:
    if result.owner != identity.peer_id:
        raise ValueError("a slice result must name its signer as owner")
    body = asdict(result)
    del body["inputs"]  # the manifest's entries minus `excluded`: see the module docstring
    return sign_body(identity, SLICE_RESULT_TAG, body)


def _is_hex64(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and set(value) <= HEX


def open_slice_result(
    signed: swarm_pb2.Signed, *, run_id: str, round_: int, num_slices: int, max_result_bytes: int, peer_ids: Sequence[str]
) -> SliceResult:
    """Verify a signed slice result's signature and shape; raise EnvelopeError. `peer_ids`: the
    manifest's entries in its order (the result's inputs are those not excluded)."""
    fields, signer = open_envelope(signed, SLICE_RESULT_TAG, "slice result")
    try:
        excluded = {str(k): str(v) for k, v in dict(fields["excluded"]).items()}
        result = SliceResult(
            run_id=str(fields["run_id"]),
            round=int(fields["round"]),
            slice=int(fields["slice"]),
            owner=str(fields["owner"]),
            manifest_sha256=str(fields["manifest_sha256"]),
            result_sha256=str(fields["result_sha256"]),
            result_size=int(fields["result_size"]),
            inputs=tuple(p for p in peer_ids if p not in excluded),
            excluded=excluded,
        )
    except (KeyError, TypeError, ValueError):
        raise EnvelopeError("malformed", "slice result body lacks required fields") from None
    if not set(excluded) <= set(peer_ids):
        raise EnvelopeError("malformed", "slice result excludes peers the manifest does not list")
    if result.owner != signer:
        raise EnvelopeError("forged", f"slice result names owner {result.owner[:8]} but is signed by {signer[:8]}")
    if result.run_id != run_id or result.round != round_:
        raise EnvelopeError("wrong-round", f"slice result is for {result.run_id}/{result.round}, expected {run_id}/{round_}")
    if not 0 <= result.slice < num_slices:
        raise EnvelopeError("malformed", f"slice {result.slice} outside 0..{num_slices - 1}")
    if not (_is_hex64(result.result_sha256) and _is_hex64(result.manifest_sha256)):
        raise EnvelopeError("malformed", "result_sha256 / manifest_sha256 are not 64 lowercase hex characters")
    if not 0 < result.result_size <= max_result_bytes:
        raise EnvelopeError("oversized", f"declared result size {result.result_size} is outside (0, {max_result_bytes}]")
    return result


def signed_to_text(signed: swarm_pb2.Signed) -> str:
    """A signed message as one base64 string (evidence kept in status and checkpoints)."""
    return base64.b64encode(signed.SerializeToString()).decode()


def signed_from_text(text: str) -> swarm_pb2.Signed:
    try:
        return swarm_pb2.Signed.FromString(base64.b64decode(text, validate=True))
    except Exception:  # noqa: BLE001 - any decoding failure is the same refusal
        raise EnvelopeError("malformed", "not a base64 signed message") from None


def sign_mismatch_report(identity: Identity, *, run_id: str, round_: int, slice_: int, results: list[swarm_pb2.Signed]) -> swarm_pb2.Signed:
    """A peer's report that these signed results for one slice did not recompute."""
    body = {"run_id": run_id, "round": round_, "slice": slice_, "results": [signed_to_text(s) for s in results[:16]]}
    return sign_body(identity, MISMATCH_TAG, body)


def open_mismatch_report(signed: swarm_pb2.Signed, *, run_id: str) -> tuple[str, int, int, list[swarm_pb2.Signed]]:
    """-> (reporter peer_id, round, slice, the signed results it disputes); raises EnvelopeError."""
    fields, reporter = open_envelope(signed, MISMATCH_TAG, "report")
    try:
        round_, slice_ = int(fields["round"]), int(fields["slice"])
        texts = list(fields["results"])
        if fields["run_id"] != run_id or not 1 <= len(texts) <= 16:
            raise ValueError
    except (KeyError, TypeError, ValueError):
        raise EnvelopeError("malformed", "report body lacks required fields (run_id, round, slice, 1-16 results)") from None
    return reporter, round_, slice_, [signed_from_text(str(t)) for t in texts]
