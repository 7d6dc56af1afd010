"""Shared support: every peer sends its values on the SAME coordinates, chosen from public state.

The sparse-support trap (optim/aggregate.py, optim/sparse_robust.py): when each peer sends its own
top-K per chunk, a coordinate has 1-3 senders of 8, so coordinate-wise rules see almost nothing and
an attacker can put mass where no honest peer sends (index poisoning). Here the support of a round,
per chunk of CHUNK coordinates, is a pure function of state every node already holds:

    support_r = top-T of |score| per chunk (T = round(mix * K), only coordinates with score != 0)
              ∪ random coordinates of the chunk, drawn from the round's seed, up to K in all

    score (d,) float32, the public score: score <- decay * score + a_r after every round, where
    a_r is the round's applied aggregate (the gathered, signed result every node holds).

Every peer then sends its error-feedback-corrected values at exactly those K coordinates per chunk,
in support order, values only (no index bytes: the receivers know the support); the rest stays in
its error feedback. The rule is coordinate-wise over n ALIGNED values per coordinate (median,
trimmed-mean: exact again, as on dense updates), and the result is sparse on the same support.
Nobody chooses a coordinate: index poisoning is impossible by construction, and the random part
visits every coordinate, so what a peer holds back in error feedback is sent eventually.

State and late joiners: the score is the only new shared state. It is a deterministic function of
the applied aggregates (the signed history), so a node that has the checkpoint's score at round r
and the results of rounds r.. recomputes every later support; a checkpoint must carry it (d
float32, like outer momentum). The random part needs only the round's seed (codec_seed).

Determinism: |score| ranking ties go to the lower index (optim.sparsify.largest_k); the random
part is optim.sparsify.random_index_set (integer Feistel permutation: the same set on any CPU or
torch version) with a per-chunk seed (optim.slicing.slice_seed). The score update is one float32
multiply-add per coordinate, the same bits everywhere.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from optim import codecs
from optim.slicing import slice_seed
from optim.sparsify import ChunkTopK, largest_k, random_index_set

PREFIX = "shared"
VOTE = "vote"
DEFAULT_DECAY = 0.9  # the public score's memory: about 10 rounds, as the senders' error feedback (0.9)


@dataclass(frozen=True, slots=True)
class SupportPlan:
    """How a round's support is chosen: K of every CHUNK coordinates, a share `mix` of them by the
    public score, the rest at random; `values` is the value format payloads carry (a codec spec
    without a sparsifier, e.g. stat2), `result` the one the aggregate travels in."""

    chunk: int
    k: int
    mix: float
    decay: float = DEFAULT_DECAY
    votes: int = 0  # > 0: the two-phase vote (support_by_votes), a coordinate needs this many proposers
    values: str = "stat2"
    result: str = "fp16"

    def __post_init__(self) -> None:
        if not (isinstance(self.chunk, int) and isinstance(self.k, int) and 1 <= self.k <= self.chunk):
            raise ValueError(f"shared support: need 1 <= K <= CHUNK, got chunk {self.chunk}, K {self.k}")
        if not 0.0 <= self.mix <= 1.0:
            raise ValueError(f"shared support: mix {self.mix} is the share of K chosen by the public score; use 0 to 1")
        if not 0.0 <= self.decay < 1.0:
            raise ValueError(f"shared support: score decay {self.decay}: use a value in [0, 1)")
        for what, spec in (("payload values", self.values), ("result values", self.result)):
            codec = codecs.build(spec)
            if getattr(codec, "sparsifier", None) is not None:
                raise ValueError(f"shared support: {what} {spec!r} must be a value format alone (fp16, int8, stat2, ...): "
                                 "the support already chose the coordinates")

    @property
    def top(self) -> int:
        """Coordinates per chunk chosen by the public score (the rest are random)."""
        return round(self.mix * self.k)


def parse(spec: str, codec_spec: str, result_spec: str = "", num_byzantine: int = 0) -> SupportPlan:
    """`shared:MIX[:DECAY]` (support from the public score) or `vote` (the two-phase vote: a
    coordinate needs f + 1 proposers, f = num_byzantine) over the run's codec `chunk-topk:CHUNK:K+VALUES` (which names the chunk,
    K and the payload's value format) and the result value format (`result_spec`; '' = fp16).
    ValueError saying what to write otherwise."""
    name, *args = spec.strip().lower().split(":")
    if name == VOTE and not args:
        return dataclasses.replace(parse("shared:0", codec_spec, result_spec), votes=num_byzantine + 1)
    if name != PREFIX or not 1 <= len(args) <= 2:
        raise ValueError(f"exchange.support {spec!r}: write shared:MIX or shared:MIX:DECAY (e.g. shared:0.5), "
                         "vote (two-phase vote on index sets), or '' for each peer's own top-K")
    try:
        mix, decay = float(args[0]), float(args[1]) if len(args) == 2 else DEFAULT_DECAY
    except ValueError:
        raise ValueError(f"exchange.support {spec!r}: MIX and DECAY are numbers (e.g. shared:0.5:0.9)") from None
    if not (math.isfinite(mix) and math.isfinite(decay)):
        raise ValueError(f"exchange.support {spec!r}: MIX and DECAY must be finite")
    codec = codecs.build(codec_spec)
    if not isinstance(getattr(codec, "sparsifier", None), ChunkTopK):
        raise ValueError(f"exchange.support {spec!r} needs compression.codec = chunk-topk:CHUNK:K+VALUES (it takes the "
                         f"chunk, K and value format from it), got {codec_spec!r}")
    values = codec_spec.split("+")[1].strip() if "+" in codec_spec else "fp32"
    return SupportPlan(chunk=codec.sparsifier.chunk, k=codec.sparsifier.k, mix=mix, decay=decay, values=values,
                       result=result_spec or "fp16")


def round_support(score: torch.Tensor, plan: SupportPlan, seed: int) -> torch.Tensor:
    """(d,) public score, the round's seed -> sorted int64 (m,) support, m = Σ_chunks min(K, chunk size).

    Per chunk: up to plan.top coordinates of largest |score| (score != 0 only: nothing is known about
    the others), then coordinates of the chunk's seeded random order that are not yet in, until K."""
    d = score.numel()
    chunk = plan.chunk
    full = d // chunk
    magnitude = score.detach().abs()
    parts: list[torch.Tensor] = []
    top_full = None
    if plan.top and full:
        top_full = largest_k(magnitude[: full * chunk].view(full, chunk), plan.top)  # (full, top)
    for c in range(-(-d // chunk)):
        start, size = c * chunk, min(chunk, d - c * chunk)
        k = min(plan.k, size)
        top = min(plan.top, k)
        if top and c < full and top_full is not None:
            picked = top_full[c]
        elif top:
            picked = largest_k(magnitude[start : start + size], top)
        else:
            picked = torch.empty(0, dtype=torch.int64)
        picked = picked[magnitude[start + picked] > 0]  # a coordinate never aggregated has no score to rank by
        need = k - picked.numel()
        if need:
            # k random coordinates always leave `need` outside `picked` (|picked| = k - need)
            drawn = random_index_set(slice_seed(seed, c), size, k)
            fresh = drawn[~torch.isin(drawn, picked)][:need]  # the lowest-index ones of the drawn set
            picked = torch.cat([picked, fresh])
        parts.append(picked.sort().values + start)
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)


def proposals(corrected: torch.Tensor, plan: SupportPlan) -> torch.Tensor:
    """A peer's index set for the vote: its K largest-|value| coordinates per chunk of its
    error-feedback-corrected vector (d,) (what chunk-topk would send) -> (d,) bool."""
    d, chunk = corrected.numel(), plan.chunk
    mask = torch.zeros(d, dtype=torch.bool)
    padded = torch.nn.functional.pad(corrected.detach().abs(), (0, (-d) % chunk), value=-1.0).view(-1, chunk)
    top = largest_k(padded, plan.k)  # (chunks, K) offsets; padding (-1) ranks last
    flat = (top + torch.arange(padded.shape[0])[:, None] * chunk).view(-1)
    mask[flat[flat < d]] = True
    return mask


def support_by_votes(votes: torch.Tensor, plan: SupportPlan, seed: int) -> torch.Tensor:
    """The two-phase vote: (d,) int32 proposers per coordinate -> sorted int64 (m,) support.

    Per chunk: the coordinates with at least plan.votes proposers, most votes first (ties to the
    lower index), at most K; the slots left are filled from the chunk's seeded random order (no
    proposer chooses those). So f attackers alone never place a coordinate, and what they add
    to ones an honest peer proposed is a slot, not a value: every peer sends its value there."""
    d, chunk = votes.numel(), plan.chunk
    ranked = torch.where(votes >= plan.votes, votes, 0).float()
    padded = torch.nn.functional.pad(ranked, (0, (-d) % chunk), value=-1.0).view(-1, chunk)
    parts = []
    for c in range(padded.shape[0]):
        size = min(chunk, d - c * chunk)
        k = min(plan.k, size)
        row = padded[c, :size]
        picked = largest_k(row, k)
        picked = picked[row[picked] > 0]
        need = k - picked.numel()
        if need:
            drawn = random_index_set(slice_seed(seed, c), size, k)
            picked = torch.cat([picked, drawn[~torch.isin(drawn, picked)][:need]])
        parts.append(picked.sort().values + c * chunk)
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)


class PublicScore:
    """The state the support derives from: score (d,) float32, an EMA of the applied aggregates.
    Every node holds the same one (it updates from the gathered, signed result); checkpointed."""

    def __init__(self, numel: int, decay: float) -> None:
        self.decay = decay
        self.score = torch.zeros(numel, dtype=torch.float32)

    def update(self, applied: torch.Tensor) -> None:
        """After round r: score <- decay * score + applied ((d,), the aggregate the swarm applied)."""
        self.score.mul_(self.decay).add_(applied.detach().to("cpu", torch.float32))

    def state_dict(self) -> dict:
        return {"decay": self.decay, "score": self.score.clone()}

    def load_state_dict(self, state: dict) -> None:
        if state["score"].shape != self.score.shape:
            raise ValueError(f"shared-support score of shape {tuple(state['score'].shape)} for a model of {self.score.numel()}")
        self.decay = float(state["decay"])
        self.score = state["score"].clone().float()


class SupportValues:
    """A Codec (optim.codecs protocol) carrying the values at this round's support, slice by slice.

    set_round(support, bounds) fixes the support ((m,) sorted int64) and where each slice's values
    start in it (bounds (S + 1,), from slice_bounds); a payload is the concatenation of the slices'
    value payloads (each the value codec's own, so a slice verifies and decodes alone), sizes fixed
    by the support, so no index and no length is on the wire. Error feedback wraps it as any codec."""

    lossless = False

    def __init__(self, values_spec: str) -> None:
        self.values = codecs.build(values_spec)
        self.spec = f"{PREFIX}+{values_spec}"
        self.support: torch.Tensor | None = None
        self.bounds: list[int] = []

    def set_round(self, support: torch.Tensor, bounds: list[int]) -> None:
        self.support, self.bounds = support, bounds

    def _sizes(self) -> list[int]:
        return [self.values.max_encoded_size(b - a) if b > a else 0 for a, b in zip(self.bounds, self.bounds[1:])]  # an empty slice sends nothing

    def max_encoded_size(self, numel: int) -> int:
        return sum(self._sizes())

    def encoded_length(self, payload: bytes | memoryview, numel: int) -> int:
        return sum(self._sizes())

    def encode(self, x: torch.Tensor, *, seed: int = 0) -> bytes:
        if self.support is None:
            raise RuntimeError("SupportValues.encode before set_round: the round's support is not known")
        on = x[self.support]  # (m,)
        return b"".join(self.values.encode(on[a:b].contiguous()) for a, b in zip(self.bounds, self.bounds[1:]) if b > a)

    def decode_values(self, payload: bytes) -> torch.Tensor:
        """payload -> (m,) float32 values in support order; CodecError for a wrong length."""
        sizes = self._sizes()
        if len(payload) != sum(sizes):
            raise codecs.CodecError(f"{self.spec}: expected {sum(sizes)} bytes for {self.bounds[-1]} values, got {len(payload)}")
        out, at = [], 0
        for (a, b), size in zip(zip(self.bounds, self.bounds[1:]), sizes):
            if b > a:
                out.append(self.values.decode(payload[at : at + size], b - a))
            at += size
        return torch.cat(out) if out else torch.empty(0)

    def decode(self, payload: bytes, numel: int, *, seed: int = 0) -> torch.Tensor:
        dense = torch.zeros(numel, dtype=torch.float32)
        dense[self.support] = self.decode_values(payload)
        return dense


def slice_bounds(support: torch.Tensor, slice_starts: tuple[int, ...]) -> list[int]:
    """Where each slice's coordinates begin in the sorted support: (S + 1,) positions, for the
    slice boundaries `slice_starts` (optim.slicing.SliceLayout.bounds)."""
    return torch.searchsorted(support, torch.tensor(slice_starts, dtype=torch.int64)).tolist()
