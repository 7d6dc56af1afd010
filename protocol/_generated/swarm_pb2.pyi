from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Refusal(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REFUSAL_UNSPECIFIED: _ClassVar[Refusal]
    UNKNOWN_PEER: _ClassVar[Refusal]
    WRONG_ENDPOINT: _ClassVar[Refusal]
    STALE_ROUND: _ClassVar[Refusal]
    WRONG_BASE: _ClassVar[Refusal]
    EQUIVOCATION: _ClassVar[Refusal]
    BANNED: _ClassVar[Refusal]
    RUN_FINISHED: _ClassVar[Refusal]
    WRONG_RUN: _ClassVar[Refusal]
    CLOCK_SKEW: _ClassVar[Refusal]
    NOT_ALLOWED: _ClassVar[Refusal]
    BAD_SIGNATURE: _ClassVar[Refusal]
    INVALID_UPDATE: _ClassVar[Refusal]
    MALFORMED: _ClassVar[Refusal]
    RATE_LIMITED: _ClassVar[Refusal]
    REGISTRY_FULL: _ClassVar[Refusal]
    NOT_HELD: _ClassVar[Refusal]
    NO_RELAY: _ClassVar[Refusal]
    NOT_OWNER: _ClassVar[Refusal]
    BUSY: _ClassVar[Refusal]
    NOT_ACTIVE: _ClassVar[Refusal]
    DUPLICATE_SESSION: _ClassVar[Refusal]
    UNREACHABLE: _ClassVar[Refusal]
REFUSAL_UNSPECIFIED: Refusal
UNKNOWN_PEER: Refusal
WRONG_ENDPOINT: Refusal
STALE_ROUND: Refusal
WRONG_BASE: Refusal
EQUIVOCATION: Refusal
BANNED: Refusal
RUN_FINISHED: Refusal
WRONG_RUN: Refusal
CLOCK_SKEW: Refusal
NOT_ALLOWED: Refusal
BAD_SIGNATURE: Refusal
INVALID_UPDATE: Refusal
MALFORMED: Refusal
RATE_LIMITED: Refusal
REGISTRY_FULL: Refusal
NOT_HELD: Refusal
NO_RELAY: Refusal
NOT_OWNER: Refusal
BUSY: Refusal
NOT_ACTIVE: Refusal
DUPLICATE_SESSION: Refusal
UNREACHABLE: Refusal

class Signed(_message.Message):
    __slots__ = ("body", "signature", "public_key")
    BODY_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    body: bytes
    signature: bytes
    public_key: bytes
    def __init__(self, body: _Optional[bytes] = ..., signature: _Optional[bytes] = ..., public_key: _Optional[bytes] = ...) -> None: ...

class RunInfoRequest(_message.Message):
    __slots__ = ("at_round", "round", "state_only")
    AT_ROUND_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    STATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    at_round: bool
    round: int
    state_only: bool
    def __init__(self, at_round: _Optional[bool] = ..., round: _Optional[int] = ..., state_only: _Optional[bool] = ...) -> None: ...

class RunInfo(_message.Message):
    __slots__ = ("run_id", "config_json", "coordinator_public_key", "software_version", "round", "param_hash", "initial_peers", "finished", "state_manifest", "state_holders", "run_state", "coordinator_endpoints")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    SOFTWARE_VERSION_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    PARAM_HASH_FIELD_NUMBER: _ClassVar[int]
    INITIAL_PEERS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    STATE_MANIFEST_FIELD_NUMBER: _ClassVar[int]
    STATE_HOLDERS_FIELD_NUMBER: _ClassVar[int]
    RUN_STATE_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    config_json: str
    coordinator_public_key: bytes
    software_version: str
    round: int
    param_hash: str
    initial_peers: _containers.RepeatedScalarFieldContainer[str]
    finished: bool
    state_manifest: Signed
    state_holders: _containers.RepeatedScalarFieldContainer[str]
    run_state: Signed
    coordinator_endpoints: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, run_id: _Optional[str] = ..., config_json: _Optional[str] = ..., coordinator_public_key: _Optional[bytes] = ..., software_version: _Optional[str] = ..., round: _Optional[int] = ..., param_hash: _Optional[str] = ..., initial_peers: _Optional[_Iterable[str]] = ..., finished: _Optional[bool] = ..., state_manifest: _Optional[_Union[Signed, _Mapping]] = ..., state_holders: _Optional[_Iterable[str]] = ..., run_state: _Optional[_Union[Signed, _Mapping]] = ..., coordinator_endpoints: _Optional[_Iterable[str]] = ...) -> None: ...

class JoinReply(_message.Message):
    __slots__ = ("accepted", "reason", "peer_id", "round", "param_hash", "refusal")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    PARAM_HASH_FIELD_NUMBER: _ClassVar[int]
    REFUSAL_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    reason: str
    peer_id: str
    round: int
    param_hash: str
    refusal: Refusal
    def __init__(self, accepted: _Optional[bool] = ..., reason: _Optional[str] = ..., peer_id: _Optional[str] = ..., round: _Optional[int] = ..., param_hash: _Optional[str] = ..., refusal: _Optional[_Union[Refusal, str]] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("round", "param_hash", "banned", "reason", "finished", "refusal", "unreachable")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    PARAM_HASH_FIELD_NUMBER: _ClassVar[int]
    BANNED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    REFUSAL_FIELD_NUMBER: _ClassVar[int]
    UNREACHABLE_FIELD_NUMBER: _ClassVar[int]
    round: int
    param_hash: str
    banned: bool
    reason: str
    finished: bool
    refusal: Refusal
    unreachable: str
    def __init__(self, round: _Optional[int] = ..., param_hash: _Optional[str] = ..., banned: _Optional[bool] = ..., reason: _Optional[str] = ..., finished: _Optional[bool] = ..., refusal: _Optional[_Union[Refusal, str]] = ..., unreachable: _Optional[str] = ...) -> None: ...

class CommitRequest(_message.Message):
    __slots__ = ("header", "endpoint")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    header: Signed
    endpoint: str
    def __init__(self, header: _Optional[_Union[Signed, _Mapping]] = ..., endpoint: _Optional[str] = ...) -> None: ...

class CommitReply(_message.Message):
    __slots__ = ("accepted", "reason", "current_round", "refusal")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CURRENT_ROUND_FIELD_NUMBER: _ClassVar[int]
    REFUSAL_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    reason: str
    current_round: int
    refusal: Refusal
    def __init__(self, accepted: _Optional[bool] = ..., reason: _Optional[str] = ..., current_round: _Optional[int] = ..., refusal: _Optional[_Union[Refusal, str]] = ...) -> None: ...

class ManifestRequest(_message.Message):
    __slots__ = ("round", "wait_s", "compact")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    COMPACT_FIELD_NUMBER: _ClassVar[int]
    round: int
    wait_s: float
    compact: bool
    def __init__(self, round: _Optional[int] = ..., wait_s: _Optional[float] = ..., compact: _Optional[bool] = ...) -> None: ...

class ManifestReply(_message.Message):
    __slots__ = ("ready", "manifest", "current_round", "finished")
    READY_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    CURRENT_ROUND_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    ready: bool
    manifest: Signed
    current_round: int
    finished: bool
    def __init__(self, ready: _Optional[bool] = ..., manifest: _Optional[_Union[Signed, _Mapping]] = ..., current_round: _Optional[int] = ..., finished: _Optional[bool] = ...) -> None: ...

class CheckpointRequest(_message.Message):
    __slots__ = ("offset",)
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    offset: int
    def __init__(self, offset: _Optional[int] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("data", "offset", "total_size", "sha256", "round", "proof", "item", "missing", "parts", "result")
    DATA_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    PROOF_FIELD_NUMBER: _ClassVar[int]
    ITEM_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    offset: int
    total_size: int
    sha256: str
    round: int
    proof: _containers.RepeatedScalarFieldContainer[bytes]
    item: int
    missing: bool
    parts: _containers.RepeatedCompositeFieldContainer[Chunk]
    result: int
    def __init__(self, data: _Optional[bytes] = ..., offset: _Optional[int] = ..., total_size: _Optional[int] = ..., sha256: _Optional[str] = ..., round: _Optional[int] = ..., proof: _Optional[_Iterable[bytes]] = ..., item: _Optional[int] = ..., missing: _Optional[bool] = ..., parts: _Optional[_Iterable[_Union[Chunk, _Mapping]]] = ..., result: _Optional[int] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("json",)
    JSON_FIELD_NUMBER: _ClassVar[int]
    json: str
    def __init__(self, json: _Optional[str] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("sha256", "offset", "slice", "slices_root", "proof_levels", "omit_sha256", "digest", "items", "packed")
    SHA256_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SLICE_FIELD_NUMBER: _ClassVar[int]
    SLICES_ROOT_FIELD_NUMBER: _ClassVar[int]
    PROOF_LEVELS_FIELD_NUMBER: _ClassVar[int]
    OMIT_SHA256_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    PACKED_FIELD_NUMBER: _ClassVar[int]
    sha256: str
    offset: int
    slice: int
    slices_root: bytes
    proof_levels: int
    omit_sha256: bool
    digest: bytes
    items: _containers.RepeatedCompositeFieldContainer[FetchItem]
    packed: bool
    def __init__(self, sha256: _Optional[str] = ..., offset: _Optional[int] = ..., slice: _Optional[int] = ..., slices_root: _Optional[bytes] = ..., proof_levels: _Optional[int] = ..., omit_sha256: _Optional[bool] = ..., digest: _Optional[bytes] = ..., items: _Optional[_Iterable[_Union[FetchItem, _Mapping]]] = ..., packed: _Optional[bool] = ...) -> None: ...

class FetchItem(_message.Message):
    __slots__ = ("slice", "slices_root", "proof_levels", "digest")
    SLICE_FIELD_NUMBER: _ClassVar[int]
    SLICES_ROOT_FIELD_NUMBER: _ClassVar[int]
    PROOF_LEVELS_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    slice: int
    slices_root: bytes
    proof_levels: int
    digest: bytes
    def __init__(self, slice: _Optional[int] = ..., slices_root: _Optional[bytes] = ..., proof_levels: _Optional[int] = ..., digest: _Optional[bytes] = ...) -> None: ...

class PushChunk(_message.Message):
    __slots__ = ("header", "data")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    header: Signed
    data: bytes
    def __init__(self, header: _Optional[_Union[Signed, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class SlicePush(_message.Message):
    __slots__ = ("header", "slice", "start", "proof", "data", "want", "parts", "inputs_done", "results", "takes_results", "ticket")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    SLICE_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    PROOF_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    WANT_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    INPUTS_DONE_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    TAKES_RESULTS_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    header: Signed
    slice: int
    start: bool
    proof: _containers.RepeatedScalarFieldContainer[bytes]
    data: bytes
    want: FetchRequest
    parts: _containers.RepeatedCompositeFieldContainer[SlicePush]
    inputs_done: bool
    results: _containers.RepeatedCompositeFieldContainer[Chunk]
    takes_results: bool
    ticket: Signed
    def __init__(self, header: _Optional[_Union[Signed, _Mapping]] = ..., slice: _Optional[int] = ..., start: _Optional[bool] = ..., proof: _Optional[_Iterable[bytes]] = ..., data: _Optional[bytes] = ..., want: _Optional[_Union[FetchRequest, _Mapping]] = ..., parts: _Optional[_Iterable[_Union[SlicePush, _Mapping]]] = ..., inputs_done: _Optional[bool] = ..., results: _Optional[_Iterable[_Union[Chunk, _Mapping]]] = ..., takes_results: _Optional[bool] = ..., ticket: _Optional[_Union[Signed, _Mapping]] = ...) -> None: ...

class PushReply(_message.Message):
    __slots__ = ("accepted", "reason", "sha256", "refusal")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    REFUSAL_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    reason: str
    sha256: str
    refusal: Refusal
    def __init__(self, accepted: _Optional[bool] = ..., reason: _Optional[str] = ..., sha256: _Optional[str] = ..., refusal: _Optional[_Union[Refusal, str]] = ...) -> None: ...

class SliceResultsRequest(_message.Message):
    __slots__ = ("round", "wait_s", "until_applied")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    UNTIL_APPLIED_FIELD_NUMBER: _ClassVar[int]
    round: int
    wait_s: float
    until_applied: bool
    def __init__(self, round: _Optional[int] = ..., wait_s: _Optional[float] = ..., until_applied: _Optional[bool] = ...) -> None: ...

class SliceResultsReply(_message.Message):
    __slots__ = ("ready", "results", "applied", "param_hash", "current_round", "finished", "run_state")
    READY_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    PARAM_HASH_FIELD_NUMBER: _ClassVar[int]
    CURRENT_ROUND_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    RUN_STATE_FIELD_NUMBER: _ClassVar[int]
    ready: bool
    results: _containers.RepeatedCompositeFieldContainer[Signed]
    applied: bool
    param_hash: str
    current_round: int
    finished: bool
    run_state: Signed
    def __init__(self, ready: _Optional[bool] = ..., results: _Optional[_Iterable[_Union[Signed, _Mapping]]] = ..., applied: _Optional[bool] = ..., param_hash: _Optional[str] = ..., current_round: _Optional[int] = ..., finished: _Optional[bool] = ..., run_state: _Optional[_Union[Signed, _Mapping]] = ...) -> None: ...

class PingRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PingReply(_message.Message):
    __slots__ = ("round",)
    ROUND_FIELD_NUMBER: _ClassVar[int]
    round: int
    def __init__(self, round: _Optional[int] = ...) -> None: ...

class ProbeDownloadRequest(_message.Message):
    __slots__ = ("size", "chunk_bytes")
    SIZE_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    size: int
    chunk_bytes: int
    def __init__(self, size: _Optional[int] = ..., chunk_bytes: _Optional[int] = ...) -> None: ...

class ProbeUploadReply(_message.Message):
    __slots__ = ("bytes", "seconds", "first_chunk_bytes")
    BYTES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    FIRST_CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    seconds: float
    first_chunk_bytes: int
    def __init__(self, bytes: _Optional[int] = ..., seconds: _Optional[float] = ..., first_chunk_bytes: _Optional[int] = ...) -> None: ...

class DialBackRequest(_message.Message):
    __slots__ = ("port", "nonce")
    PORT_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    port: int
    nonce: bytes
    def __init__(self, port: _Optional[int] = ..., nonce: _Optional[bytes] = ...) -> None: ...

class DialBackReply(_message.Message):
    __slots__ = ("connected", "address", "error", "seconds")
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    connected: bool
    address: str
    error: str
    seconds: float
    def __init__(self, connected: _Optional[bool] = ..., address: _Optional[str] = ..., error: _Optional[str] = ..., seconds: _Optional[float] = ...) -> None: ...
