"""Rice coding of the per-chunk offsets of chunk-topk / dct-topk (optim/sparsify.py): lossless,
variable length, vectorized (no Python loop per offset).

The offsets kept in a chunk strictly increase, so they travel as gaps: g_0 = o_0,
g_i = o_i - o_{i-1} - 1 >= 0. Each gap is cut at b bits, b = rice_parameter(CHUNK, K):
    remainders  g & (2**b - 1), bit-packed at b bits (optim/bitpack.py): packed_size(m, b) bytes,
                none when b = 0;
    quotients   g >> b in unary, q zero bits then a one bit, all m of them in one bit stream
                (optim/bitpack.py's bit order) that ends with the byte holding its m-th set bit.
Index part = remainders, then quotients; m, the number of kept offsets, follows from (CHUNK, K, d).
Self-delimiting: the remainders have a fixed size and the unary stream ends at its m-th set bit,
so a reader knows where the values start (`RiceOffsets.length`) with no length field.

Size: (b + 1) bits per offset plus the quotients' sum. A chunk of length L keeping n offsets has
gaps summing to at most L - n, hence quotients summing to at most (L - n) >> b: whatever the
offsets, a chunk takes at most n*(b + 1) + ((L - n) >> b) bits (`max_size`, a hard bound; a
decoder looks no further).

Rice parameter: the b minimizing that worst case, K*b + ((CHUNK - K) >> b), the smaller b on a
tie. WHY: the top-K of a noise-like vector is close to K random offsets, whose gaps are about
geometric with mean (CHUNK - K)/K; the best Rice parameter for that is ~log2(ln 2 * mean), the
same minimizer. Measured on the top-K per chunk of 400 chunks of 4096 of a gaussian vector and
of one scaled in runs of 64 by log-normal factors (clustered offsets), this b is the best one or
within 0.05 bit of it for every K in 1, 4, 16, 64, 192, 512, 2048, 4096. Bits per offset at CHUNK
4096 (gaussian top-K / worst case; the fixed-width code took 12):
    K = 64: b = 5, 7.50 / 7.97      K = 192: b = 4, 5.86 / 6.27      K = 512: b = 2, 4.41 / 4.75
    K = 1: b = 11, 12.46 / 13 (the only case above 12)               K = 4096: b = 0, 1 / 1
against the entropy of a uniformly random K-subset, log2(C(4096, K))/K: 7.4 (K = 64), 5.8 (192).

Decoding refuses (CodecError) what the encoder cannot write: bytes too few for the remainders,
fewer than m set bits in the unary stream's bound, set bits after the m-th, trailing bytes,
nonzero padding of the remainders, an offset at or past the end of its chunk. Work and memory
are bounded by the bytes looked at, at most max_size.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from optim.bitpack import bitmap_positions, pack_bitmap, pack_bits, packed_size, popcounts, unpack_bits
from optim.quantize import CodecError


@functools.lru_cache(maxsize=64)
def rice_parameter(chunk: int, k: int) -> int:
    """b minimizing the worst-case bits of K offsets in a chunk of CHUNK (module docstring)."""
    worst = [k * b + ((chunk - k) >> b) for b in range((chunk - 1).bit_length() + 1)]
    return worst.index(min(worst))


@dataclass(frozen=True, slots=True)
class RiceOffsets:
    """The offsets kept in chunks of CHUNK, K per chunk, over `span` positions: chunk c covers
    [c*CHUNK, min((c+1)*CHUNK, span)) and keeps min(K, its length) offsets, entries
    [c*K, c*K + that) of the flat (m,) offsets."""

    chunk: int
    k: int

    @property
    def parameter(self) -> int:
        return rice_parameter(self.chunk, self.k)

    def count(self, span: int) -> int:
        """m: how many offsets `span` positions keep."""
        return self.k * (span // self.chunk) + min(self.k, span % self.chunk)

    def max_size(self, span: int) -> int:
        """Bytes of the longest index part any offsets over `span` positions can take."""
        m = self.count(span)
        return packed_size(m, self.parameter) + self._max_unary_size(span)

    def _max_unary_size(self, span: int) -> int:
        tail = span % self.chunk
        quotients = (span // self.chunk) * ((self.chunk - self.k) >> self.parameter)
        quotients += (tail - min(self.k, tail)) >> self.parameter
        return -(-(self.count(span) + quotients) // 8)

    def encode(self, offsets: torch.Tensor) -> bytes:
        """int64 (m,) offsets, strictly increasing within each chunk -> the index part."""
        m, b = offsets.numel(), self.parameter
        if m == 0:
            return b""
        previous = offsets.roll(1)
        previous[:: self.k] = -1  # the first offset of each chunk is its own gap
        gaps = offsets - previous - 1  # (m,) >= 0
        if int(gaps.min()) < 0:
            raise ValueError(f"RiceOffsets({self.chunk}, {self.k}): offsets must strictly increase within each chunk")
        remainders = pack_bits(gaps & ((1 << b) - 1), b) if b else b""
        ends = torch.cumsum((gaps >> b) + 1, 0) - 1  # (m,) the bit that ends each quotient
        return remainders + pack_bitmap(ends, int(ends[-1]) + 1)

    def length(self, data: bytes | memoryview, span: int) -> int:
        """How many leading bytes of `data` the index part over `span` positions takes (the
        remainders and the unary stream up to its m-th set bit); CodecError when no m-th set
        bit lies within the stream's bound."""
        m = self.count(span)
        if m == 0:
            return 0
        start, bound = packed_size(m, self.parameter), self._max_unary_size(span)
        if len(data) <= start:
            raise CodecError(f"index part: {len(data)} bytes, fewer than the {start} of the remainders plus a unary stream")
        ones = torch.cumsum(popcounts(data[start : start + bound]), 0)  # (<= bound,)
        end = int(torch.searchsorted(ones, m))  # the first byte where m bits are set
        if end == ones.numel():
            raise CodecError(f"unary quotients: fewer than {m} set bits in the {min(bound, len(data) - start)} bytes "
                             f"looked at (the stream takes at most {bound}): truncated or garbage")
        return start + end + 1

    def decode(self, data: bytes | memoryview, span: int) -> torch.Tensor:
        """Inverse of encode: int64 (m,) offsets, each below its chunk's length; CodecError for
        anything encode cannot have written, trailing bytes included."""
        m, b = self.count(span), self.parameter
        end = self.length(data, span)
        if len(data) != end:
            raise CodecError(f"index part: {len(data)} bytes, its streams end at {end}")
        if m == 0:
            return torch.empty(0, dtype=torch.int64)
        start = packed_size(m, b)
        remainders = unpack_bits(data[:start], b, m) if b else torch.zeros(m, dtype=torch.int64)
        ends = bitmap_positions(data[start:])  # (>= m,): length() found m within these bytes
        if ends.numel() != m:
            raise CodecError(f"unary quotients: {ends.numel()} set bits, expected {m} (bits set after the last one)")
        quotients = torch.diff(ends, prepend=ends.new_tensor([-1])) - 1  # (m,) >= 0
        positions = torch.cumsum((quotients << b) + remainders + 1, 0) - 1  # (m,) offset + bases of earlier chunks
        # no overflow: the quotients sum to at most the stream's bits, the remainders are < 2**b
        chunk_of = torch.arange(m) // self.k
        ends_of_chunks = positions[self.k - 1 :: self.k] + 1  # (full chunks,) where the next chunk's gaps start
        offsets = positions - torch.cat([ends_of_chunks.new_zeros(1), ends_of_chunks])[chunk_of]
        lengths = torch.full((int(chunk_of[-1]) + 1,), self.chunk)
        lengths[-1] = min(self.chunk, span - self.chunk * (lengths.numel() - 1))  # a short last chunk
        if bool((offsets >= lengths[chunk_of]).any()):
            raise CodecError(f"an offset is >= the length of its chunk (chunk size {self.chunk}, the vector ends at {span})")
        return offsets
