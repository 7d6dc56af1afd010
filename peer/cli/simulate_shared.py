"""`swarmloco simulate` with exchange.support = "shared:MIX": one round of the shared-support exchange.

The prototype of docs/robust-compressed.md (optim/shared_support.py has the math). Per round r:

    support_r = round_support(public score, plan, codec_seed(r))          every node, no message
    peer i:    e_i <- decay·e_i + Δ_i ; sends e_i[support_r] (values only) ; e_i keeps the rest
    owners:    rows (n, m) aligned -> the run's rule (median / trimmed-mean) per coordinate -> (m,)
               -> result values (exchange.result_codec's value format, fp16 by default)
    all:       applied (d,) = the result on support_r, 0 elsewhere; outer step; score update

The rule is coordinate-wise, so running it slice by slice (as the sliced exchange's owners would)
gives the same bits as running it on the whole support at once: one call stands for every owner.
Bytes are the real lengths of the payloads (slice by slice, each slice's values with its own
codec header) and of the results, counted through the sliced exchange's expected traffic
(peer/run/slice_plan.py), as simulate counts the default exchange.
"""

from __future__ import annotations

from typing import Any

import torch

from optim import codecs, shared_support
from optim.shared_support import PublicScore, SupportPlan, SupportValues
from peer.run.config import RunConfig
from peer.run.round_math import RoundMath, UpdateRejected, codec_seed, single_thread
from optim.sparsify import ChunkTopK
from peer.run.slice_plan import expected_traffic
from protocol.reasons import Reason


# Prototype settings applied over a recipe (the scripts' --variant): not recipes, because the swarm
# cannot run them yet (RoundMath refuses exchange.support). "vote": the two-phase vote on top-128
# index sets, values aligned on the 128 most-voted per chunk of 4096, trimmed-mean, a 2-bit result.
VARIANTS: dict[str, dict[str, Any]] = {
    "vote": {"compression.codec": "chunk-topk:4096:128+stat2", "exchange.support": "vote",
             "aggregation.name": "trimmed-mean", "exchange.result_codec": "stat2"},
}


def variant_overrides(name: str) -> dict[str, Any]:
    """The RunConfig overrides of prototype `name` ('' = none); ValueError naming the known ones."""
    if not name:
        return {}
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}: choose one of {', '.join(VARIANTS)}")
    return dict(VARIANTS[name])


class SharedSupportRound:
    """The senders' error feedback, the public score and the receiver side of the shared support.
    `math` is the receiver's RoundMath (its rule, f and outer step); senders are virtual peer indices."""

    def __init__(self, cfg: RunConfig, math: RoundMath, peers: int) -> None:
        self.cfg = cfg
        self.math = math
        self.plan: SupportPlan = shared_support.parse(cfg.exchange.support, cfg.compression.codec, cfg.exchange.result_codec,
                                                     cfg.aggregation.num_byzantine)
        self.payload_codec = SupportValues(self.plan.values)
        self.result_codec = SupportValues(self.plan.result)
        self.score = PublicScore(math.numel, self.plan.decay)
        decay = cfg.compression.error_feedback_decay
        self.senders = [codecs.ErrorFeedback(self.payload_codec, math.numel, decay=decay, keep_sent=True) for _ in range(peers)]
        self.support = torch.empty(0, dtype=torch.int64)
        self.result_bytes = 0
        self.index_bytes: list[int] = []  # vote: each peer's committed index set, this round
        self.support_bytes = 0  # vote: the support every peer gathers, this round
        self._indices = ChunkTopK(self.plan.chunk, self.plan.k)

    def begin(self, round_: int, pseudo_gradients: list[torch.Tensor]) -> torch.Tensor:
        """Fix round `round_`'s support (from the public score and the round's seed, or by the vote
        on the index sets the peers would send for these pseudo-gradients); -> (m,) indices."""
        seed = codec_seed(self.cfg, round_)
        if self.plan.votes:
            votes = torch.zeros(self.math.numel, dtype=torch.int32)
            self.index_bytes = []
            for sender, delta in zip(self.senders, pseudo_gradients):
                corrected = sender.residual * sender.decay + delta.detach().float()  # what its encode will see
                votes += shared_support.proposals(corrected, self.plan)
                self.index_bytes.append(len(self._indices.encode(corrected, 0)[0]))  # its index part, Rice-coded
            self.support = shared_support.support_by_votes(votes, self.plan, seed)
            marked = torch.zeros(self.math.numel)
            marked[self.support] = 1.0
            self.support_bytes = len(self._indices.encode(marked, 0)[0])
        else:
            self.support = shared_support.round_support(self.score.score, self.plan, seed)
        bounds = shared_support.slice_bounds(self.support, self.math.layout.bounds)
        self.payload_codec.set_round(self.support, bounds)
        self.result_codec.set_round(self.support, bounds)
        return self.support

    def encode(self, peer: int, pseudo_gradient: torch.Tensor) -> bytes:
        """Peer `peer`'s payload: its error-feedback-corrected values on the support."""
        return self.senders[peer].encode(pseudo_gradient.detach().float().contiguous())

    def decode(self, payload: bytes) -> torch.Tensor:
        """-> (m,) float32 values; UpdateRejected (as the manifest would exclude it) otherwise."""
        try:
            values = self.payload_codec.decode_values(payload)
        except codecs.CodecError as exc:
            raise UpdateRejected(Reason.UNDECODABLE, f"payload does not decode: {exc}") from None
        if not bool(torch.isfinite(values).all()):
            raise UpdateRejected(Reason.NON_FINITE, "decoded update holds NaN or Inf values")
        return values

    def aggregate(self, rows: list[torch.Tensor], round_: int, excluded_for_cause: int) -> torch.Tensor:
        """(n of (m,)) aligned values -> the (d,) aggregate every peer applies (0 off the support)."""
        d = self.math.numel
        if not rows:
            self.result_bytes = 0
            return torch.zeros(d)
        rule, f = self.math.rule_for(len(rows), excluded_for_cause)
        with single_thread():
            on_support = rule.aggregate_part(torch.stack(rows), seed=self.math.seed(round_), num_byzantine=f, report=False)
        result = self.result_codec.encode(self._dense(on_support))
        self.result_bytes = len(result)
        return self._dense(self.result_codec.decode_values(result))

    def finish(self, applied: torch.Tensor) -> None:
        """After the outer step: each sender keeps what was not applied, the public score moves."""
        for sender in self.senders:
            sender.restore_unapplied(applied)
        self.score.update(applied)

    def traffic(self, sizes: list[int]) -> tuple[list[int], list[int]]:
        """Expected bytes each peer sends and receives in the sliced exchange for these payloads."""
        x, n = self.cfg.exchange, len(sizes)
        sent, received = [], []
        for i, own in enumerate(sizes):
            t = expected_traffic(n, own, self.result_bytes, x.replicas, spot_checks=x.spot_checks,
                                 coverage=x.spot_check_coverage, num_slices=self.math.layout.num_slices)
            if self.plan.votes:  # phase 1, the same shape: index sets to the slice owners, the supports gathered
                v = expected_traffic(n, self.index_bytes[i], self.support_bytes, x.replicas)
                t = {key: t[key] + v[key] for key in t}
            sent.append(round(t["sent"]))
            received.append(round(t["received"]))
        return sent, received

    def _dense(self, values: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(self.math.numel, dtype=torch.float32)
        out[self.support] = values
        return out


def swarm_math_config(cfg: RunConfig) -> RunConfig:
    """The run config without the shared support, for the RoundMath that keeps the rule and the
    outer step (RoundMath refuses exchange.support: the swarm does not run it)."""
    import dataclasses

    return dataclasses.replace(cfg, exchange=dataclasses.replace(cfg.exchange, support=""))
