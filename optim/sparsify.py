"""Sparsifiers: pick m of a vector's coordinates (or DCT coefficients) and say which.

A sparsifier splits a flat (d,) float32 vector into an index part (bytes, at most
`max_index_size(d)` long) and m = `num_values(d)` kept values, which the codec's value format
(optim/quantize.py) then encodes. m depends only on d; the index part of `topk` and `randk` has
a size fixed by d, that of the per-chunk sparsifiers depends on the offsets kept, and every index
part is self-delimiting: `index_length(data, d)` reads where it ends from its first bytes.

Index layouts (little-endian), chosen to be small on the wire:
  global index sets (`topk`): whichever is smaller of
    * segmented: the index space is cut into segments of 65536; per kept index its uint16 offset
      within its segment, in increasing order, then (num_segments - 1) uint32 counts of kept
      indices per segment (the last segment's count is implied) -> 2k + 4*(ceil(d/65536) - 1);
    * bitmap: one bit per coordinate, first coordinate in the low bit -> ceil(d/8).
  per-chunk offsets (`chunk-topk`, `dct-topk`): for every chunk its kept offsets in increasing
    order, as gaps Rice-coded (optim/index_coding.py: remainders bit-packed, quotients in unary)
    -> about 7.5 bits per offset for 64 of 4096, 5.9 for 192 of 4096 (12 at a fixed width).
  `randk`: nothing. The index set is a pure function of (seed, d, k), so every peer using the
    round's shared seed keeps THE SAME coordinates: coordinate-wise robust aggregation (median,
    trimmed mean) then compares like with like instead of mostly zeros.
Decoders accept only what the encoder could produce: indices in range, strictly increasing,
zero padding bits, nothing after the end.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from optim import dct
from optim.bitpack import bitmap_positions, pack_bitmap
from optim.index_coding import RiceOffsets
from optim.quantize import CodecError, tensor_from_bytes, tensor_to_bytes

SEGMENT = 1 << 16
MAX_NUMEL = 1 << 32  # randk hashes 32-bit coordinates; larger vectors should be split by tensor


def kept_count(fraction: float, numel: int) -> int:
    """k for `topk:FRACTION` / `randk:FRACTION`: round(fraction * d), at least 1, at most d."""
    return min(numel, max(1, round(fraction * numel)))


# --- global index sets -------------------------------------------------------------------------

def _segmented_size(numel: int, k: int) -> int:
    return 2 * k + 4 * max(0, -(-numel // SEGMENT) - 1)


def _uses_bitmap(numel: int, k: int) -> bool:
    return -(-numel // 8) < _segmented_size(numel, k)


def index_set_size(numel: int, k: int) -> int:
    return -(-numel // 8) if _uses_bitmap(numel, k) else _segmented_size(numel, k)


def encode_index_set(indices: torch.Tensor, numel: int) -> bytes:
    """Sorted unique int64 (k,) indices in [0, numel) -> exactly index_set_size(numel, k) bytes."""
    k = indices.numel()
    if _uses_bitmap(numel, k):
        return pack_bitmap(indices, numel)
    offsets = (indices & (SEGMENT - 1)).to(torch.int32).to(torch.uint16)  # (k,)
    num_segments = -(-numel // SEGMENT)
    counts = torch.bincount(indices >> 16, minlength=num_segments)[:-1].to(torch.int32)  # (num_segments-1,)
    return tensor_to_bytes(offsets) + tensor_to_bytes(counts)


def decode_index_set(payload: memoryview, numel: int, k: int) -> torch.Tensor:
    """Inverse of encode_index_set, refusing anything the encoder could not have written."""
    if len(payload) != index_set_size(numel, k):
        raise CodecError(f"index set: expected {index_set_size(numel, k)} bytes, got {len(payload)}")
    if _uses_bitmap(numel, k):
        indices = bitmap_positions(payload)
        if indices.numel() and int(indices[-1]) >= numel:
            raise CodecError("index bitmap: bits past the end of the vector are set")
        if indices.numel() != k:
            raise CodecError(f"index bitmap: {indices.numel()} bits set, expected {k}")
        return indices
    offsets = tensor_from_bytes(payload[: 2 * k], torch.uint16).to(torch.int64)  # (k,)
    counts = tensor_from_bytes(payload[2 * k :], torch.int32).to(torch.int64)  # (num_segments-1,)
    if bool((counts < 0).any()) or bool((counts > SEGMENT).any()) or int(counts.sum()) > k:
        raise CodecError(f"index set: segment counts are negative, too large, or sum past k={k}")
    counts = torch.cat([counts, counts.new_tensor([k - int(counts.sum())])])  # (num_segments,)
    segment_ids = torch.repeat_interleave(torch.arange(counts.numel()), counts)  # (k,)
    indices = segment_ids * SEGMENT + offsets
    _check_increasing_in_range(indices, numel, "index set")
    return indices


def _check_increasing_in_range(indices: torch.Tensor, numel: int, what: str) -> None:
    if indices.numel() and (int(indices[-1]) >= numel or bool((indices[1:] <= indices[:-1]).any())):
        raise CodecError(f"{what}: indices are out of range or not strictly increasing")


# --- per-chunk offsets -------------------------------------------------------------------------

@contextlib.contextmanager
def _named(what: str) -> Iterator[None]:
    """A CodecError raised inside names the sparsifier it came from."""
    try:
        yield
    except CodecError as error:
        raise CodecError(f"{what}: {error}") from None


# --- sparsifiers -------------------------------------------------------------------------------

def _scatter(indices: torch.Tensor, values: torch.Tensor, numel: int) -> torch.Tensor:
    """The dense (numel,) float32 vector that is `values` at `indices` and 0 elsewhere."""
    out = torch.zeros(numel, dtype=torch.float32)
    out[indices] = values
    return out


def largest_k(magnitude: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest entries along the last dim, in increasing order; among entries equal
    to the k-th largest, the lower indices (torch.topk leaves ties to the implementation, and an
    aggregate every owner must encode to the same bytes cannot). (..., n) -> (..., k) int64."""
    magnitude = torch.nan_to_num(magnitude, nan=math.inf)  # NaN ranks largest, as in torch.topk
    top = torch.topk(magnitude, k, dim=-1, sorted=True)
    kth = top.values[..., -1:]  # (..., 1) the k-th largest
    tied = magnitude == kth
    if not bool((tied.sum(dim=-1) > 1).any()):  # no tie at the k-th value: topk's choice is the only one
        return top.indices.sort(dim=-1).values
    above = magnitude > kth
    room = k - above.sum(dim=-1, keepdim=True)  # (..., 1) places left for tied entries
    chosen = above | (tied & (torch.cumsum(tied, dim=-1) <= room))  # exactly k per row, lowest tied first
    return chosen.nonzero()[:, -1].view(*magnitude.shape[:-1], k)


@dataclass(frozen=True, slots=True)
class TopK:
    """`topk:FRACTION`: the k = round(FRACTION*d) largest-magnitude coordinates of the vector."""

    fraction: float

    @property
    def name(self) -> str:
        return f"topk:{self.fraction!r}"

    def num_values(self, numel: int) -> int:
        return kept_count(self.fraction, numel)

    def max_index_size(self, numel: int) -> int:
        return index_set_size(numel, self.num_values(numel))

    def index_length(self, data: memoryview, numel: int) -> int:
        return self.max_index_size(numel)  # fixed by d

    def encode(self, x: torch.Tensor, seed: int) -> tuple[bytes, torch.Tensor]:
        indices = largest_k(x.abs(), self.num_values(x.numel()))
        return encode_index_set(indices, x.numel()), x[indices]

    def decode(self, index_bytes: memoryview, values: torch.Tensor, numel: int, seed: int) -> torch.Tensor:
        return _scatter(decode_index_set(index_bytes, numel, self.num_values(numel)), values, numel)


@dataclass(frozen=True, slots=True)
class RandK:
    """`randk:FRACTION`: k coordinates chosen by the shared seed alone; no index bytes at all."""

    fraction: float

    @property
    def name(self) -> str:
        return f"randk:{self.fraction!r}"

    def num_values(self, numel: int) -> int:
        return kept_count(self.fraction, numel)

    def max_index_size(self, numel: int) -> int:
        return 0

    def index_length(self, data: memoryview, numel: int) -> int:
        return 0

    def encode(self, x: torch.Tensor, seed: int) -> tuple[bytes, torch.Tensor]:
        return b"", x[random_index_set(seed, x.numel(), self.num_values(x.numel()))]

    def decode(self, index_bytes: memoryview, values: torch.Tensor, numel: int, seed: int) -> torch.Tensor:
        return _scatter(random_index_set(seed, numel, self.num_values(numel)), values, numel)


_MASK32 = 0xFFFFFFFF


def _mix32(h: int) -> int:
    """A 32-bit integer hash with good avalanche ('lowbias32' constants); derives round keys."""
    h &= _MASK32
    h ^= h >> 16
    h = (h * 0x7FEB352D) & _MASK32
    h ^= h >> 15
    h = (h * 0x846CA68B) & _MASK32
    return h ^ (h >> 16)


_FEISTEL_ROUNDS = 6


@functools.lru_cache(maxsize=4)
def random_index_set(seed: int, numel: int, k: int) -> torch.Tensor:
    """Sorted int64 (k,) distinct indices in [0, numel), a pure function of its arguments.

    A seeded pseudorandom permutation P of [0, numel) picks the set: {P(0), ..., P(k-1)}, or for
    k > numel/2 the complement of {P(0), ..., P(numel-k-1)} (less work, same distribution).
    P is a 6-round Feistel network on the smallest even number of bits covering numel,
    cycle-walked back into range (a bijection on [0, 2**bits) restricted this way stays a
    bijection on [0, numel)).
    WHY this construction: it costs O(min(k, d-k)) hashing, and it is pure integer arithmetic, so
    every peer gets the same set whatever its torch version or CPU (torch.randperm promises
    neither). Cached because a receiver decodes one payload per peer with the same seed; the
    result is shared, do not modify it.
    """
    if not 0 <= numel < MAX_NUMEL:
        raise ValueError(f"randk supports vectors of fewer than 2**32 values, got {numel}")
    if not 0 <= k <= numel:
        raise ValueError(f"randk cannot keep {k} of {numel} values")
    complement = 2 * k > numel
    chosen = _feistel_prefix(seed, numel, numel - k if complement else k)
    if not complement:
        return chosen.sort().values
    keep = torch.ones(numel, dtype=torch.bool)
    keep[chosen] = False
    return keep.nonzero().view(-1)


def _round_function(half_word: torch.Tensor, key_a: int, key_b: int) -> torch.Tensor:
    """Keyed mixing of int64 values < 2**16 into int64 values < 2**32, never overflowing int64
    (each product stays below 2**56), so the bits are the same on every machine."""
    t = (half_word ^ (key_a & 0xFFFF)).mul_(0x9E3779B1)  # < 2**48; in-place ops: this is the hot loop
    t.bitwise_xor_(t >> 15).bitwise_xor_(key_b).bitwise_and_(0xFFFFFF).mul_(0x85EBCA6B)  # < 2**56
    return t.bitwise_xor_(t >> 29).bitwise_right_shift_(8)


def _feistel_prefix(seed: int, numel: int, count: int) -> torch.Tensor:
    """(P(0), ..., P(count-1)) for the seeded permutation P of [0, numel), int64 (count,)."""
    half = max(1, (max(numel - 1, 1).bit_length() + 1) // 2)  # 2*half <= 32 bits cover [0, numel)
    mask = (1 << half) - 1
    seed &= (1 << 64) - 1
    keys = [_mix32(_mix32((seed >> 32) ^ r) ^ seed) for r in range(2 * _FEISTEL_ROUNDS)]

    def permute(x: torch.Tensor) -> torch.Tensor:  # a bijection on [0, 2**(2*half))
        left, right = x >> half, x & mask
        for r in range(_FEISTEL_ROUNDS):
            left, right = right, _round_function(right, keys[2 * r], keys[2 * r + 1]).bitwise_and_(mask).bitwise_xor_(left)
        return (left << half) | right

    values = permute(torch.arange(count, dtype=torch.int64))
    outside = (values >= numel).nonzero().view(-1)
    while outside.numel():  # 2**(2*half) < 4*numel: each step lands in range w.p. > 1/4
        values[outside] = permute(values[outside])
        outside = outside[values[outside] >= numel]
    return values


@dataclass(frozen=True, slots=True)
class ChunkTopK:
    """`chunk-topk:CHUNK:K`: the K largest-magnitude coordinates of every chunk of CHUNK
    (min(K, length) in a short last chunk)."""

    chunk: int
    k: int

    def __post_init__(self) -> None:
        if not 1 <= self.k <= self.chunk <= SEGMENT:
            raise ValueError(f"chunk-topk:{self.chunk}:{self.k}: need 1 <= K <= CHUNK <= {SEGMENT}")

    @property
    def name(self) -> str:
        return f"chunk-topk:{self.chunk}:{self.k}"

    def num_values(self, numel: int) -> int:
        return self.k * (numel // self.chunk) + min(self.k, numel % self.chunk)

    @property
    def offset_code(self) -> RiceOffsets:
        return RiceOffsets(self.chunk, self.k)

    def max_index_size(self, numel: int) -> int:
        return self.offset_code.max_size(numel)

    def index_length(self, data: memoryview, numel: int) -> int:
        with _named(self.name):
            return self.offset_code.length(data, numel)

    def encode(self, x: torch.Tensor, seed: int) -> tuple[bytes, torch.Tensor]:
        magnitude = torch.full((dct.num_chunks(x.numel(), self.chunk) * self.chunk,), -1.0)
        magnitude[: x.numel()] = x.abs()  # padding gets -1: chosen only once a short chunk is exhausted
        offsets = largest_k(magnitude.view(-1, self.chunk), self.k)  # (num_chunks, K), increasing
        indices = (offsets + torch.arange(offsets.shape[0])[:, None] * self.chunk).view(-1)  # (num_chunks*K,)
        keep = indices < x.numel()  # padding offsets sort to the end of the last chunk
        return self.offset_code.encode(offsets.view(-1)[keep]), x[indices[keep]]

    def decode(self, index_bytes: memoryview, values: torch.Tensor, numel: int, seed: int) -> torch.Tensor:
        with _named(self.name):
            offsets = self.offset_code.decode(index_bytes, numel)  # (m,) each below its chunk's length
        indices = torch.arange(offsets.numel()) // self.k * self.chunk + offsets  # (m,): chunk c owns entries [c*K, c*K + K)
        return _scatter(indices, values, numel)


@dataclass(frozen=True, slots=True)
class DctTopK:
    """`dct-topk:CHUNK:K`: DCT-II each chunk of CHUNK (zero-padded tail), keep the K largest
    coefficients per chunk; decoding scatters them and applies the inverse DCT."""

    chunk: int
    k: int

    def __post_init__(self) -> None:
        if not 1 <= self.k <= self.chunk <= dct.MAX_CHUNK:
            raise ValueError(f"dct-topk:{self.chunk}:{self.k}: need 1 <= K <= CHUNK <= {dct.MAX_CHUNK}")

    @property
    def name(self) -> str:
        return f"dct-topk:{self.chunk}:{self.k}"

    def num_values(self, numel: int) -> int:
        return self.k * dct.num_chunks(numel, self.chunk)

    @property
    def offset_code(self) -> RiceOffsets:
        return RiceOffsets(self.chunk, self.k)

    def max_index_size(self, numel: int) -> int:
        return self.offset_code.max_size(self.chunk * dct.num_chunks(numel, self.chunk))  # whole (zero-padded) chunks

    def index_length(self, data: memoryview, numel: int) -> int:
        with _named(self.name):
            return self.offset_code.length(data, self.chunk * dct.num_chunks(numel, self.chunk))

    def encode(self, x: torch.Tensor, seed: int) -> tuple[bytes, torch.Tensor]:
        offsets, values = dct.top_coefficients(x, self.chunk, self.k)  # (num_chunks, K) each
        return self.offset_code.encode(offsets.view(-1)), values.view(-1)

    def decode(self, index_bytes: memoryview, values: torch.Tensor, numel: int, seed: int) -> torch.Tensor:
        with _named(self.name):
            offsets = self.offset_code.decode(index_bytes, self.chunk * dct.num_chunks(numel, self.chunk))
        offsets = offsets.view(-1, self.k)  # (num_chunks, K), increasing in a row
        return dct.from_coefficients(offsets, values.view(-1, self.k), self.chunk, numel)


Sparsifier = TopK | RandK | ChunkTopK | DctTopK
