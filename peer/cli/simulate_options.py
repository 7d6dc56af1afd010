"""What `swarmloco simulate` runs: its own options (peers, attackers, baseline, threads, overlap
schedule) over a run config, validated before anything trains."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from optim import aggregate, attacks
from peer.cli.run_flags import resolve_run_config
from peer.cli.simulate_slices import LYING_OWNER
from peer.cli.simulate_speeds import check_speeds
from peer.run.config import RunConfig

Baseline = Literal["diloco", "ddp"]
ATTACK_NAMES = (*attacks.NAMES, LYING_OWNER)


@dataclass(kw_only=True)
class SimulationOptions:
    """What to simulate: simulate's own options and the run config.

    The CLI passes `config` as loaded from its run-config flags (peer/cli/run_flags.py, the same
    loader every verb uses). Scripts may name overrides here instead (None keeps the config's
    value); run_config() applies them through that loader.
    """

    peers: int = 4
    rounds: int | None = None  # None: config.rounds.rounds
    inner_steps: int | None = None  # H; None: config.inner.steps
    codec: str | None = None  # e.g. "topk:0.01+int8"; None: config.compression.codec
    outer: str | None = None  # nesterov | demo | fedavg; None: config.outer.name
    aggregator: str | None = None  # None: config.aggregation.name
    seed: int | None = None  # None: config.seed (model init, shards' sampling streams, codec seeds)
    # The first `byzantine` peers attack; the aggregator tolerates as many unless the config says more.
    byzantine: int = 0
    attack: str | None = None
    attack_options: dict[str, Any] = field(default_factory=dict)
    # The attackers sign this many times the work they did into their headers (a compute window's
    # weights; 1: honest claims). Capped as the owners cap every claim (optim/work_weights.py).
    claim_work: float = 1.0
    baseline: Baseline = "diloco"
    # torch intra-op threads. 1 by default: the model's 128-wide matmuls gain ~25% from a second
    # thread on an idle machine, but with any other process on the cores OpenMP's spinning threads
    # slowed an 8-round run from 47 s to over 10 minutes here. None: leave torch's setting.
    threads: int | None = 1
    # Overlapped rounds (--overlap): the share of the next phase's inner steps done before the
    # average in flight lands and the peer moves onto θ_{r+1} (peer/node/overlap.py does so after
    # the inner step during which its exchange finished). 1.0: at the phase's end, the worst case,
    # an exchange as long as a whole phase; 0.5: an exchange half as long as the phase.
    overlap_arrival: float = 1.0
    # Each virtual peer's speed (1 = full speed; peer/cli/simulate_speeds.py): None, all 1.
    peer_speeds: tuple[float, ...] | None = None
    config: RunConfig = field(default_factory=RunConfig)
    log: Callable[[str], None] | None = None  # receives one dense line per round

    def __post_init__(self) -> None:
        if self.peers < 1:
            raise ValueError(f"--peers {self.peers}: simulate at least 1 peer")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"--threads {self.threads}: use at least 1 thread")
        if not 0 <= self.overlap_arrival <= 1:
            raise ValueError(f"--overlap-arrival {self.overlap_arrival}: use a share of the phase in [0, 1] (1: at its end)")
        if self.baseline not in ("diloco", "ddp"):
            raise ValueError(f"--baseline {self.baseline!r}: choose diloco or ddp")
        if not 0 <= self.byzantine < self.peers:
            raise ValueError(
                f"--num-byzantine {self.byzantine} attackers with --peers {self.peers}: need 0 <= attackers < peers "
                "(at least one honest peer must remain)"
            )
        if self.byzantine > 0 and self.attack is None:
            raise ValueError(f"{self.byzantine} Byzantine peers need --attack NAME; valid names: {', '.join(ATTACK_NAMES)}")
        if self.attack is not None and self.byzantine == 0:
            raise ValueError(f"--attack {self.attack} needs --num-byzantine F (the first F peers attack), F >= 1")
        if self.baseline == "ddp" and self.byzantine:
            raise ValueError("--baseline ddp has no aggregation to attack; drop --attack")
        if self.attack == LYING_OWNER and self.attack_options:
            raise ValueError(f"--attack {LYING_OWNER} takes no options (each liar shifts its honest result by 0.01)")
        if self.attack is not None and self.attack != LYING_OWNER:
            attacks.build(self.attack, **self.attack_options)  # unknown name/option -> ValueError here
        if self.peer_speeds is not None:
            check_speeds(tuple(self.peer_speeds), self.peers)
        if not (math.isfinite(self.claim_work) and self.claim_work > 0):
            raise ValueError(f"--claim-work {self.claim_work!r}: give how many times their real work the attackers claim, a number > 0")
        if self.claim_work != 1.0 and self.byzantine == 0:
            raise ValueError(f"--claim-work {self.claim_work} inflates the attackers' claims: give --attack and --num-byzantine F too")

    def run_config(self) -> RunConfig:
        """The run config with this simulation's overrides applied, validated like every verb's."""
        named = {
            "rounds.rounds": self.rounds, "inner.steps": self.inner_steps, "compression.codec": self.codec,
            "outer.name": self.outer, "aggregation.name": self.aggregator, "seed": self.seed,
        }
        overrides = {path: value for path, value in named.items() if value is not None}
        # Lying owners send honest updates: the rule has nothing of theirs to tolerate.
        if self.byzantine and not self.config.aggregation.num_byzantine and self.attack != LYING_OWNER:
            overrides["aggregation.num_byzantine"] = self.byzantine
        cfg = resolve_run_config(self.config, overrides)
        if self.attack == LYING_OWNER and cfg.exchange.mode != "sliced":
            raise ValueError(
                f"--attack {LYING_OWNER} lies as a slice owner, which only the sliced exchange has; "
                f"this run config has exchange.mode = {cfg.exchange.mode!r}: set it to \"sliced\""
            )
        if cfg.rounds.window_s and (cfg.exchange.support or self.attack == LYING_OWNER or self.baseline == "ddp"):
            raise ValueError("a compute window (--window-s) weighs the swarm's own aggregate by work; the agreed support, "
                             "lying owners and --baseline ddp do not take weights: drop one or the other")
        if cfg.exchange.support and self.attack == LYING_OWNER:
            raise ValueError(f"--attack {LYING_OWNER} runs the real sliced engine, which has no shared support; "
                             "drop exchange.support or choose another attack")
        f = cfg.aggregation.num_byzantine
        need = aggregate.minimum_rows(cfg.aggregation.name, f)
        if self.baseline == "diloco" and self.peers < need:
            raise ValueError(
                f"--aggregator {cfg.aggregation.name} tolerating {f} Byzantine peer(s) needs at least {need} "
                f"peers, got --peers {self.peers}: add peers or lower --num-byzantine"
            )
        return cfg
