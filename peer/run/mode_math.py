"""What an exchange mode fixes in the round math (peer/run/round_math.py), one class per mode:
what a payload is (the whole vector, or slice by slice so each slice verifies and decodes
alone), what a signed header commits to, how a round aggregates when every update is in one
process (the simulator, the coordinator's all-to-all close), and what the simulator counts as a
peer's traffic. The wire and the roles of each mode live in peer/exchange/."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch

from optim import codecs, slicing
from peer.run.config import ConfigError, RunConfig
from peer.run.slice_plan import expected_traffic
from peer.run.work_math import weighted_rows

# Rules whose per-row decisions need whole-vector distances: run slice by slice, each owner would
# score rows on its slice alone, so different slices could keep different rows (and a row could
# hide a large deviation spread thinly over many slices). See docs/sliced-exchange.md.
WHOLE_VECTOR_RULES = ("krum", "multi-krum", "geometric-median")


class ModeMath(ABC):
    name: ClassVar[str]

    def check(self, cfg: RunConfig) -> None:
        """Refuse a run config this mode cannot run (ConfigError saying what to change)."""

    @abstractmethod
    def wire_codec(self, codec: codecs.Codec, sliced: slicing.SlicedCodec) -> codecs.Codec:
        """The codec a payload is encoded with."""

    def header_slices(self, layout: slicing.SliceLayout) -> int:
        """How many slice hashes a signed update header carries (0: none)."""
        return 0

    @abstractmethod
    def apply(self, math: Any, params: torch.Tensor, updates: list[torch.Tensor], *, round_: int | None,
              excluded_for_cause: int, work: Any = None) -> Any:
        """Aggregate the (peer_id-sorted) updates and step params (d,) in place, as the mode's
        nodes would (`work`: a work_math.RowWork, the rows' claims): the AggregationReport when
        the rule makes one, else None."""

    @abstractmethod
    def traffic(self, math: Any, sizes: list[int]) -> tuple[list[int], list[int]]:
        """What each simulated peer sends and receives in a round of payloads of `sizes` bytes."""


class AllToAllMath(ModeMath):
    name = "all-to-all"

    def wire_codec(self, codec, sliced):
        return codec

    def apply(self, math, params, updates, *, round_, excluded_for_cause, work=None):
        seed = None if round_ is None else math.seed(round_)
        rule, f = math.rule_for(len(updates), excluded_for_cause)
        with math.single_thread():
            stacked, weights = weighted_rows(math.cfg, work, f, torch.stack([u.float() for u in updates]), rule.name)  # (n, d)
            combined = rule(stacked, seed=seed, num_byzantine=f, weights=weights)  # (d,)
            math.outer_step(params, combined, round_)
        return rule.last_report

    def traffic(self, math, sizes):
        # each peer uploads its payload once and fetches every other one
        return list(sizes), [sum(sizes) - own for own in sizes]


class SlicedMath(ModeMath):
    name = "sliced"

    def check(self, cfg: RunConfig) -> None:
        name = cfg.aggregation.name
        if name in WHOLE_VECTOR_RULES or cfg.aggregation.options.get("nnm"):
            what = "nearest-neighbour mixing" if name not in WHOLE_VECTOR_RULES else name
            raise ConfigError(
                f"{what} scores whole update vectors; the sliced exchange aggregates each slice on its own, where those "
                "scores would differ slice by slice. Use median, trimmed-mean, mean or centered-clip (all exact or "
                "robust per slice), or exchange.mode = \"all-to-all\" for a small swarm"
            )

    def wire_codec(self, codec, sliced):
        return sliced

    def header_slices(self, layout):
        return layout.num_slices

    def apply(self, math, params, updates, *, round_, excluded_for_cause, work=None):
        """Every slice reduced as an owner would, through the result format, then one outer step
        on the gathered vector."""
        layout, round_ = math.layout, round_ or 0
        combined = torch.empty(math.numel, dtype=torch.float32)  # (d,)
        rows = torch.empty(len(updates), max(layout.size(j) for j in range(layout.num_slices)))
        for j in range(layout.num_slices):
            part = layout.range(j)
            view = rows[:, : layout.size(j)]
            for i, update in enumerate(updates):
                view[i] = update[part]
            data = math.reduce_slice(view, j, round_=round_, excluded_for_cause=excluded_for_cause, work=work)
            combined[part] = math.decode_result(data, j)
        math.step_with_aggregate(params, combined, round_=round_)
        return None

    def traffic(self, math, sizes):
        # expected bytes of the owner draw (every virtual peer serves), over this round's results as
        # reduced (their real lengths: a compressed result's varies with the aggregate)
        result_bytes = sum(math.result_bytes[j] for j in range(math.layout.num_slices))
        x = math.cfg.exchange
        traffic = [expected_traffic(len(sizes), own, result_bytes, x.replicas, spot_checks=x.spot_checks,
                                    coverage=x.spot_check_coverage, num_slices=math.layout.num_slices) for own in sizes]
        return [round(t["sent"]) for t in traffic], [round(t["received"]) for t in traffic]


MODE_MATH: dict[str, type[ModeMath]] = {m.name: m for m in (AllToAllMath, SlicedMath)}


def mode_math(cfg: RunConfig) -> ModeMath:
    return MODE_MATH[cfg.exchange.mode]()
