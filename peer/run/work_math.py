"""Work weights in the round math: what a compute-window run (rounds.window_s) weighs each update
by, computed the same way by the coordinator, every owner and the simulator; and the ledger of
the work accepted round by round (the coordinator's, the simulator's).

A row's claim is the `tokens` its author signed into its update header; the weights are
optim.work_weights.capped_work over the rows a slice (or the round) aggregates, with the round's
f and, as the history cap, the work the coordinator accepted for each author the round before
(signed into the manifest: RoundManifest.work_history). Everything comes from signed bytes every
node holds, so every owner computes bit-identical weights.

The rules that compare rows by value (PER_WORK_RULES) see each row per unit of the work it claims,
rescaled to the round's typical work (optim.work_weights.per_work_scales); the mean weighs the
rows as they are.

With the window off (the default) there are no weights: every rule runs unweighted, bit for bit
as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from optim.work_weights import WorkWeights, capped_work, per_work_scales
from peer.run.config import ConfigError, RunConfig

# The rules optim/aggregate_weighted.py weighs (krum keeps one row and dnc filters by counts;
# the sparse rules and nnm/bucketing mix rows before any weight could apply).
WEIGHTED_RULES = ("mean", "median", "trimmed-mean", "multi-krum", "geometric-median", "centered-clip")
# The weighted rules that compare rows by value (order statistics, distances): they see the rows per
# unit of claimed work. Measured on benchmarks/byzantine_mixed.md: the weighted median on raw rows
# lost +22.8% to two fast attackers (its middle pulled down to the slow peers' scale).
PER_WORK_RULES = ("median", "trimmed-mean", "multi-krum", "geometric-median", "centered-clip")


@dataclass(frozen=True, slots=True)
class RowWork:
    """What the rows of one aggregation claim, in row order."""

    claims: tuple[int, ...]  # tokens each row's signed header claims
    previous: tuple[float | None, ...]  # the work accepted for each row's author last round (None: unknown)

    @classmethod
    def of(cls, claims: Sequence[int], history: Mapping[str, float], authors: Sequence[str]) -> "RowWork":
        return cls(tuple(claims), tuple(history.get(p) for p in authors))

    def subset(self, rows: Sequence[int]) -> "RowWork":
        return RowWork(tuple(self.claims[i] for i in rows), tuple(self.previous[i] for i in rows))


def weighted(cfg: RunConfig) -> bool:
    """Whether this run weighs updates by work: a compute window is set, or the coordinator sizes
    the overlapped phases (aligned_overlap)."""
    return cfg.rounds.window_s > 0 or aligned_overlap(cfg)


def can_weigh(cfg: RunConfig) -> bool:
    """Whether this run's exchange and rule can weigh updates by work (check_weighted_rule's test)."""
    return cfg.exchange.mode == "sliced" and _rule_takes_weights(cfg.aggregation.name, cfg.aggregation.options)


def _rule_takes_weights(rule_name: str, options: Mapping[str, Any]) -> bool:
    """optim/aggregate_weighted.py weighs the rule, and no pre-aggregation mixes rows before it."""
    return rule_name in WEIGHTED_RULES and not options.get("nnm") and options.get("bucket_size") is None


def aligned_overlap(cfg: RunConfig) -> bool:
    """Overlapped rounds on the swarm's clock with no window set (rounds.overlap_window, the
    default): the coordinator signs each phase's window into the manifest; a fixed H where the run
    cannot weigh work."""
    r = cfg.rounds
    return r.overlap_communication and r.overlap_window and r.window_s == 0 and can_weigh(cfg)


def check_weighted_rule(cfg: RunConfig, rule_name: str) -> None:
    """A window run whose rule cannot weigh rows is refused at start, saying what to change."""
    if not weighted(cfg):
        return
    if cfg.exchange.mode != "sliced":
        raise ConfigError(f"rounds.window_s={cfg.rounds.window_s} weighs updates by work in the sliced exchange's owners; "
                          f"exchange.mode = {cfg.exchange.mode!r} does not pass the claims to its rule yet: set "
                          "exchange.mode = \"sliced\" or rounds.window_s = 0")
    if not _rule_takes_weights(rule_name, cfg.aggregation.options):
        what = rule_name if rule_name not in WEIGHTED_RULES else f"{rule_name} with nnm or bucketing"
        raise ConfigError(
            f"rounds.window_s={cfg.rounds.window_s} weighs each update by the work it did, and aggregation {what} "
            f"does not take weights: use one of {', '.join(WEIGHTED_RULES)} (without nnm/bucket_size), or set "
            "rounds.window_s = 0 (fixed inner.steps, equal weights)"
        )


def claim_bounds(cfg: RunConfig) -> tuple[int, int]:
    """(most inner steps a header may claim, tokens in one step) for this run."""
    most = cfg.rounds.max_steps if weighted(cfg) else cfg.inner.steps
    return most, cfg.data.batch_size * cfg.model.seq_len


def _shares(cfg: RunConfig, work: RowWork | None, num_byzantine: int) -> WorkWeights | None:
    if not weighted(cfg) or work is None or not work.claims:
        return None
    shares = capped(work, num_byzantine)
    return shares if any(w > 0 for w in shares.weights) else None


def row_weights(cfg: RunConfig, work: RowWork | None, num_byzantine: int) -> list[float] | None:
    """The weights of one aggregation's rows, or None (unweighted): no window, no claims, or no
    row carrying work (then every row counts the same)."""
    shares = _shares(cfg, work, num_byzantine)
    return None if shares is None else list(shares.weights)


def rows_per_work(cfg: RunConfig, rule_name: str) -> bool:
    """Whether this run's rule sees the rows per unit of claimed work."""
    return weighted(cfg) and rule_name in PER_WORK_RULES


def weighted_rows(cfg: RunConfig, work: RowWork | None, num_byzantine: int, rows: torch.Tensor,
                  rule_name: str) -> tuple[torch.Tensor, list[float] | None]:
    """(n, s) rows as rule `rule_name` sees them, and their weights (None: unweighted). Rescaled
    (float64 factors, float32 rows: the same bits on every owner) only for PER_WORK_RULES and only
    when the rows' claims differ; otherwise the rows themselves."""
    shares = _shares(cfg, work, num_byzantine)
    if shares is None:
        return rows, None
    scales = per_work_scales(shares) if rule_name in PER_WORK_RULES else None
    if scales is not None:
        rows = (rows.double() * torch.tensor(scales, dtype=torch.float64).unsqueeze(1)).float()  # (n, s)
    return rows, list(shares.weights)


def capped(work: RowWork, num_byzantine: int) -> WorkWeights:
    """capped_work over the rows, f lowered where fewer than f + 1 rows carry work (a round of
    one or two peers still closes; the rule's own f is lowered the same way by effective_byzantine)."""
    carrying = sum(1 for c in work.claims if c > 0)
    return capped_work(list(work.claims), num_byzantine=min(num_byzantine, max(0, carrying - 1)),
                       previous=list(work.previous))


class WorkLedger:
    """The work each peer did, as the coordinator (or the simulator) accepts it round by round.

    At each manifest it reads the listed updates' claims (inner steps, tokens), caps them over the
    whole round as the owners will, signs the work it accepted for each listed author the round
    before into the manifest (the owners' history cap) and keeps this round's for the next. status
    shows each peer's steps, tokens, weight (its share of the round's capped work) and what capped
    it. A coordinator that restarts or takes over starts with no history: its first manifest
    carries none, and the owners cap by the round's median alone."""

    def __init__(self, math: Any) -> None:  # a RoundMath (its cfg and rule_for)
        self.math = math
        self.accepted: dict[str, int] = {}  # peer_id -> tokens accepted in the last closed round

    def history(self, authors: list[str]) -> dict[str, int]:
        """What the manifest signs as the history cap: last round's accepted work of each listed author."""
        if not weighted(self.math.cfg):
            return {}
        return {p: self.accepted[p] for p in authors if p in self.accepted}

    def close(self, claims: dict[str, tuple[int, int]], history: dict[str, int], excluded_for_cause: int) -> dict[str, dict[str, Any]]:
        """The round's manifest is signed over the updates whose headers claim `claims` (peer_id ->
        (inner_steps, tokens)): each author's work and weight as status shows them; remembers what
        was accepted."""
        authors = list(claims)
        if not authors:
            return {}
        work = RowWork.of([claims[p][1] for p in authors], history, authors)
        if weighted(self.math.cfg):
            _, f = self.math.rule_for(len(authors), excluded_for_cause)
            shares = capped(work, f)
            weights, reasons = list(shares.weights), list(shares.capped_by)
        else:  # fixed H: every update counts the same
            weights, reasons = [1.0] * len(authors), [""] * len(authors)
        total = sum(weights) or 1.0
        self.accepted = {p: int(w) for p, w in zip(authors, weights)}
        return {p: {"inner_steps": claims[p][0], "tokens": claims[p][1], "weight": round(w / total, 6),
                    "capped_by": why} for p, w, why in zip(authors, weights, reasons)}
