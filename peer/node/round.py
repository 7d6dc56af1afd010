"""One round as a peer lives it: what it carries between its phases.

A round is opened when its inner phase starts (θ_r, the clock, the byte counters), gains its
update once trained, and ends in exactly one RoundOutcome (peer/exchange/outcome.py).
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch

from protocol.accounting import Traffic


@dataclass(slots=True)
class Update:
    """This peer's signed, encoded pseudo-gradient of one round."""

    signed: Any  # swarm_pb2.Signed update header
    payload: bytes
    encode_s: float


@dataclass(slots=True)
class PeerRound:
    """Round r in flight on this peer (synchronous, or overlapped with the next inner phase)."""

    r: int
    base: torch.Tensor  # θ_r, (d,): what the pseudo-gradient is measured from
    started: float  # time.monotonic() when its inner phase began
    before: Traffic  # the byte counters then
    stats: Any = None  # the inner phase's TrainStats
    compute_s: float = 0.0
    window_late_s: float = 0.0  # a window run: how long before this phase began its window opened (the swarm's clock)
    update: Update | None = None
    # overlapped rounds: θ_{r+1} (peer/exchange/outcome.Landing) once this peer computed it, before
    # the round's outcome; None: the exchange mode does not tell (the phase waits for the outcome)
    landing: Future | None = None

    def landed(self, landing: Any) -> None:
        """The exchange's word that θ_{r+1} is computed (the first only: a round restarted after a
        coordinator change computes it again)."""
        if self.landing is not None and not self.landing.done():
            self.landing.set_result(landing)


def round_record(rnd: PeerRound, result: Any, *, traffic: dict[str, int], in_sync: bool, round_s: float,
                 utilization: float) -> dict[str, Any]:
    """One applied round as the peer's history (--summary-json) and progress line keep it."""
    return {
        "round": rnd.r, "updates": result.updates, "excluded": result.excluded, "train_loss": rnd.stats.mean_loss,
        "bytes_sent": traffic["sent"], "bytes_received": traffic["received"],
        "payload_bytes": len(rnd.update.payload), "compute_s": rnd.compute_s, "encode_s": rnd.update.encode_s,
        "wait_s": result.wait_s, "fetch_s": result.fetch_s, "aggregate_s": result.aggregate_s,
        "round_s": round_s, "in_sync": in_sync, "exchange_s": result.exchange_s, "utilization": utilization,
        "slices": result.slices, "timeline": result.timeline, "landed_after_steps": result.landed_after_steps,
        "inner_steps": rnd.stats.steps, "tokens": rnd.stats.tokens, "window_late_s": rnd.window_late_s,
        "next_window_s": result.window_s,  # overlapped: the swarm's window for the next phase (0: none, H steps)
    }
