"""The coordinator's signed word on the swarm state θ_r: the sha256 and size of each of its parts.

A late joiner fetches the parts (peer/run/state_sync.py) from any peers that hold them and accepts
each only against this manifest, signed by the run's coordinator key.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from protocol._generated import swarm_pb2
from protocol.envelope import EnvelopeError, open_envelope
from protocol.identity import Identity
from protocol.keys import CoordinatorKeys
from protocol.signing import sign_body

STATE_MANIFEST_TAG = "swarmloco/state-manifest/v1"
MAX_PARTS = 4097  # header + exchange.slices (<= 4096)


@dataclass(frozen=True, slots=True)
class StateManifest:
    run_id: str
    round: int
    param_hash: str
    config_hash: str
    part_sha256: tuple[str, ...]
    part_sizes: tuple[int, ...]


def sign_state_manifest(identity: Identity, manifest: StateManifest) -> swarm_pb2.Signed:
    body = asdict(manifest)
    body["part_sha256"], body["part_sizes"] = list(manifest.part_sha256), list(manifest.part_sizes)
    return sign_body(identity, STATE_MANIFEST_TAG, body)


def open_state_manifest(signed: swarm_pb2.Signed, *, keys: CoordinatorKeys, run_id: str, max_bytes: int) -> StateManifest:
    """Verify a state manifest: signed by one of this run's coordinator keys, for this run, sane sizes."""
    keys.check(signed, "the state manifest")
    fields, _ = open_envelope(signed, STATE_MANIFEST_TAG, "state manifest")
    try:
        manifest = StateManifest(
            run_id=str(fields["run_id"]), round=int(fields["round"]), param_hash=str(fields["param_hash"]),
            config_hash=str(fields["config_hash"]), part_sha256=tuple(str(s) for s in fields["part_sha256"]),
            part_sizes=tuple(int(s) for s in fields["part_sizes"]),
        )
    except (KeyError, TypeError, ValueError):
        raise EnvelopeError("malformed", "state manifest lacks required fields") from None
    if manifest.run_id != run_id:
        raise EnvelopeError("wrong-run", f"state manifest is for run {manifest.run_id!r}")
    n = len(manifest.part_sha256)
    if not 2 <= n <= MAX_PARTS or len(manifest.part_sizes) != n:
        raise EnvelopeError("malformed", f"state manifest lists {n} parts and {len(manifest.part_sizes)} sizes")
    if any(not 0 < size <= max_bytes for size in manifest.part_sizes) or sum(manifest.part_sizes) > 4 * max_bytes:
        raise EnvelopeError("oversized", "state manifest declares parts outside the run's size bounds")
    return manifest
