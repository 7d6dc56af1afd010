"""How one round ends on a peer: exactly one `RoundOutcome`, handled by PeerNode.finish_round in
one `match`.

  Applied      θ_{r+1} computed (then checked against the coordinator's signed hash)
  Resync       cannot follow this round identically: download the swarm's state instead
  Finished     the run did all its rounds
  Unreachable  no coordinator of the run answered: the peer gives up (resume later)
  Fatal        the peer must stop (banned, a coordinator signing with a key not the run's)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from protocol.wire import swarm_pb2


@dataclass(slots=True)
class Applied:
    params: torch.Tensor  # θ_{r+1}, (d,)
    updates: int = 0
    excluded: dict[str, str] = field(default_factory=dict)
    wait_s: float = 0.0  # idle: waiting for the manifest (overlapped: for the background exchange)
    exchange_s: float = 0.0  # overlapped: time the background exchange took beside training
    landed_after_steps: int | None = None  # overlapped: inner steps of the next phase run before it finished
    fetch_s: float = 0.0
    aggregate_s: float = 0.0
    slices: dict[str, int] = field(default_factory=dict)  # sliced exchange: owned, recomputed, spot-checked, liars
    # sliced exchange: when each step of the exchange ended, wall clock (time.time(), comparable
    # across the processes of one machine: scripts/wan_emulation.py lines peers up with it)
    timeline: dict[str, float] = field(default_factory=dict)
    # the coordinator's signed state at the start of round r + 1 when the exchange's last reply
    # carried it (sliced: the applied long-poll): the node checks θ_{r+1} against it without asking
    run_state: swarm_pb2.Signed | None = None
    # overlapped rounds on the swarm's clock: the window of the next phase the manifest carried
    # (RoundManifest.window_ms, in seconds; 0: none, the phase takes H steps)
    window_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Landing:
    """θ_{r+1} as this peer computed it, before the coordinator confirmed the round (overlapped
    rounds move the next phase onto it at once; the round's one outcome still follows)."""

    params: torch.Tensor  # θ_{r+1}, (d,)
    manifest_at: float | None  # when round r's manifest came in (time.time()), as Applied.timeline["manifest"]
    window_s: float = 0.0  # as Applied.window_s


@dataclass(frozen=True, slots=True)
class Resync:
    why: str
    wait_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Finished:
    wait_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Unreachable:
    why: str


@dataclass(frozen=True, slots=True)
class Fatal:
    why: str


RoundOutcome = Applied | Resync | Finished | Unreachable | Fatal
