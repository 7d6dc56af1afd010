"""Update envelopes and round manifests: what is signed, and the checks every receiver runs.

An update is a signed *header* (small, goes to the coordinator as the commitment) plus the
*payload* (the encoded pseudo-gradient, content-addressed by its sha256, fetched from any holder).
The header binds run_id and round (no replay), the codec and tensor layout (no shape games), and
the payload's exact size and sha256 (no substitution, and the size is known before reading).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from protocol import merkle
from protocol._generated import swarm_pb2
from protocol.envelope_error import EnvelopeError
from protocol.identity import Identity
from protocol.keys import CoordinatorKeys
from protocol.reasons import Reason
from protocol.signing import SignatureError, canonical_body, open_signed, sign_body

# v5: a sliced update's payload_sha256 is its sliced commitment (sliced_payload_sha256); v4: the work
# done (inner_steps, tokens); v3: a Merkle root over the slice hashes
UPDATE_TAG = "swarmloco/update-header/v5"
OLD_UPDATE_TAGS = ("swarmloco/update-header/v4", "swarmloco/update-header/v3", "swarmloco/update-header/v2",
                   "swarmloco/update-header/v1")
SLICED_COMMITMENT_TAG = b"swarmloco/sliced-payload/v1\n"
MAX_INNER_STEPS = 1 << 20  # no header claims more inner steps than this, whatever the run (a run bounds it lower)
MANIFEST_TAG = "swarmloco/round-manifest/v3"  # v3: headers without the fields they share; v2: owners as indices
JOIN_TAG = "swarmloco/join/v1"
HEARTBEAT_TAG = "swarmloco/heartbeat/v1"
GATHERED_TAG = "swarmloco/gathered/v1"  # a peer gathered a sliced round (Coordinator.ReportGathered)


@dataclass(frozen=True, slots=True)
class UpdateHeader:
    run_id: str
    round: int
    peer_id: str
    codec: str
    numel: int
    layout_hash: str
    base_param_hash: str  # hash of θ_round the pseudo-gradient was computed from
    payload_sha256: str
    payload_size: int
    # Sliced exchange: the Merkle root (protocol/merkle.py, base64 of its 32 bytes) over the
    # sha256 of each slice's bytes, in slice order, and their count. A slice travels with its
    # proof and verifies alone; the header stays the same size whatever the number of slices.
    slices_root: str = ""
    num_slices: int = 0
    # The work behind this update (shared/DESIGN.md, "Heterogeneous peers"): the inner steps and
    # tokens this round's phase trained on. A compute-window run weighs updates by them (capped:
    # optim/work_weights.py); open_update bounds them by what the run allows.
    inner_steps: int = 0
    tokens: int = 0

    def root_bytes(self) -> bytes:
        return base64.b64decode(self.slices_root) if self.slices_root else b""


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sliced_payload_sha256(root: bytes, payload_size: int) -> str:
    """A sliced update's payload_sha256: sha256 over its slices' Merkle root and the payload's size,
    not over the payload's bytes. The root commits to every slice's bytes (each slice delimits
    itself, so their concatenation is the payload): the same commitment, without the author
    hashing its whole payload a second time (the slices are hashed for the root anyway: 2 MB of
    a 4 MB hash per round at 1M fp16 values). open_update holds a sliced header to it, so one
    payload_sha256 (the manifest's commitment, the owner draw's seed) names one root."""
    return hashlib.sha256(SLICED_COMMITMENT_TAG + root + payload_size.to_bytes(8, "big")).hexdigest()


def build_update_header(*, run_id: str, round_: int, peer_id: str, codec: str, numel: int, layout_hash: str,
                        base_param_hash: str, payload: bytes, slices: Iterable[str] = (), inner_steps: int = 0,
                        tokens: int = 0) -> UpdateHeader:
    """The one way an update header is made: its payload's sha256 and size come from the bytes,
    its slices' Merkle root from their sha256 hex digests (`slices`, in slice order; none: not sliced);
    `inner_steps` and `tokens`: the work the update stands for."""
    digests = [bytes.fromhex(h) for h in slices]
    if digests:
        root = merkle.root(digests)
        top, sha = base64.b64encode(root).decode(), sliced_payload_sha256(root, len(payload))
    else:
        top, sha = "", sha256_hex(payload)
    return UpdateHeader(run_id=run_id, round=round_, peer_id=peer_id, codec=codec, numel=numel, layout_hash=layout_hash,
                        base_param_hash=base_param_hash, payload_sha256=sha, payload_size=len(payload),
                        slices_root=top, num_slices=len(digests), inner_steps=inner_steps, tokens=tokens)


def open_envelope(signed: swarm_pb2.Signed, tag: str, what: str) -> tuple[dict[str, Any], str]:
    """open_signed for a body of kind `what`, its failures as EnvelopeError (counted by reason)."""
    try:
        return open_signed(signed, tag)
    except SignatureError as exc:
        raise EnvelopeError(exc.reason, f"{what} refused: {exc}") from None


def sign_update(identity: Identity, header: UpdateHeader) -> swarm_pb2.Signed:
    if header.peer_id != identity.peer_id:
        raise ValueError("an update header must name its signer's peer_id")
    return sign_body(identity, UPDATE_TAG, header_body(header))


def header_body(header: UpdateHeader) -> dict[str, Any]:
    """The fields an update header signs, as they travel."""
    return asdict(header)


def pack_digests(hashes: Iterable[str]) -> str:
    """sha256 hex strings -> one base64 string of their raw 32-byte digests, in order (43
    characters a hash instead of 66 as a JSON string of hex)."""
    return base64.b64encode(b"".join(bytes.fromhex(h) for h in hashes)).decode()


def unpack_digests(value: object, *, field_name: str, limit: int = 4096) -> list[str]:
    """pack_digests' inverse for an untrusted field (EnvelopeError "malformed" when it is not one)."""
    try:
        raw = base64.b64decode(value, validate=True) if isinstance(value, str) else None
    except ValueError:
        raw = None
    if raw is None or len(raw) % 32 or len(raw) > 32 * limit:
        raise EnvelopeError("malformed", f"field {field_name!r} is not base64 of at most {limit} sha256 digests")
    return [raw[i : i + 32].hex() for i in range(0, len(raw), 32)]


def _field(fields: dict[str, Any], name: str, kind: type) -> Any:
    value = fields.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise EnvelopeError("malformed", f"update header field {name!r} missing or not {kind.__name__}")
    return value


def open_update(
    signed: swarm_pb2.Signed,
    *,
    run_id: str,
    round_: int | None,
    codec: str,
    numel: int,
    layout_hash: str,
    max_payload_bytes: int,
    num_slices: int = 0,
    max_inner_steps: int = MAX_INNER_STEPS,
    tokens_per_step: int | None = None,
) -> UpdateHeader:
    """Verify a signed update header against what this run expects; raise EnvelopeError.
    The claimed work is bounded: at most `max_inner_steps` steps, and (`tokens_per_step`, a
    step's batch x sequence length) no more tokens than those steps hold."""
    for old in OLD_UPDATE_TAGS:
        if signed.body.startswith(old.encode() + b"\n"):
            raise EnvelopeError("wrong-tag", f"update header is in the old format {old!r}; this swarm signs {UPDATE_TAG!r} "
                                             f"(a sliced update commits to its Merkle root and size): upgrade swarmloco on that peer")
    fields, signer = open_envelope(signed, UPDATE_TAG, "update header")
    header = UpdateHeader(
        run_id=_field(fields, "run_id", str),
        round=_field(fields, "round", int),
        peer_id=_field(fields, "peer_id", str),
        codec=_field(fields, "codec", str),
        numel=_field(fields, "numel", int),
        layout_hash=_field(fields, "layout_hash", str),
        base_param_hash=_field(fields, "base_param_hash", str),
        payload_sha256=_field(fields, "payload_sha256", str),
        payload_size=_field(fields, "payload_size", int),
        slices_root=_field(fields, "slices_root", str),
        num_slices=_field(fields, "num_slices", int),
        inner_steps=_field(fields, "inner_steps", int),
        tokens=_field(fields, "tokens", int),
    )
    if header.peer_id != signer:
        raise EnvelopeError("forged", f"header names peer {header.peer_id} but is signed by {signer}")
    if header.run_id != run_id:
        raise EnvelopeError("wrong-run", f"update is for run {header.run_id!r}, this run is {run_id!r}")
    if round_ is not None and header.round != round_:
        raise EnvelopeError("wrong-round", f"update is for round {header.round}, expected round {round_} (replay or stale)")
    if header.codec != codec:
        raise EnvelopeError("wrong-codec", f"update uses codec {header.codec!r}, the run uses {codec!r}")
    if header.numel != numel or header.layout_hash != layout_hash:
        raise EnvelopeError("wrong-layout", "update's tensor layout does not match the run's model")
    if not 0 < header.payload_size <= max_payload_bytes:
        raise EnvelopeError(
            "oversized", f"declared payload size {header.payload_size} is outside (0, {max_payload_bytes}]"
        )
    if not _is_sha256(header.payload_sha256):
        raise EnvelopeError("malformed", "payload_sha256 is not 64 lowercase hex characters")
    if header.num_slices != num_slices:
        raise EnvelopeError("wrong-layout", f"update commits to {header.num_slices} slices, the run's exchange needs {num_slices}")
    if num_slices:
        root = unpack_digests(header.slices_root, field_name="slices_root", limit=1)  # decoded once, validated
        if not root:
            raise EnvelopeError("malformed", "update header field 'slices_root' is empty: a sliced update commits to a Merkle root")
        if header.payload_sha256 != sliced_payload_sha256(bytes.fromhex(root[0]), header.payload_size):
            raise EnvelopeError("malformed", "a sliced update's payload_sha256 is not the commitment to its slices_root and size")
    if not num_slices and header.slices_root:
        raise EnvelopeError("malformed", "update header commits to a slices_root but no slices")
    check_work(header, max_inner_steps=max_inner_steps, tokens_per_step=tokens_per_step)
    return header


def check_work(header: UpdateHeader, *, max_inner_steps: int, tokens_per_step: int | None) -> None:
    """The claimed work is a count a peer could have done this round (EnvelopeError "bad-work")."""
    steps, tokens = header.inner_steps, header.tokens
    if not 0 <= steps <= min(max_inner_steps, MAX_INNER_STEPS):
        raise EnvelopeError(Reason.BAD_WORK, f"update claims {steps} inner steps; this run allows 0 to {min(max_inner_steps, MAX_INNER_STEPS)}")
    bound = steps * tokens_per_step if tokens_per_step is not None else None
    if tokens < 0 or (bound is not None and tokens > bound):
        raise EnvelopeError(Reason.BAD_WORK, f"update claims {tokens} tokens for {steps} inner steps; "
                                        f"at most {bound} fit (steps x batch x sequence length)")


_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def _is_sha256(value: object) -> bool:
    return isinstance(value, str) and _SHA256_HEX.fullmatch(value) is not None


def check_payload(header: UpdateHeader, payload: bytes) -> None:
    """A whole payload against its signed header. A sliced update's payload is checked slice by
    slice against its Merkle root instead (each slice with its proof), never whole."""
    if header.num_slices:
        raise EnvelopeError("hash-mismatch", "a sliced update's payload is checked slice by slice against its Merkle root, not whole")
    if len(payload) != header.payload_size:
        raise EnvelopeError("size-mismatch", f"payload has {len(payload)} bytes, header declares {header.payload_size}")
    if sha256_hex(payload) != header.payload_sha256:
        raise EnvelopeError("hash-mismatch", "payload sha256 differs from the signed header")


# --- round manifests ------------------------------------------------------------------------


def signed_to_json(signed: swarm_pb2.Signed) -> dict[str, str]:
    """A signed message inside a JSON body (a manifest's headers, evidence). A body that is UTF-8
    (every body this project signs: a tag and JSON) travels as text, a third smaller than base64."""
    try:
        body = {"body_text": signed.body.decode("utf-8")}
    except UnicodeDecodeError:
        body = {"body": base64.b64encode(signed.body).decode()}
    return {
        **body,
        "signature": base64.b64encode(signed.signature).decode(),
        "public_key": base64.b64encode(signed.public_key).decode(),
    }


def signed_from_json(data: dict[str, str]) -> swarm_pb2.Signed:
    try:
        text = data.get("body_text")
        return swarm_pb2.Signed(
            body=text.encode("utf-8") if isinstance(text, str) else base64.b64decode(data["body"], validate=True),
            signature=base64.b64decode(data["signature"], validate=True),
            public_key=base64.b64decode(data["public_key"], validate=True),
        )
    except (KeyError, TypeError, ValueError):
        raise EnvelopeError("malformed", "manifest entry holds no valid signed header") from None


@dataclass(frozen=True, slots=True)
class ManifestEntry:
    peer_id: str
    payload_sha256: str
    payload_size: int
    header: dict[str, str]  # the author's signed header, so anyone can check authorship
    holders: list[str]  # HOST:PORT endpoints known to serve the payload (author first)
    serves: bool = False  # the author serves (not client-mode): it may own slices


def check_entry(entry: ManifestEntry, header: UpdateHeader) -> None:
    """A manifest entry must name the update its signed header commits to (EnvelopeError "forged")."""
    if header.payload_sha256 != entry.payload_sha256 or header.peer_id != entry.peer_id:
        raise EnvelopeError("forged", f"manifest entry of {entry.peer_id[:8]} does not match its signed header")


@dataclass(frozen=True, slots=True)
class RoundManifest:
    run_id: str
    round: int
    base_param_hash: str
    entries: list[ManifestEntry]  # sorted by peer_id: the order of aggregation everywhere
    excluded: dict[str, str]  # peer_id -> reason (evidence is kept by the coordinator)
    owners: list[list[str]] = field(default_factory=list)  # sliced exchange: slice -> owner peer_ids
    last: bool = False  # the run's last round: after it, the run is over
    term: int = 0  # the signer's coordinator term: a receiver that has seen a higher one refuses it (run_state.TermFence)
    # A takeover's manifest continues the round in flight (peer/coordinator/standby.py): the same
    # body as the manifest of term `continues_term` whose signed body has sha256 `continues`, signed
    # again in the successor's term. Slice results stay bound to that body (SliceRound.of), so the
    # owners' signed batches count in the continued round; open_manifest checks the claim.
    continues: str = ""
    continues_term: int = 0
    # A compute-window run: peer_id -> the work (tokens, after the caps) the coordinator accepted
    # for that author the round before, the history cap every owner applies (peer/run/work_math.py).
    # Empty otherwise, and then not in the signed body.
    work_history: dict[str, int] = field(default_factory=dict)
    # Overlapped rounds on the swarm's clock (rounds.overlap_window): the compute window, in ms, of
    # the phase this manifest's arrival starts on every peer (it closes window_ms after the peer
    # received it). 0 = none (a fixed H, or no rate known yet), and then not in the signed body.
    window_ms: int = 0


MAX_WINDOW_MS = 86_400_000  # a manifest's window is at most a day

CONTINUATION_FIELDS = ("continues", "continues_term")


def sign_manifest(identity: Identity, manifest: RoundManifest) -> swarm_pb2.Signed:
    """Owners travel as indices into the entries (every owner serves a listed update): 28 slices
    x 2 owners are ~170 bytes instead of ~2 KB of peer ids."""
    index = {e.peer_id: i for i, e in enumerate(manifest.entries)}
    try:
        owners = [[index[p] for p in slice_owners] for slice_owners in manifest.owners]
    except KeyError as exc:
        raise ValueError(f"slice owner {exc.args[0]} is not an entry of the manifest") from None
    common, headers = _compact_headers(manifest.entries)
    entries = [{**asdict(e), "header": h} for e, h in zip(manifest.entries, headers)]
    body = {**asdict(manifest), "entries": entries, "owners": owners, "header_common": common}
    if not manifest.continues:  # a manifest that continues none has the fields it always had
        for name in CONTINUATION_FIELDS:
            del body[name]
    if not manifest.work_history:
        del body["work_history"]  # a fixed-H run's manifest stays as it was
    if not manifest.window_ms:
        del body["window_ms"]
    return sign_body(identity, MANIFEST_TAG, body)


def continued_sha256(fields: dict[str, Any]) -> str:
    """The sha256 of the signed body a continuing manifest's fields say they continue: the same
    fields in the earlier term, without the continuation (sign_body's canonical form is unique)."""
    earlier = {k: v for k, v in fields.items() if k not in CONTINUATION_FIELDS}
    earlier["term"] = fields["continues_term"]
    return hashlib.sha256(canonical_body(MANIFEST_TAG, earlier)).hexdigest()


# Headers travel in a manifest without what they share. Every listed header names the same run,
# round, codec, layout, base and slice count, and repeats its entry's peer_id, payload sha256 and
# size: the manifest carries the shared fields once ("header_common") and each header as
# {"fields": the rest, "signature", "public_key"}. A receiver rebuilds the author's canonical
# body (protocol/signing.canonical_body) and checks the author's signature over it, so nothing is
# trusted that the author did not sign; a header whose signed bytes are not canonical travels whole.
ENTRY_FIELDS = ("peer_id", "payload_sha256", "payload_size")  # a header's fields its manifest entry repeats


def _compact_headers(entries: list[ManifestEntry]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    parsed: list[dict[str, Any] | None] = []
    for entry in entries:
        signed = signed_from_json(entry.header)
        fields = _canonical_fields(signed)
        if fields is not None and any(fields.get(k) != getattr(entry, k) for k in ENTRY_FIELDS):
            fields = None
        parsed.append(fields)
    shareable = [f for f in parsed if f is not None]
    common: dict[str, Any] = {}
    for key, value in (shareable[0].items() if shareable else ()):
        as_json = json.dumps(value)  # equal as JSON, not as Python (True == 1 == 1.0)
        if key not in ENTRY_FIELDS and all(key in f and json.dumps(f[key]) == as_json for f in shareable):
            common[key] = value
    headers = []
    for entry, fields in zip(entries, parsed):
        if fields is None:
            headers.append(entry.header)
            continue
        own = {k: v for k, v in fields.items() if k not in common and k not in ENTRY_FIELDS}
        headers.append({"fields": own, "signature": entry.header["signature"], "public_key": entry.header["public_key"]})
    return common, headers


def _canonical_fields(signed: swarm_pb2.Signed) -> dict[str, Any] | None:
    """The header's fields when its signed body is exactly canonical_body(UPDATE_TAG, fields)."""
    prefix = UPDATE_TAG.encode() + b"\n"
    if not signed.body.startswith(prefix):
        return None
    try:
        fields = json.loads(signed.body[len(prefix):])
    except (ValueError, RecursionError):
        return None
    if not isinstance(fields, dict) or canonical_body(UPDATE_TAG, fields) != signed.body:
        return None
    return fields


def _expand_header(header: object, common: dict[str, Any], entry: dict[str, Any]) -> dict[str, str]:
    """A manifest's compact header -> signed_to_json's form, the author's body rebuilt."""
    if not isinstance(header, dict) or "fields" not in header:
        return header  # type: ignore[return-value]  # travelled whole (signed_from_json checks it)
    own = header["fields"]
    if not isinstance(own, dict):
        raise TypeError
    fields = {**common, **own, **{k: entry[k] for k in ENTRY_FIELDS}}
    return {"body_text": canonical_body(UPDATE_TAG, fields).decode("utf-8"), "signature": header["signature"],
            "public_key": header["public_key"]}


def _owners(value: object, entries: list[ManifestEntry]) -> list[list[str]]:
    if not isinstance(value, list) or not all(isinstance(o, list) for o in value):
        raise EnvelopeError("malformed", "manifest owners are not lists of entry indices")
    try:
        return [[entries[i].peer_id for i in _indices(o, len(entries))] for o in value]
    except (IndexError, TypeError):
        raise EnvelopeError("malformed", "manifest owners name an entry the manifest does not hold") from None


def _indices(value: list, bound: int) -> list[int]:
    if not all(type(i) is int and 0 <= i < bound for i in value):
        raise IndexError
    return value


def _work_history(value: object) -> dict[str, int]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and type(v) is int and v >= 0 for k, v in value.items()):
        raise TypeError
    return dict(value)


def _window_ms(value: object) -> int:
    if type(value) is not int or not 0 <= value <= MAX_WINDOW_MS:
        raise TypeError
    return value


def _term(value: object) -> int:
    if type(value) is not int or value < 0:
        raise TypeError
    return value


def open_manifest(signed: swarm_pb2.Signed, *, keys: CoordinatorKeys, run_id: str, round_: int) -> RoundManifest:
    """A round manifest signed by one of the run's coordinator keys (ImpersonationError otherwise)."""
    keys.check(signed, f"the manifest of round {round_}")
    try:
        fields, _ = open_signed(signed, MANIFEST_TAG)
        common = fields["header_common"]
        if not isinstance(common, dict) or not all(isinstance(e, dict) for e in fields["entries"]):
            raise TypeError
        entries = [ManifestEntry(**{**e, "header": _expand_header(e.get("header"), common, e)}) for e in fields["entries"]]
        manifest = RoundManifest(
            run_id=fields["run_id"],
            round=fields["round"],
            base_param_hash=fields["base_param_hash"],
            entries=entries,
            excluded=dict(fields["excluded"]),
            owners=_owners(fields.get("owners", []), entries),
            last=bool(fields.get("last", False)),
            term=_term(fields["term"]),
            continues=str(fields.get("continues", "")),
            continues_term=_term(fields.get("continues_term", 0)),
            work_history=_work_history(fields.get("work_history", {})),
            window_ms=_window_ms(fields.get("window_ms", 0)),
        )
    except SignatureError as exc:
        raise EnvelopeError(exc.reason, f"manifest refused: {exc}") from None
    except (KeyError, TypeError):
        raise EnvelopeError("malformed", "manifest body lacks required fields") from None
    if manifest.run_id != run_id or manifest.round != round_:
        raise EnvelopeError("wrong-round", f"manifest is for {manifest.run_id}/{manifest.round}, expected {run_id}/{round_}")
    if [e.peer_id for e in entries] != sorted(e.peer_id for e in entries):
        raise EnvelopeError("malformed", "manifest entries are not sorted by peer_id")
    if manifest.continues and (manifest.continues_term >= manifest.term or manifest.continues != continued_sha256(fields)):
        raise EnvelopeError("forged", f"the manifest of round {round_} says it continues manifest {manifest.continues[:12]} "
                                      f"of term {manifest.continues_term}, but its body is not that one's in a later term")
    return manifest
