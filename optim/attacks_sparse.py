"""Compression-aware attacks: malicious updates made for a per-chunk top-K codec and a rule that
aggregates each coordinate over the peers that sent it. Reached through
optim.attacks.build("index-poison" | "slow-accumulate" | "vote-tailored", ...).

The codec they target is SparseLoCo's `chunk-topk:CHUNK:K+stat2` (optim/sparsify.py ChunkTopK,
optim/stat_quant.py): every peer sends the K largest-|value| coordinates of each chunk of CHUNK
(options `chunk`, `topk`; default 4096 and 64, the sparseloco recipe's). The attacker's row goes
through the same encoder, so each attack puts its whole mass on at most K coordinates per chunk
(then the top-K keeps exactly those) and gives them one magnitude (then the 2-bit statistical
quantizer, which decodes each bin to its members' mean, keeps it: every negative value of a
block decodes exactly; positive ones share their bin with the zeros of slots left empty, so they
shrink when an attack fills fewer than K slots of a chunk).

Which coordinates an honest peer sends is estimated from `honest` (the attacker is omniscient):
its top-K per chunk, zeros excluded (a sparse honest row sends its nonzeros; a dense one, in the
simulator, its K largest). Norms are measured the way a rule that clips rows sees them: the
"typical honest norm" is the median (the lower one for an even count) of the honest rows' norms
over their sent coordinates; `sparse-trimmed-mean` clips rows to 2x the median row norm, and the
median over all rows is no smaller than the honest one once the attackers' rows are larger, so
a row of up to 2x the typical honest norm is not shrunk by that clip (as far as `honest` tells:
the decoded rows the rule sees differ by the quantization and, in the simulator, by each
sender's error feedback, which also adds the attacker's own residual to its row).

    index-poison     (after Cao et al. 2024, "hybrid sparse Byzantine attack"): the coordinates
                     the fewest honest peers send, where a sender-averaged rule lets a few rows
                     set the value alone. Per chunk round(fraction*K) of them (fewest honest
                     senders first, then the largest |honest mean|), sign opposite to the honest
                     mean (+ where it is 0), row norm = scale x the typical honest norm.
                     Against a sender-averaged mean (sparse-mean) it sets those coordinates; a
                     rule that needs f+1 senders drops the ones no honest peer sends.
    slow-accumulate  (after RoSDHB 2025): a small bias on fixed coordinates, which error feedback
                     and momentum integrate over rounds: round(fraction*K) coordinates per chunk and
                     their signs drawn once from `seed` (the same every round, for every attacker
                     with that seed), row norm = magnitude x the typical honest norm (default 0.5:
                     well under the 2x clip, and no outlier for a norm filter).
    vote-tailored    (after SafeSparse 2025, index-set and sign agreement): a coordinate needs f+1
                     senders, so the f attackers all send the same K per chunk, chosen among the
                     coordinates that 1..max_honest honest peers send (exactly one first, then the
                     largest |honest value|): their f votes plus that honest one pass the vote, and
                     with f >= 2 they outnumber it in the median among senders. Sign opposite to the honest
                     senders' sum there, row norm = scale x the typical honest norm (default 2:
                     the edge of the 2x clip). A pure function of `honest`, so every attacker of a
                     round makes the same choice; zeros when no coordinate qualifies.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

CODEC = {"chunk": 4096, "topk": 64}  # chunk-topk:4096:64, the sparseloco recipe's sparsifier
OPTIONS: dict[str, dict[str, Any]] = {
    "index-poison": {"scale": 1.0, "fraction": 1.0, **CODEC},
    "slow-accumulate": {"magnitude": 0.5, "fraction": 1.0, "seed": 0, **CODEC},
    "vote-tailored": {"scale": 2.0, "max_honest": 1, **CODEC},
}


def check_options(name: str, o: dict[str, Any]) -> None:
    if name not in OPTIONS:
        return
    for key, minimum in (("chunk", 1), ("topk", 1), ("max_honest", 1), ("seed", 0)):
        value = o.get(key)
        if key in o and (isinstance(value, bool) or not isinstance(value, int) or value < minimum):
            raise ValueError(f"attack {name}: option {key} must be an integer >= {minimum}, got {value!r}")
    if o["topk"] > o["chunk"]:
        raise ValueError(f"attack {name}: option topk ({o['topk']}) must be <= chunk ({o['chunk']}), as in chunk-topk:CHUNK:K")
    for key in ("magnitude", "fraction"):
        value = o.get(key)
        if key in o and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
            raise ValueError(f"attack {name}: option {key} must be a number > 0, got {value!r}")
    if o.get("fraction", 1.0) > 1:
        raise ValueError(f"attack {name}: option fraction must be in (0, 1] (of the topk slots per chunk), got {o['fraction']!r}")


def selected(rows: torch.Tensor, chunk: int, topk: int) -> torch.Tensor:
    """(k, d) bool: the coordinates each row sends under chunk-topk:chunk:topk, zeros excluded."""
    k, d = rows.shape
    num_chunks = -(-d // chunk)
    magnitude = torch.full((k, num_chunks * chunk), -1.0)  # padding is never chosen before a real coordinate
    magnitude[:, :d] = rows.abs()
    top = torch.topk(magnitude.view(k, num_chunks, chunk), topk, dim=2).indices  # (k, C, K)
    mask = torch.zeros(k, num_chunks, chunk, dtype=torch.bool).scatter_(2, top, True).view(k, -1)[:, :d]
    return mask & (rows != 0)


def typical_norm(rows: torch.Tensor, sent: torch.Tensor) -> float:
    """Median over rows of the norm of what each row sends (the lower median for an even count)."""
    return float(torch.linalg.vector_norm(rows.double() * sent, dim=1).median())


def pick_per_chunk(primary: torch.Tensor, secondary: torch.Tensor, per_chunk: int, chunk: int) -> torch.Tensor:
    """(d,) bool: in each chunk, the `per_chunk` coordinates with the smallest (primary,
    secondary, index); a coordinate whose primary is +inf is never picked."""
    d = primary.numel()
    num_chunks = -(-d // chunk)

    def padded(x: torch.Tensor) -> torch.Tensor:  # (C, chunk), +inf past the end
        out = torch.full((num_chunks * chunk,), float("inf"), dtype=torch.float64)
        out[:d] = x.double()
        return out.view(num_chunks, chunk)

    first, second = padded(primary), padded(secondary)
    by_second = second.argsort(dim=1, stable=True)
    order = by_second.gather(1, first.gather(1, by_second).argsort(dim=1, stable=True))[:, :per_chunk]  # (C, n)
    ok = first.gather(1, order).isfinite()
    mask = torch.zeros(num_chunks, chunk, dtype=torch.bool)
    mask[torch.arange(num_chunks)[:, None].expand_as(order)[ok], order[ok]] = True
    return mask.view(-1)[:d]


def _slots(o: dict[str, Any]) -> int:
    return max(1, round(o["fraction"] * o["topk"]))


def _row(support: torch.Tensor, sign: torch.Tensor, norm: float) -> torch.Tensor:
    """One magnitude on every coordinate of `support`, with `sign`, whole norm `norm`."""
    count = int(support.sum())
    if count == 0 or norm == 0.0:
        return torch.zeros(support.shape, dtype=torch.float32)
    return (sign.double() * support * (norm / count**0.5)).float()


def _need_honest(name: str, honest: torch.Tensor) -> None:
    if honest.shape[0] == 0:
        raise ValueError(f"{name}: needs at least one honest update to work from, got none")


def _index_poison(o: dict[str, Any], *, honest: torch.Tensor, **_: Any) -> torch.Tensor:
    _need_honest("index-poison", honest)
    sent = selected(honest, o["chunk"], o["topk"])  # (k, d)
    mu = honest.double().mean(dim=0)  # (d,)
    support = pick_per_chunk(sent.sum(dim=0), -mu.abs(), _slots(o), o["chunk"])
    sign = torch.where(mu > 0, -1.0, 1.0)
    return _row(support, sign, o["scale"] * typical_norm(honest, sent))


def _slow_accumulate(o: dict[str, Any], *, honest: torch.Tensor, own: torch.Tensor, **_: Any) -> torch.Tensor:
    _need_honest("slow-accumulate", honest)
    d = own.numel()
    g = torch.Generator().manual_seed(o["seed"])  # depends on seed and d only: fixed across rounds
    support = pick_per_chunk(torch.rand(d, generator=g, dtype=torch.float64), torch.zeros(d), _slots(o), o["chunk"])
    sign = torch.randint(0, 2, (d,), generator=g).double() * 2 - 1
    norm = o["magnitude"] * typical_norm(honest, selected(honest, o["chunk"], o["topk"]))
    return _row(support, sign, norm)


def _vote_tailored(o: dict[str, Any], *, honest: torch.Tensor, **_: Any) -> torch.Tensor:
    _need_honest("vote-tailored", honest)
    sent = selected(honest, o["chunk"], o["topk"])  # (k, d)
    count = sent.sum(dim=0).double()
    value = (honest.double() * sent).sum(dim=0)  # the honest senders' sum, (d,)
    eligible = (count >= 1) & (count <= o["max_honest"])
    support = pick_per_chunk(torch.where(eligible, count, float("inf")), -value.abs(), o["topk"], o["chunk"])
    sign = torch.where(value > 0, -1.0, 1.0)
    return _row(support, sign, o["scale"] * typical_norm(honest, sent))


CRAFT: dict[str, Callable[..., torch.Tensor]] = {
    "index-poison": _index_poison,
    "slow-accumulate": _slow_accumulate,
    "vote-tailored": _vote_tailored,
}
