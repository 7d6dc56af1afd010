"""`sparse-trimmed-mean`: a Byzantine-robust rule for sparse rows (top-k payloads), vote-gated.

Coordinate-wise rules over rows whose supports differ zero out the signal (the sparse-support
trap, optim/aggregate.py): a coordinate only a few peers sent is mostly zeros, so its median or
trimmed mean is 0. sparse-mean (optim/sparse_mean.py) avoids the trap by averaging over the peers
that sent each coordinate, but then one peer alone sets every coordinate only it sent. This rule
keeps sparse-mean's "over the senders" and adds three defences (the threat-model row "poisoned
compressed update"). Rows are (n, d) float32, an exact 0 meaning "this peer did not send that
coordinate"; f = num_byzantine.

  a) clipping: each sent value to ±value_clip x the median sender's RMS in its chunk of `chunk`
     (clip_values: no row concentrates its norm on a few coordinates), then each row scaled down
     (never up) to an L2 norm <= clip_ratio x the lower median of the rows' norms, so an attacker
     cannot win by magnitude. Votes are read before clipping
     (a value that clipping rounds to 0 still counts as sent).
  b) votes: count_j = #{i : x_ij != 0}. Coordinate j is aggregated only when count_j >= min_votes
     (default: 2 when f >= 1 and the round has >= 8 rows, else 1: default_min_votes): a lone
     attacker then never creates a coordinate (index poisoning); below it the output is 0 (and each
     sender's error feedback keeps what it sent there). Not f + 1 for f >= 2: requiring 3 senders
     of every coordinate cost +8.6% final loss with no attacker (8 peers, top-64 of 4096), and 2
     senders with 4 peers +14% (docs/compressed-exchange.md); a coordinate that attackers alone
     create holds a value within the clipped range of (a).
  c) value over the senders of j (the "selectors"): count_j >= 2f + 1: their mean after dropping
     the f largest and f smallest; min_votes <= count_j <= 2f: 0 unless every sender agrees on the
     sign, then the smallest magnitude among them (attackers among up to 2f senders can erase or
     shrink a value, not flip or inflate it; it did better than the median of those few senders
     against 4 of the 5 strongest attacks at no cost without one: docs/compressed-exchange.md).

  d) screening (option `screen`, on by default): before a) to c), the rows that fewer than f
     other rows vouch for in sign, that copy another row bit for bit, or whose norm is under
     half the median's are set aside (optim/sparse_screen.py), at most f of them, and
     a) to c) run on the rest with f lowered by as many: attackers no honest row agrees with
     (index poisoning, sign flips) cost only their missing work, and when all f are set aside the
     rest is aggregated as with f = 0 (docs/robust-compressed.md).

With f = 0 and no row clipped this is sparse-mean (the mean over the senders), up to rounding
order: the senders' values are summed in float64 in sorted-value order.

Determinism: rows are sorted into content order first (canonical_order), each row's norm is a
sequential float64 sum (cumsum: no thread-dependent reduction tree), the per-coordinate sort and
the band sums run in a fixed order, so the same rows in any order, on any thread count, give the
same bits. Columns are processed in blocks of COLUMN_BLOCK to bound memory at d ~ 1e6.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from optim import aggregate, sparse_screen
from optim.aggregate_rules import RuleResult, _in_content_order
from optim.sparse_screen import row_norms  # noqa: F401  (this module's name for it before the screen had it)

NAME = "sparse-trimmed-mean"
DEFAULT_CLIP_RATIO = 2.0
COLUMN_BLOCK = 1 << 16  # columns sorted at a time: (n, 65536) float32 + int64 owners
DEFAULT_MIN_VOTES = 2  # senders a coordinate needs when f >= 1 in a round of at least VOTES_FROM_ROWS rows (see b)
VOTES_FROM_ROWS = 8
DEFAULT_VALUE_CLIP = 2.0  # a sent value's magnitude, in units of the median sender's RMS in its chunk (see a)
DEFAULT_CHUNK = 4096  # the chunk value clipping works in: the sparse codec's (chunk-topk:4096:K)
_OPTIONS: dict[str, Any] = {"clip_ratio": DEFAULT_CLIP_RATIO, "value_clip": DEFAULT_VALUE_CLIP, "chunk": DEFAULT_CHUNK,
                            "min_votes": None, "screen": True, "screen_net": sparse_screen.DEFAULT_MIN_NET,
                            "screen_floor": sparse_screen.DEFAULT_FLOOR, "screen_copies": True,
                            "bucket_size": None, "seed": 0, "nnm": False}


def default_min_votes(n: int, f: int) -> int:
    """Senders a coordinate needs by default: 2 once f >= 1 and the round has >= 8 rows, else 1.
    Below 8 rows top-k supports overlap too little: with 4 peers requiring 2 senders cost +14% final
    loss with no attacker, with 8 peers nothing (docs/compressed-exchange.md)."""
    return DEFAULT_MIN_VOTES if f >= 1 and n >= VOTES_FROM_ROWS else 1


def clip_values(rows: torch.Tensor, value_clip: float | None, chunk: int) -> torch.Tensor:
    """(n, d) -> (n, d): every sent value clipped to ±value_clip x the (lower) median, over the
    rows that sent anything in its chunk of `chunk` coordinates, of those rows' RMS over what they
    sent there. A row cannot concentrate its norm on a few coordinates (index poisoning, a
    coordinate only attackers send): each value stays within the honest peers' typical size.
    Zeros stay zeros (votes are unchanged); None: no value clipping."""
    if value_clip is None or not rows.numel():
        return rows
    n, d = rows.shape
    x = torch.nn.functional.pad(rows, (0, (-d) % chunk)).view(n, -1, chunk)  # (n, c, chunk)
    sent = (x != 0).sum(dim=-1)  # (n, c) values each row sent per chunk
    rms = (x.double().square().sum(dim=-1) / sent.clamp(min=1)).sqrt()  # (n, c)
    ranked = torch.sort(torch.where(sent > 0, rms, torch.inf), dim=0).values  # senders first, ascending
    middle = ((sent > 0).sum(dim=0) - 1).clamp(min=0) // 2  # (c,) the lower median's rank
    limit = (value_clip * ranked.gather(0, middle[None]).squeeze(0)).float()  # (c,); inf where nobody sent
    bound = limit.clamp(max=torch.finfo(torch.float32).max)[None, :, None]
    return torch.clamp(x, min=-bound, max=bound).view(n, -1)[:, :d]


def clip_scales(norms: torch.Tensor, clip_ratio: float | None) -> torch.Tensor:
    """(n,) float64 factors in (0, 1]: min(1, clip_ratio * lower_median(norms) / norm); 1 for a zero
    row and when clip_ratio is None. A median of 0 (most rows empty) scales every non-empty row to 0."""
    if clip_ratio is None:
        return torch.ones_like(norms)
    limit = clip_ratio * float(torch.sort(norms).values[(norms.numel() - 1) // 2])
    return torch.where(norms > limit, limit / norms.clamp(min=torch.finfo(torch.float64).tiny), torch.ones_like(norms))


def sparse_trimmed_mean(
    rows: torch.Tensor, num_byzantine: int, *, clip_ratio: float | None = DEFAULT_CLIP_RATIO, min_votes: int | None = None,
    value_clip: float | None = DEFAULT_VALUE_CLIP, chunk: int = DEFAULT_CHUNK, screen: bool = True,
    screen_net: int = sparse_screen.DEFAULT_MIN_NET, screen_floor: float | None = sparse_screen.DEFAULT_FLOOR,
    screen_copies: bool = True,
) -> RuleResult:
    """(n, d) float32 -> RuleResult: output (d,) float32 as in the module docstring. weights: each
    row's share averaged over the aggregated coordinates (sum 1 when any is); selected: the row is
    kept in at least one coordinate and was not clipped; clip_scale: each row's clip factor (0 for a
    row the screen set aside). screen: first set aside the short rows (optim/sparse_screen.py: fewer
    than f vouchers with net agreement >= screen_net, tiny below the median norm / screen_floor, a
    bit-identical copy when screen_copies), each one of the f, and run on the rest with f lowered
    by as many."""
    def rule(r: torch.Tensor) -> RuleResult:
        kept = sparse_screen.screen(r, num_byzantine, screen_net, screen_floor, screen_copies) if screen else None
        if kept is None or bool(kept.all()):
            return _vote_gated(clip_values(r, value_clip, chunk), num_byzantine, clip_ratio, min_votes)
        f = num_byzantine - int((~kept).sum())
        part = _vote_gated(clip_values(r[kept], value_clip, chunk), f, clip_ratio, min_votes)
        return _scattered(part, kept)
    return _in_content_order(rows, rule)


def _scattered(part: RuleResult, kept: torch.Tensor) -> RuleResult:
    """A result over rows[kept] as a result over all rows: a row set aside has weight 0, is not
    selected, and its clip factor is 0."""
    n = kept.numel()
    weights = torch.zeros(n, dtype=part.weights.dtype)
    weights[kept] = part.weights
    selected = torch.zeros(n, dtype=torch.bool)
    selected[kept] = part.selected
    clip_scale = torch.zeros(n, dtype=part.clip_scale.dtype)
    clip_scale[kept] = part.clip_scale
    return RuleResult(output=part.output, weights=weights, selected=selected, clip_scale=clip_scale)


def _vote_gated(rows: torch.Tensor, f: int, clip_ratio: float | None, min_votes: int | None) -> RuleResult:
    n, d = rows.shape
    votes_needed = default_min_votes(n, f) if min_votes is None else min_votes
    scale = clip_scales(row_norms(rows), clip_ratio)  # (n,) float64
    factor = scale.float()[:, None] if bool((scale < 1).any()) else None  # (n, 1)
    output = torch.zeros(d, dtype=torch.float32)
    shares = torch.zeros(n, dtype=torch.float64)  # each row's share, summed over aggregated coordinates
    aggregated = 0
    rank = torch.arange(n)[:, None]  # (n, 1)
    for start in range(0, d, COLUMN_BLOCK):
        block = rows[:, start : start + COLUMN_BLOCK]  # (n, c)
        count = (block != 0).view(torch.uint8).sum(dim=0, dtype=torch.int32)  # (c,) senders per coordinate
        columns = (count >= votes_needed).nonzero().view(-1)  # (v,) only these are aggregated
        if not columns.numel():
            continue
        count = count[columns]
        values = block[:, columns]  # (n, v)
        sent = values != 0  # votes are read before clipping
        if factor is not None:
            values = values * factor
        # Non-senders sort last: ranks 0..count-1 are the senders' values, ascending. Stable, on
        # content-ordered rows: equal values' ranks (and their shares) go to the same rows.
        ordered, owner = torch.sort(torch.where(sent, values, torch.inf), dim=0, stable=True)
        trimmed = count >= 2 * f + 1
        # Fewer than 2f + 1 senders: too few to trim f away, so a value counts only when every sender
        # agrees on its sign, and then the smallest in magnitude (sign agreement, as SafeSparse):
        # attackers among the senders can erase it or shrink it, never flip or inflate it.
        positive = ordered[0] > 0  # (v,) every sender's value is > 0 (ordered[0] is the smallest)
        negative = ordered.gather(0, (count - 1).long()[None]).squeeze(0) < 0  # every one < 0
        lo = torch.where(trimmed, f, torch.where(negative, count - 1, 0))  # (v,) the band of ranks [lo, hi) kept
        hi = torch.where(trimmed, count - f, torch.where(positive, 1, torch.where(negative, count, 0)))  # empty: no agreement
        keep = (rank >= lo) & (rank < hi)  # (n, v)
        kept = torch.where(keep, ordered, 0.0)
        total = kept[0].double()
        for k in range(1, n):  # rank by rank: a fixed summation order, float64
            total.add_(kept[k])
        width = (hi - lo).clamp(min=1).double()  # (v,)
        mean = (total / width).float()
        output[start + columns] = torch.where(mean != 0, mean, 0.0)  # +0.0, never -0.0
        shares.index_add_(0, owner.view(-1), torch.where(keep, 1.0 / width, 0.0).view(-1))  # serial: exact order
        aggregated += int((hi > lo).sum())
    weights = shares / aggregated if aggregated else shares
    return RuleResult(output=output, weights=weights, selected=(shares > 0) & (scale >= 1), clip_scale=scale)


class SparseTrimmedMean(aggregate.Aggregator):
    """optim.aggregate.Aggregator running sparse_trimmed_mean; needs 2f+1 rows like trimmed-mean.
    Options: clip_ratio (2.0; None: no clipping), value_clip (2.0; None: off) and chunk (4096),
    min_votes (None: default_min_votes), screen (True; False: no row screening) with screen_net (2),
    screen_floor (2.0; None: off) and screen_copies (True), and bucket_size, seed, nnm as for any rule."""

    def __init__(self, num_byzantine: int = 0, **options: Any) -> None:
        if isinstance(num_byzantine, bool) or not isinstance(num_byzantine, int) or num_byzantine < 0:
            raise ValueError(f"num_byzantine must be an integer >= 0, got {num_byzantine!r}")
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise ValueError(f"unknown option(s) {', '.join(unknown)} for {NAME!r}; accepted: {', '.join(_OPTIONS)}")
        ratio = options.get("clip_ratio", DEFAULT_CLIP_RATIO)
        if ratio is not None and (isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not (math.isfinite(ratio) and ratio > 0)):
            raise ValueError(f"{NAME}: option clip_ratio must be a finite number > 0 (or None: no clipping), got {ratio!r}")
        value_clip = options.get("value_clip", DEFAULT_VALUE_CLIP)
        if value_clip is not None and (isinstance(value_clip, bool) or not isinstance(value_clip, (int, float))
                                       or not (math.isfinite(value_clip) and value_clip > 0)):
            raise ValueError(f"{NAME}: option value_clip must be a finite number > 0 (or None: no value clipping), got {value_clip!r}")
        chunk = options.get("chunk", DEFAULT_CHUNK)
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise ValueError(f"{NAME}: option chunk must be an integer >= 1, got {chunk!r}")
        votes = options.get("min_votes")
        if votes is not None and (isinstance(votes, bool) or not isinstance(votes, int) or votes < 1):
            raise ValueError(f"{NAME}: option min_votes must be an integer >= 1 (or None: default_min_votes), got {votes!r}")
        for key in ("screen", "screen_copies"):
            if not isinstance(options.get(key, True), bool):
                raise ValueError(f"{NAME}: option {key} must be true or false, got {options[key]!r}")
        net = options.get("screen_net", sparse_screen.DEFAULT_MIN_NET)
        if isinstance(net, bool) or not isinstance(net, int) or net < 1:
            raise ValueError(f"{NAME}: option screen_net must be an integer >= 1, got {net!r}")
        floor = options.get("screen_floor", sparse_screen.DEFAULT_FLOOR)
        if floor is not None and (isinstance(floor, bool) or not isinstance(floor, (int, float))
                                  or not (math.isfinite(floor) and floor >= 1)):
            raise ValueError(f"{NAME}: option screen_floor must be a finite number >= 1 (or None: no tiny-row test), got {floor!r}")
        for key in ("bucket_size", "seed", "nnm"):
            if key in options:
                aggregate._check_option(NAME, key, options[key])
        super().__init__(NAME, num_byzantine, {**_OPTIONS, **options})

    def _rule(self, rows: torch.Tensor, f: int, center: torch.Tensor | None, seed: int) -> RuleResult:
        o = self.options
        return sparse_trimmed_mean(rows, f, clip_ratio=o["clip_ratio"], min_votes=o["min_votes"], value_clip=o["value_clip"],
                                   chunk=o["chunk"], screen=o["screen"], screen_net=o["screen_net"],
                                   screen_floor=o["screen_floor"], screen_copies=o["screen_copies"])
