from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

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
    __slots__ = ()
    def __init__(self) -> None: ...

class RunInfo(_message.Message):
    __slots__ = ("run_id", "config_json", "coordinator_public_key", "software_version", "round", "param_hash", "initial_peers", "finished")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    SOFTWARE_VERSION_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    PARAM_HASH_FIELD_NUMBER: _ClassVar[int]
    INITIAL_PEERS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    config_json: str
    coordinator_public_key: bytes
    software_version: str
    round: int
    param_hash: str
    initial_peers: _containers.RepeatedScalarFieldContainer[str]
    finished: bool
    def __init__(self, run_id: _Optional[str] = ..., config_json: _Optional[str] = ..., coordinator_public_key: _Optional[bytes] = ..., software_version: _Optional[str] = ..., round: _Optional[int] = ..., param_hash: _Optional[str] = ..., initial_peers: _Optional[_Iterable[str]] = ..., finished: _Optional[bool] = ...) -> None: ...

class JoinReply(_message.Message):
    __slots__ = ("accepted", "reason", "peer_id", "round", "param_hash")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    PARAM_HASH_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    reason: str
    peer_id: str
    round: int
    param_hash: str
    def __init__(self, accepted: _Optional[bool] = ..., reason: _Optional[str] = ..., peer_id: _Optional[str] = ..., round: _Optional[int] = ..., param_hash: _Optional[str] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("round", "param_hash", "resync", "banned", "reason", "finished")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    PARAM_HASH_FIELD_NUMBER: _ClassVar[int]
    RESYNC_FIELD_NUMBER: _ClassVar[int]
    BANNED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    round: int
    param_hash: str
    resync: bool
    banned: bool
    reason: str
    finished: bool
    def __init__(self, round: _Optional[int] = ..., param_hash: _Optional[str] = ..., resync: _Optional[bool] = ..., banned: _Optional[bool] = ..., reason: _Optional[str] = ..., finished: _Optional[bool] = ...) -> None: ...

class CommitRequest(_message.Message):
    __slots__ = ("header", "endpoint")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    header: Signed
    endpoint: str
    def __init__(self, header: _Optional[_Union[Signed, _Mapping]] = ..., endpoint: _Optional[str] = ...) -> None: ...

class CommitReply(_message.Message):
    __slots__ = ("accepted", "reason", "current_round")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CURRENT_ROUND_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    reason: str
    current_round: int
    def __init__(self, accepted: _Optional[bool] = ..., reason: _Optional[str] = ..., current_round: _Optional[int] = ...) -> None: ...

class ManifestRequest(_message.Message):
    __slots__ = ("round", "wait_s")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    round: int
    wait_s: float
    def __init__(self, round: _Optional[int] = ..., wait_s: _Optional[float] = ...) -> None: ...

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
    __slots__ = ("data", "offset", "total_size", "sha256", "round")
    DATA_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    offset: int
    total_size: int
    sha256: str
    round: int
    def __init__(self, data: _Optional[bytes] = ..., offset: _Optional[int] = ..., total_size: _Optional[int] = ..., sha256: _Optional[str] = ..., round: _Optional[int] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("json",)
    JSON_FIELD_NUMBER: _ClassVar[int]
    json: str
    def __init__(self, json: _Optional[str] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("sha256", "offset")
    SHA256_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    sha256: str
    offset: int
    def __init__(self, sha256: _Optional[str] = ..., offset: _Optional[int] = ...) -> None: ...

class PushChunk(_message.Message):
    __slots__ = ("header", "data")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    header: Signed
    data: bytes
    def __init__(self, header: _Optional[_Union[Signed, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class PushReply(_message.Message):
    __slots__ = ("accepted", "reason", "sha256")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    reason: str
    sha256: str
    def __init__(self, accepted: _Optional[bool] = ..., reason: _Optional[str] = ..., sha256: _Optional[str] = ...) -> None: ...
