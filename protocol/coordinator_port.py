"""What a training peer asks of its coordinator: the seam between the node and the wire.

peer/node/coordinator_client.py (CoordinatorClient) is the real one (gRPC, deadlines, retries,
failover); tests/fakes.py has an in-process one that can refuse, fail, delay and cut a transfer
short, so every branch of the node is tested without processes. Calls raise
protocol.rpc_errors.Refused for a refusal and CoordinatorUnavailable when no coordinator of the
run answers (peer/node/coordinator_client.py).
"""

from __future__ import annotations

from typing import Iterable, Protocol

from protocol.wire import swarm_pb2


class CoordinatorPort(Protocol):
    endpoint: str  # where the run's coordinator is now (it changes on failover)
    generation: int  # bumped on every switch to another coordinator: a round in flight restarts there

    def run_info(self, round_: int | None = None, *, state_only: bool = False) -> swarm_pb2.RunInfo: ...

    def join(self, signed: swarm_pb2.Signed) -> swarm_pb2.JoinReply: ...

    def heartbeat(self, signed: swarm_pb2.Signed) -> swarm_pb2.HeartbeatReply: ...

    def push(self, chunks: Iterable[swarm_pb2.PushChunk]) -> swarm_pb2.PushReply: ...

    def submit(self, signed: swarm_pb2.Signed, endpoint: str) -> swarm_pb2.CommitReply: ...

    def manifest(self, round_: int, wait_s: float) -> swarm_pb2.ManifestReply: ...

    def submit_slice_results(self, signed: swarm_pb2.Signed) -> swarm_pb2.CommitReply: ...

    def slice_results(self, round_: int, wait_s: float, *, until_applied: bool = False) -> swarm_pb2.SliceResultsReply: ...

    def report_evidence(self, signed: swarm_pb2.Signed) -> swarm_pb2.CommitReply: ...

    def report_gathered(self, signed: swarm_pb2.Signed) -> swarm_pb2.CommitReply: ...

    def checkpoint(self) -> tuple[bytes, int]: ...

    def close(self) -> None: ...
