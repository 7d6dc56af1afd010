"""Heterogeneous speeds in `swarmloco simulate` (`--peer-speeds 1,1,0.5,0.25`): how many inner
steps each virtual peer takes in a round, in simulated time, and what the round's weights are,
with the swarm's math (peer/run/work_math.py).

Simulated time: a peer of speed s takes 1/s seconds per inner step (a speed-1 peer, one second).
- fixed H (rounds.window_s = 0): every peer takes inner.steps; the round lasts as long as the
  slowest peer's phase, and the others wait;
- a compute window (rounds.window_s = W): a peer trains until its phase has lasted W seconds
  (the node checks after each step), at least rounds.min_steps and at most rounds.max_steps
  steps: ceil(W x s) clamped. The round lasts as long as the longest phase.
The exchange's own time is not modelled (it is the same in both schedules). A peer's utilization
is its phase's seconds over the round's.

A peer may claim more work than it did (SimulationOptions.claim_work: the attackers sign X times
their real steps and tokens, as tests/byzantine_peer.py --claim-work does in a real swarm): the
owners and the coordinator's ledger see the claims, the token share counts what was trained.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from peer.run.config import RunConfig
from peer.run.work_math import RowWork, WorkLedger, rows_per_work


def parse_speeds(text: str) -> tuple[float, ...]:
    """'1,1,0.5,0.25' -> (1.0, 1.0, 0.5, 0.25); ValueError saying what is wrong."""
    try:
        speeds = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"--peer-speeds {text!r}: give one number per peer, comma-separated, e.g. 1,1,0.5,0.25") from None
    return speeds


def check_speeds(speeds: tuple[float, ...], peers: int) -> None:
    if len(speeds) != peers:
        raise ValueError(f"--peer-speeds gives {len(speeds)} speeds for --peers {peers}: give one per peer")
    if not all(math.isfinite(s) and s > 0 for s in speeds):
        raise ValueError(f"--peer-speeds {','.join(map(str, speeds))}: every speed must be a positive number (1 = a full-speed peer)")


def round_steps(cfg: RunConfig, speeds: tuple[float, ...]) -> list[int]:
    """Inner steps each peer takes in one round."""
    r = cfg.rounds
    if not r.window_s:
        return [cfg.inner.steps] * len(speeds)
    return [min(r.max_steps, max(r.min_steps, math.ceil(r.window_s * s - 1e-9))) for s in speeds]


@dataclass
class SpeedModel:
    """The simulated clock and the work ledger of one simulation."""

    cfg: RunConfig
    speeds: tuple[float, ...]
    ledger: WorkLedger
    claim_factors: tuple[float, ...] = ()  # per peer: the work it signs over the work it did (() = all 1)
    rounds: list[dict[str, Any]] = field(default_factory=list)  # per round: steps, busy/round seconds, weights

    @classmethod
    def of(cls, cfg: RunConfig, speeds: tuple[float, ...] | None, peers: int, receiver: Any,
           claim_factors: tuple[float, ...] = ()) -> "SpeedModel":
        return cls(cfg, speeds or (1.0,) * peers, WorkLedger(receiver), claim_factors)

    def claimed_steps(self, i: int, steps: int) -> int:
        """The inner steps peer i's header signs for `steps` really taken."""
        factor = self.claim_factors[i] if i < len(self.claim_factors) else 1.0
        return steps if factor == 1.0 else round(steps * factor)

    def steps(self) -> list[int]:
        return round_steps(self.cfg, self.speeds)

    def rule_view(self, steps: list[int], rule_name: str) -> tuple[list[int], list[int]] | None:
        """(real, claimed) steps of every peer where the rule sees rows per unit of claimed work
        (peer/run/work_math.py: a window run, a rule that compares values, claims that differ),
        else None."""
        claimed = [self.claimed_steps(i, n) for i, n in enumerate(steps)]
        if not rows_per_work(self.cfg, rule_name) or len(set(claimed)) <= 1:
            return None
        return list(steps), claimed

    def work(self, authors: list[int], steps: list[int]) -> tuple[RowWork, dict[str, int]]:
        """The rows' claims (authors: the peers whose updates are aggregated, in row order) and
        the history the coordinator would sign into the manifest."""
        names = [str(i) for i in authors]
        history = self.ledger.history(names)
        return RowWork.of([self.claimed_steps(i, steps[i]) * self.tokens_per_step for i in authors], history, names), history

    @property
    def tokens_per_step(self) -> int:
        return self.cfg.data.batch_size * self.cfg.model.seq_len

    def close(self, authors: list[int], steps: list[int], history: dict[str, int], excluded_for_cause: int) -> dict[str, Any]:
        claims = {str(i): self.claimed_steps(i, steps[i]) for i in authors}
        shares = self.ledger.close({p: (n, n * self.tokens_per_step) for p, n in claims.items()}, history, excluded_for_cause)
        busy = [n / s for n, s in zip(steps, self.speeds)]
        seconds = max(busy)
        record = {"steps": steps, "busy_s": busy, "round_s": seconds, "utilization": [b / seconds for b in busy],
                  "weights": [shares[str(i)]["weight"] if str(i) in shares else 0.0 for i in range(len(steps))]}
        self.rounds.append(record)
        return record

    def summary(self) -> dict[str, Any]:
        """What the JSON keeps: the speeds, every round, and over the run each peer's share of the
        tokens trained, of the counted weight and of the compute offered (its speed's share)."""
        n = len(self.speeds)
        tokens = [sum(r["steps"][i] for r in self.rounds) for i in range(n)]
        weight = [sum(r["weights"][i] for r in self.rounds) for i in range(n)]
        return {
            "peer_speeds": list(self.speeds),
            "simulated_seconds": sum(r["round_s"] for r in self.rounds),
            "utilization": [sum(r["busy_s"][i] for r in self.rounds) / sum(r["round_s"] for r in self.rounds) for i in range(n)],
            "compute_share": [s / sum(self.speeds) for s in self.speeds],
            "token_share": [t / sum(tokens) for t in tokens],
            "counted_share": [w / sum(weight) for w in weight],
            "rounds": self.rounds,
        }
