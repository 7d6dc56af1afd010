"""An in-process fake coordinator (protocol.coordinator_port.CoordinatorPort) for node unit tests.

It answers like a real one from a little scripted state (the open round, the signed manifests it
has published, whether the run finished), and can be told to misbehave at a given call:

  refuse(method, refusal)       the call raises Refused (what a typed refusal looks like to the node)
  fail(method, exc)             the call raises exc (CoordinatorUnavailable, an injected fault, ...)
  delay(method, seconds)        the call sleeps first (a slow coordinator)
  cut_push(after_chunks)        a client-mode push breaks after that many chunks (a cut transfer)
  on_call(hook)                 hook(method, count) runs before every call: publish a manifest at
                                the second poll, switch coordinators (failover) mid-round, ...

Every call is recorded in `calls` as (method, round or None), so a test asserts what the node did.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from typing import Callable, Iterable

import grpc

from protocol.envelope import ManifestEntry, RoundManifest, sign_manifest, signed_to_json
from protocol.identity import Identity
from protocol.rpc_errors import Refused
from protocol.wire import swarm_pb2


class CutTransfer(grpc.RpcError):
    """A stream that broke mid-way (what grpc raises when the connection drops)."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "injected: the transfer was cut short"


class FakeCoordinator:
    def __init__(self, *, run_id: str = "fake-run", identity: Identity | None = None, round_: int = 0) -> None:
        self.run_id = run_id
        self.identity = identity or Identity.generate()  # signs the manifests
        self.endpoint = "fake-coordinator:1"
        self.generation = 0
        self.round = round_
        self.finished = False
        self.manifests: dict[int, swarm_pb2.Signed] = {}
        self.commitments: dict[int, list[swarm_pb2.Signed]] = defaultdict(list)
        self.pushed: list[bytes] = []
        self.joins = 0
        self.heartbeats: list[swarm_pb2.Signed] = []
        self.banned_reason = ""  # heartbeat replies say banned with this reason when set
        self.unreachable = ""  # heartbeat replies carry this advice when set (nobody could fetch the peer's update)
        self.calls: list[tuple[str, int | None]] = []
        self.counts: Counter[str] = Counter()
        self._faults: dict[str, list[BaseException]] = defaultdict(list)  # raised by the next calls, in order
        self._delays: dict[str, float] = {}
        self._cut_after: int | None = None
        self._hooks: list[Callable[[str, int], None]] = []
        self._lock = threading.Lock()

    # --- scripting ---------------------------------------------------------------------------

    def refuse(self, method: str, refusal: int, reason: str = "refused by the fake", *, times: int = 1) -> None:
        for _ in range(times):
            self._faults[method].append(Refused(refusal, reason, current_round=self.round))

    def fail(self, method: str, exc: BaseException, *, times: int = 1) -> None:
        self._faults[method].extend([exc] * times)

    def delay(self, method: str, seconds: float) -> None:
        self._delays[method] = seconds

    def cut_push(self, after_chunks: int) -> None:
        self._cut_after = after_chunks

    def on_call(self, hook: Callable[[str, int], None]) -> None:
        self._hooks.append(hook)

    def publish_manifest(self, r: int, entries: Iterable[ManifestEntry] = (), *, excluded: dict[str, str] | None = None,
                         base_param_hash: str = "0" * 64) -> swarm_pb2.Signed:
        manifest = RoundManifest(run_id=self.run_id, round=r, base_param_hash=base_param_hash, entries=list(entries),
                                 excluded=dict(excluded or {}))
        signed = self.manifests[r] = sign_manifest(self.identity, manifest)
        return signed

    def entry_for(self, signed_header: swarm_pb2.Signed, header) -> ManifestEntry:
        """The manifest entry a real coordinator writes for a committed header."""
        return ManifestEntry(peer_id=header.peer_id, payload_sha256=header.payload_sha256, payload_size=header.payload_size,
                             header=signed_to_json(signed_header), holders=[], serves=False)

    def fail_over(self, endpoint: str = "fake-standby:2") -> None:
        """What CoordinatorClient does when a standby took the run over: a new endpoint and generation."""
        self.endpoint, self.generation = endpoint, self.generation + 1

    # --- the port ------------------------------------------------------------------------------

    def _enter(self, method: str, round_: int | None = None) -> None:
        with self._lock:
            self.counts[method] += 1
            count = self.counts[method]
            self.calls.append((method, round_))
            fault = self._faults[method].pop(0) if self._faults[method] else None
        for hook in list(self._hooks):
            hook(method, count)
        if method in self._delays:
            time.sleep(self._delays[method])
        if fault is not None:
            raise fault

    def run_info(self, round_: int | None = None, *, state_only: bool = False) -> swarm_pb2.RunInfo:
        self._enter("run_info", round_)
        return swarm_pb2.RunInfo()

    def join(self, signed: swarm_pb2.Signed) -> swarm_pb2.JoinReply:
        self._enter("join")
        self.joins += 1
        return swarm_pb2.JoinReply(accepted=True, round=self.round)

    def heartbeat(self, signed: swarm_pb2.Signed) -> swarm_pb2.HeartbeatReply:
        self._enter("heartbeat")
        self.heartbeats.append(signed)
        return swarm_pb2.HeartbeatReply(round=self.round, finished=self.finished, banned=bool(self.banned_reason),
                                        reason=self.banned_reason, unreachable=self.unreachable)

    def push(self, chunks: Iterable[swarm_pb2.PushChunk]) -> swarm_pb2.PushReply:
        self._enter("push")
        data = b""
        for i, chunk in enumerate(chunks):
            if self._cut_after is not None and i >= self._cut_after:
                self._cut_after = None
                raise CutTransfer()
            data += chunk.data
        self.pushed.append(data)
        return swarm_pb2.PushReply(accepted=True)

    def submit(self, signed: swarm_pb2.Signed, endpoint: str) -> swarm_pb2.CommitReply:
        self._enter("submit", self.round)
        self.commitments[self.round].append(signed)
        return swarm_pb2.CommitReply(accepted=True, current_round=self.round)

    def manifest(self, round_: int, wait_s: float) -> swarm_pb2.ManifestReply:
        self._enter("manifest", round_)
        manifest = self.manifests.get(round_)
        return swarm_pb2.ManifestReply(ready=manifest is not None, manifest=manifest, current_round=self.round,
                                       finished=self.finished)

    def submit_slice_results(self, signed: swarm_pb2.Signed) -> swarm_pb2.CommitReply:
        self._enter("submit_slice_results")
        return swarm_pb2.CommitReply(accepted=True, current_round=self.round)

    def slice_results(self, round_: int, wait_s: float, *, until_applied: bool = False) -> swarm_pb2.SliceResultsReply:
        self._enter("slice_results", round_)
        return swarm_pb2.SliceResultsReply(ready=False, current_round=self.round, finished=self.finished)

    def report_evidence(self, signed: swarm_pb2.Signed) -> swarm_pb2.CommitReply:
        self._enter("report_evidence")
        return swarm_pb2.CommitReply(accepted=True, current_round=self.round)

    def report_gathered(self, signed: swarm_pb2.Signed) -> swarm_pb2.CommitReply:
        self._enter("report_gathered")
        return swarm_pb2.CommitReply(accepted=True, current_round=self.round)

    def checkpoint(self) -> tuple[bytes, int]:
        self._enter("checkpoint")
        raise NotImplementedError("the fake coordinator serves no checkpoint")

    def close(self) -> None:
        self._enter("close")
