"""The math of one round, shared by the coordinator, every peer and the simulator.

Sender:   pseudo_gradient Δ = θ_r − θ_local  ->  outer.transmit(Δ)  ->  codec (+ error feedback)  -> bytes
Receiver: bytes -> codec.decode -> finite check -> stack sorted by peer_id (n, d) -> robust aggregate (d,)
          -> outer.step(θ_r, aggregate) = θ_{r+1}

Receivers run the same deterministic code on the same bytes in the same order, single-threaded,
on CPU float32, so every honest node computes a bit-identical θ_{r+1} (checked by param hash).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
from typing import Iterator

import torch

from optim import aggregate, codecs, finite, outer, slicing, sparse_mean
from peer.run.config import ConfigError, OuterConfig, RunConfig
from peer.run.mode_math import mode_math
from peer.run.work_math import RowWork, check_weighted_rule, claim_bounds, weighted_rows
from protocol.wire import swarm_pb2
from protocol.envelope import UpdateHeader, open_update
from protocol.reasons import Reason


class UpdateRejected(ValueError):
    """A decoded update that must not be aggregated; `reason` is reported in the manifest."""

    def __init__(self, reason: Reason, message: str):
        super().__init__(message)
        self.reason = reason


def outer_options(cfg: OuterConfig) -> dict:
    """The keyword options of optim.outer.build for this config; every optimizer takes outer.lr."""
    if cfg.name == "nesterov":
        return {"lr": cfg.effective_lr, "momentum": cfg.momentum}
    if cfg.name == "demo":
        return {"lr": cfg.effective_lr, "decay": cfg.demo_decay, "chunk": cfg.demo_chunk, "topk": cfg.demo_topk}
    return {"lr": cfg.effective_lr}


def codec_seed(cfg: RunConfig, round_: int) -> int:
    """Seed shared by every peer for round `round_` (random index sets must coincide)."""
    return _round_seed(cfg.run_id, cfg.seed, round_)


@functools.lru_cache(maxsize=256)
def _round_seed(run_id: str, seed: int, round_: int) -> int:
    """codec_seed's hash, kept: it is asked for each slice decoded (~100 a round per peer)."""
    digest = hashlib.sha256(f"{run_id}/{seed}/{round_}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    """Reductions must not depend on the thread count: every node must get the same bits."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def build_codec(cfg: RunConfig) -> codecs.Codec:
    try:
        return codecs.build(cfg.compression.codec)
    except ValueError as exc:
        raise ConfigError(f"compression.codec: {exc}") from None


def build_aggregator(cfg: RunConfig) -> aggregate.Aggregator:
    try:
        return sparse_mean.build(cfg.aggregation.name, num_byzantine=cfg.aggregation.num_byzantine, **cfg.aggregation.options)
    except ValueError as exc:
        raise ConfigError(f"aggregation: {exc}") from None


class RoundMath:
    """Codec, outer optimizer and aggregator of a run, with the sender's local state."""

    def __init__(self, cfg: RunConfig, numel: int) -> None:
        if cfg.exchange.support:
            raise ConfigError(f"exchange.support = {cfg.exchange.support!r} is a prototype only `swarmloco simulate` runs "
                              "(docs/robust-compressed.md); the swarm's exchange sends each peer's own top-K: set it to ''")
        self.cfg = cfg
        self.numel = numel
        codec = build_codec(cfg)
        self.mode = mode_math(cfg)  # what the exchange mode fixes in this math (peer/run/mode_math.py)
        self.mode.check(cfg)
        # Sliced exchange: the codec runs slice by slice, so each slice verifies and decodes alone.
        self.layout = slicing.SliceLayout.build(numel, cfg.exchange.slices, slicing.codec_alignment(codec))
        self.sliced_codec = slicing.SlicedCodec(codec, self.layout)
        self.codec = self.mode.wire_codec(codec, self.sliced_codec)
        self.result_format = cfg.exchange.result_codec or slicing.result_format(cfg.compression.codec)
        self.outer = outer.build(cfg.outer.name, **outer_options(cfg.outer))
        self.aggregator = build_aggregator(cfg)
        check_weighted_rule(cfg, self.aggregator.name)  # a window run's rule must weigh rows by work
        self._small_round = aggregate.build("median")
        use_feedback = cfg.compression.error_feedback and not self.codec.lossless
        decay = cfg.compression.error_feedback_decay
        # A sparse run keeps its last message: what the swarm's aggregate did not apply of it goes
        # back into the residual (restore_unapplied), so error feedback holds exactly what is owed.
        self.error_feedback = (codecs.ErrorFeedback(self.codec, numel, decay=decay, keep_sent=not self.codec.lossless)
                               if use_feedback else None)
        self._sent_round: int | None = None  # the round of the message the error feedback kept
        self.last_aggregate: torch.Tensor | None = None  # (d,) the last round's aggregate (eager updates)
        self.result_bytes: dict[int, int] = {}  # slice -> len of the last result reduce_slice made for it

    # --- sender --------------------------------------------------------------------------

    def encode(self, pseudo_gradient: torch.Tensor, round_: int) -> bytes:
        """(d,) pseudo-gradient -> the bytes this peer sends for round `round_`."""
        message = self.outer.transmit(pseudo_gradient.detach().float().contiguous())
        seed = codec_seed(self.cfg, round_)
        if self.error_feedback is not None:
            self._sent_round = round_
            return self.error_feedback.encode(message, seed=seed)
        return self.codec.encode(message, seed=seed)

    # --- receiver ------------------------------------------------------------------------

    def open_update(self, signed: swarm_pb2.Signed, *, round_: int | None, layout_hash: str) -> UpdateHeader:
        """Verify a signed update header against this run (signature, run, round, codec, layout, size,
        the work it claims)."""
        max_inner_steps, tokens_per_step = claim_bounds(self.cfg)
        return open_update(
            signed,
            run_id=self.cfg.run_id,
            round_=round_,
            codec=self.cfg.compression.codec,
            numel=self.numel,
            layout_hash=layout_hash,
            max_payload_bytes=min(self.cfg.max_payload_bytes, self.codec.max_encoded_size(self.numel)),
            num_slices=self.mode.header_slices(self.layout),
            max_inner_steps=max_inner_steps,
            tokens_per_step=tokens_per_step,
        )

    def decode(self, payload: bytes, round_: int) -> torch.Tensor:
        """bytes -> (d,) float32; raises UpdateRejected with the reason when it must be excluded."""
        try:
            update = self.codec.decode(payload, self.numel, seed=codec_seed(self.cfg, round_))
        except codecs.CodecError as exc:
            raise UpdateRejected(Reason.UNDECODABLE, f"payload does not decode: {exc}") from None
        if update.shape != (self.numel,):
            raise UpdateRejected(Reason.WRONG_SHAPE, f"decoded update has shape {tuple(update.shape)}, expected ({self.numel},)")
        if not finite.all_finite(update):
            raise UpdateRejected(Reason.NON_FINITE, "decoded update holds NaN or Inf values")
        return update

    def decode_slices(self, datas: list[bytes], j: int, round_: int, out: torch.Tensor) -> list[UpdateRejected | None]:
        """Slice j of several updates, decoded into the next rows of `out` ((>= len(datas),
        layout.size(j)) float32): -> per input None (it filled the next row) or the UpdateRejected
        that keeps it out (undecodable, or holding NaN / Inf). The rows are decoded, and checked
        finite, in a few calls for all (optim.codecs.decode_into)."""
        try:
            errors = self.sliced_codec.decode_slice_into(datas, j, out, seed=codec_seed(self.cfg, round_))
        except codecs.CodecError as exc:  # the slice itself does not exist: no input decodes
            return [UpdateRejected(Reason.UNDECODABLE, f"slice {j} does not decode: {exc}") for _ in datas]
        k = errors.count(None)
        kept = finite.finite_rows(out[:k]) if k else []
        if not all(kept):
            out[: sum(kept)] = out[:k][torch.tensor(kept)]  # the finite rows, in order, to the front
        decoded = iter(kept)
        return [UpdateRejected(Reason.UNDECODABLE, f"slice {j} does not decode: {error}") if error is not None
                else None if next(decoded) else UpdateRejected(Reason.NON_FINITE, f"slice {j} holds NaN or Inf values")
                for error in errors]

    def reduce_slice(self, rows: torch.Tensor, j: int, *, round_: int, excluded_for_cause: int = 0,
                     work: RowWork | None = None) -> bytes:
        """(n, s_j) decoded slice j of the listed updates (peer_id order) -> the aggregated slice's
        bytes in the run's result format. Deterministic: every honest owner signs the same bytes.
        `work`: what the rows' headers claim (a compute-window run weighs them by it, capped).

        The rule runs on the slice alone (per-slice robust aggregation); centered-clip starts from
        the matching part of the swarm's previous aggregate."""
        n = rows.shape[0]
        if n == 0:
            combined = torch.zeros(self.layout.size(j))
        else:
            seed = codec_seed(self.cfg, round_)
            rule, f = self.rule_for(n, excluded_for_cause)
            previous = self.aggregator.previous
            center = None if previous is None else previous[self.layout.range(j)]
            rows, weights = weighted_rows(self.cfg, work, f, rows, rule.name)  # a window run: rows by work
            with single_thread():
                combined = rule.aggregate_part(rows, seed=seed, num_byzantine=f, center=center, report=False,
                                               weights=weights)  # (s_j,)
        result = slicing.encode_result(combined, self.result_format)
        self.result_bytes[j] = len(result)  # a compressed result's length varies (simulate counts the real one)
        return result

    def decode_result(self, data: bytes, j: int) -> torch.Tensor:
        """An aggregated slice's bytes -> (s_j,) float32 (raises CodecError)."""
        return slicing.decode_result(data, self.layout.size(j), self.result_format)

    def decode_results_into(self, results: dict[int, bytes], out: torch.Tensor) -> list[int]:
        """Aggregated slices' bytes ({j: bytes}) decoded into their ranges of `out` ((d,) float32);
        -> the slices refused (a wrong length, bytes the format cannot hold, NaN or Inf), whose
        ranges hold no promise. decode_result's checks, with the finiteness check run once per
        run of adjacent slices (two numpy passes a gather, not one per slice)."""
        refused, written = [], []
        for j, data in results.items():
            try:
                slicing.decode_result_into(data, out[self.layout.range(j)], self.result_format)
                written.append(j)
            except ValueError:  # CodecError, or any decoder's refusal: recomputation says who lied
                refused.append(j)
        bounds = self.layout.bounds
        for run in _adjacent_runs(sorted(written)):
            if not finite.all_finite(out[bounds[run[0]] : bounds[run[-1] + 1]]):
                refused += [j for j in run if not finite.all_finite(out[self.layout.range(j)])]
        return sorted(refused)

    def max_result_bytes(self) -> int:
        return max(self.layout.size(j) for j in range(self.layout.num_slices)) * 4

    def outer_at(self, round_: int | None) -> outer.OuterOptimizer:
        """The outer optimizer with round `round_`'s step size (outer.lr_warmup_rounds,
        outer.lr_schedule); None: the configured step (no schedule)."""
        cfg = self.cfg.outer
        self.outer.lr = cfg.effective_lr if round_ is None else cfg.lr_at(round_, self.cfg.rounds.rounds)
        return self.outer

    def outer_step(self, params: torch.Tensor, combined: torch.Tensor, round_: int | None) -> None:
        """θ_r -> θ_{r+1} in place with round `round_`'s step; the aggregate is kept for eager updates."""
        self.outer_at(round_).step(params, combined)
        self.last_aggregate = combined
        self.restore_unapplied(combined, round_)

    def restore_unapplied(self, applied: torch.Tensor, round_: int | None) -> int:
        """What round `round_`'s aggregate (d,) did not apply of this sender's message goes back into
        its error feedback: the coordinates the aggregate holds as exactly 0 (below the votes a
        coordinate needs, or dropped by a compressed result). Only for the message of that round:
        an overlapped peer has already sent the next one (then nothing is restored)."""
        if self.error_feedback is None or round_ is None or self._sent_round != round_:
            return 0
        self._sent_round = None
        return self.error_feedback.restore_unapplied(applied)

    def step_with_aggregate(self, params: torch.Tensor, combined: torch.Tensor, *, round_: int | None = None) -> None:
        """Outer step of round `round_` on the gathered (d,) aggregate; it is also centered-clip's next centre."""
        with single_thread():
            self.outer_step(params, combined, round_)
        if self.aggregator.name == "centered-clip":
            self.aggregator.previous = combined

    def rule_for(self, n: int, excluded_for_cause: int) -> tuple[aggregate.Aggregator, int]:
        """The rule and its f for n rows. A round smaller than the rule's minimum even at f = 0
        (krum needs 3) falls back to the coordinate median (the mean of 1 or 2 rows), the same on
        every node."""
        rule = self.aggregator if aggregate.minimum_rows(self.aggregator.name, 0) <= n else self._small_round
        return rule, self.effective_byzantine(n, excluded_for_cause)

    def effective_byzantine(self, n: int, excluded_for_cause: int = 0) -> int:
        """f for a round with n surviving updates.

        Each update already excluded for cause (non-finite, undecodable, equivocation) is one
        declared Byzantine peer out of the way, so f drops by that many. If the round is still
        too small for the rule at that f, f is lowered to what n allows rather than stalling the
        swarm (the rule then tolerates fewer faults; the coordinator logs it).
        """
        f = max(0, self.cfg.aggregation.num_byzantine - excluded_for_cause)
        while f > 0 and aggregate.minimum_rows(self.aggregator.name, f) > n:
            f -= 1
        return f

    # --- state ---------------------------------------------------------------------------

    def global_state_dict(self) -> dict:
        """State every node shares (outer momentum, a stateful aggregator's centre): checkpointed."""
        previous = self.aggregator.previous
        return {
            "outer": self.outer.global_state_dict(),
            "aggregator_previous": None if previous is None else previous.clone(),
        }

    def load_global_state_dict(self, state: dict) -> None:
        if "outer" not in state:  # a bare outer state (older checkpoints)
            self.outer.load_global_state_dict(state)
            return
        self.outer.load_global_state_dict(state["outer"])
        self.aggregator.previous = state.get("aggregator_previous")

    def local_state_dict(self) -> dict:
        """This sender's own state (DeMo momentum, error-feedback residual): kept for --resume."""
        return {
            "outer": self.outer.local_state_dict(),
            "error_feedback": self.error_feedback.state_dict() if self.error_feedback is not None else None,
        }

    def load_local_state_dict(self, state: dict) -> None:
        self.outer.load_local_state_dict(state.get("outer") or {})
        if self.error_feedback is not None and state.get("error_feedback"):
            self.error_feedback.load_state_dict(state["error_feedback"])

    # --- receiver: aggregate + step -------------------------------------------------------

    def apply(
        self, params: torch.Tensor, updates: list[torch.Tensor], *, round_: int | None = None, excluded_for_cause: int = 0,
        work: RowWork | None = None,
    ) -> aggregate.AggregationReport | None:
        """Aggregate `updates` (already sorted by peer_id; `work`: what their headers claim, in that
        order) and step `params` (d,) in place.

        `round_` seeds the aggregator's randomness (bucketing's shuffle) with the value every
        node derives for that round, so the shuffle changes each round and agrees everywhere.
        """
        if not updates:
            return None
        return self.mode.apply(self, params, updates, round_=round_, excluded_for_cause=excluded_for_cause, work=work)

    # --- what a mode's math uses ------------------------------------------------------------

    def seed(self, round_: int) -> int:
        return codec_seed(self.cfg, round_)

    single_thread = staticmethod(single_thread)


def _adjacent_runs(ordered: list[int]) -> list[list[int]]:
    """[0, 1, 2, 5, 6, 9] -> [[0, 1, 2], [5, 6], [9]]."""
    runs: list[list[int]] = []
    for j in ordered:
        if runs and runs[-1][-1] == j - 1:
            runs[-1].append(j)
        else:
            runs.append([j])
    return runs
