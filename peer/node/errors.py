"""Why a training peer stops: PeerExit, raised from any phase, caught by the CLI."""

from __future__ import annotations


class PeerExit(Exception):
    """The peer must stop; the message says why and what to do."""


class NotAdmitted(PeerExit):
    """The coordinator refused to admit this peer (`refusal`: the swarm_pb2.Refusal, e.g. BANNED)."""

    def __init__(self, message: str, refusal: int, reason: str) -> None:
        super().__init__(message)
        self.refusal = refusal
        self.reason = reason


class RunOver(PeerExit):
    """The run finished while this peer could not reach its coordinator (a vouched "finished" record
    in the DHT): there is nothing left to train, and nobody to retry."""
