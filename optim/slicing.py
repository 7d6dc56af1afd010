"""Slices: the flat (d,) parameter vector cut into S contiguous ranges, each one encoded,
verified and aggregated on its own. The unit of work of the sliced exchange.

    layout = SliceLayout.build(numel=d, slices=32, alignment=codec_alignment(codec))
    sliced = SlicedCodec(codec, layout)      # a Codec: encode/decode the whole vector ...
    parts = sliced.split(payload)            # ... or address one slice's bytes: parts[j]
    values = sliced.decode_slice(parts[j], j, seed=seed)   # (layout.size(j),) float32

A sliced payload is the concatenation of the slices' own payloads, each made by the run's codec
on that slice alone (a sparsifier selects per slice; randk's shared index set is drawn per slice
from a seed derived from the round's seed and the slice index), and a signed header can commit
to each slice's sha256 separately. A slice's payload may be shorter than its bound
(max_slice_payload_size: chunk-topk Rice-codes its offsets), but it is self-delimiting, so split
finds every slice's bytes from the payload alone; a receiver fetching one slice checks the size
it is offered against the bound (its sha256 pins the bytes).

Slice boundaries fall on multiples of the codec's block and chunk sizes, so slicing changes no
block's or chunk's contents: a dense codec encodes a sliced vector to exactly the bytes it would
give unsliced, minus the per-slice codec headers.

An owner publishes each aggregated slice in a result format: a dense dtype (fp32, fp16, bf16:
result_format picks one from the run's codec) or a codec spec (e.g. chunk-topk:4096:64+int8,
result_codec), so the aggregate is compressed too. Either way the bytes are a pure function of
the aggregate and the format (seed RESULT_SEED, top-k ties to the lower index), so every honest
owner of a slice signs the same hash (and its length, len(bytes)); max_result_size bounds it.
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass, field
from typing import Sequence

import torch

from optim.codecs import Codec, CodecError, StagedCodec, decode_into
from optim.codecs import build as build_codec
from optim.finite import all_finite
from optim.quantize import BlockQuantFormat, CastFormat
from optim.sparsify import ChunkTopK, RandK, TopK
from optim.stat_quant import StatFormat


def codec_alignment(codec: Codec) -> int:
    """Smallest slice granularity that keeps the codec's blocks and chunks whole."""
    alignment = 1
    for stage in (getattr(codec, "sparsifier", None), getattr(codec, "values", None)):
        for attr in ("block", "chunk"):
            size = getattr(stage, attr, None)
            if isinstance(size, int) and size > 0:
                alignment = math.lcm(alignment, size)
    return alignment


@dataclass(frozen=True, slots=True)
class SliceLayout:
    """S contiguous ranges of a (numel,) vector: slice j is [bounds[j], bounds[j + 1])."""

    numel: int
    bounds: tuple[int, ...]

    def __post_init__(self) -> None:
        b = self.bounds
        if len(b) < 2 or b[0] != 0 or b[-1] != self.numel or any(x >= y for x, y in zip(b, b[1:])):
            raise ValueError(f"slice bounds {b[:4]}... must rise strictly from 0 to numel={self.numel}")

    @classmethod
    def build(cls, numel: int, slices: int, alignment: int = 1) -> "SliceLayout":
        """About `slices` equal slices on multiples of `alignment` (fewer when numel is small)."""
        if numel < 1 or slices < 1 or alignment < 1:
            raise ValueError(f"need numel, slices and alignment >= 1, got {numel}, {slices}, {alignment}")
        per = -(-numel // slices)
        per = -(-per // alignment) * alignment  # round up to whole blocks/chunks
        return cls(numel, tuple(range(0, numel, per)) + (numel,))

    @property
    def num_slices(self) -> int:
        return len(self.bounds) - 1

    def range(self, j: int) -> slice:
        return slice(self.bounds[j], self.bounds[j + 1])

    def size(self, j: int) -> int:
        return self.bounds[j + 1] - self.bounds[j]

    def digest(self) -> str:
        """Identifies the layout (part of what a signed header commits to)."""
        return hashlib.sha256(",".join(map(str, self.bounds)).encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=4096)
def slice_seed(seed: int, j: int) -> int:
    """The codec seed of slice j in a round whose seed is `seed` (the same on every peer); kept,
    as each slice's decode asks for it."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{j}".encode()).digest()[:4], "little")


@dataclass(frozen=True, slots=True)
class SlicedCodec:
    """The run's codec applied slice by slice; itself a Codec (so error feedback wraps it as is)."""

    codec: Codec
    layout: SliceLayout
    max_slice_sizes: tuple[int, ...] = field(init=False)  # (S,) the longest payload of each slice

    def __post_init__(self) -> None:
        sizes = tuple(self.codec.max_encoded_size(self.layout.size(j)) for j in range(self.layout.num_slices))
        object.__setattr__(self, "max_slice_sizes", sizes)

    @property
    def spec(self) -> str:
        return self.codec.spec

    @property
    def lossless(self) -> bool:
        return self.codec.lossless

    def max_encoded_size(self, numel: int) -> int:
        self._check_numel(numel)
        return sum(self.max_slice_sizes)

    def cast_roundtrip(self, x: torch.Tensor) -> torch.Tensor | None:
        """decode(encode(x)) for a codec that is a plain cast (elementwise: slicing changes nothing); else None."""
        cast = getattr(self.codec, "cast_roundtrip", None)
        return None if cast is None else cast(x)

    def max_slice_payload_size(self, j: int) -> int:
        """An upper bound on slice j's payload (its exact size for a fixed-size codec)."""
        return self.max_slice_sizes[j]

    def encoded_length(self, payload: bytes | memoryview, numel: int) -> int:
        self._check_numel(numel)
        return self._slice_ends(memoryview(payload))[-1]

    def encode(self, x: torch.Tensor, *, seed: int = 0) -> bytes:
        self._check_numel(x.numel())
        if isinstance(self.codec, StagedCodec) and self.codec.is_plain_cast and x.dim() == 1 and x.is_floating_point():
            return self._encode_cast(x)
        return b"".join(self.encode_slice(x[self.layout.range(j)], j, seed=seed) for j in range(self.layout.num_slices))

    def _encode_cast(self, x: torch.Tensor) -> bytes:
        """encode() for a plain dtype cast: every slice's payload is the codec's header and the
        slice's values cast, so the whole vector is cast once and the payloads are cut from it
        (32 slices of 1M values: one cast and one join instead of 32 casts, copies and joins)."""
        cast = x.detach().to(device="cpu", dtype=torch.float32).to(self.codec.values.dtype).contiguous()  # (d,)
        raw = memoryview(cast.view(torch.uint8).numpy())
        header, width = self.codec.header(), cast.element_size()
        bounds = self.layout.bounds
        pieces = []
        for start, end in zip(bounds, bounds[1:]):
            pieces += (header, raw[start * width : end * width])
        return b"".join(pieces)

    def encode_slice(self, values: torch.Tensor, j: int, *, seed: int = 0) -> bytes:
        return self.codec.encode(values, seed=slice_seed(seed, j))

    def split(self, payload: bytes) -> list[bytes]:
        """A whole sliced payload -> its S slice payloads, each cut where its own bytes say it
        ends; CodecError when a slice does not start a payload of the codec, runs past the end
        or past its bound, or bytes are left over."""
        ends = self._checked_ends(payload)
        return [payload[start:end] for start, end in zip(ends, ends[1:])]

    def _checked_ends(self, payload: bytes | memoryview) -> list[int]:
        """split()'s checks -> [0, end of slice 0, ..., len(payload)]."""
        most = sum(self.max_slice_sizes)
        if len(payload) > most:
            raise CodecError(f"{self.spec}: expected at most {most} bytes for the sliced payload, got {len(payload)}")
        ends = self._slice_ends(memoryview(payload))
        if ends[-1] != len(payload):
            raise CodecError(f"{self.spec}: the sliced payload's {self.layout.num_slices} slices end at byte {ends[-1]}, "
                             f"it has {len(payload)}")
        return ends

    def _slice_ends(self, view: memoryview) -> list[int]:
        """[0, end of slice 0, ..., end of slice S-1] read from the slices' own headers."""
        ends = [0]
        for j in range(self.layout.num_slices):
            try:
                length = self.codec.encoded_length(view[ends[-1] :], self.layout.size(j))
            except CodecError as exc:
                raise CodecError(f"slice {j} of the sliced payload: {exc}") from None
            if length > self.max_slice_sizes[j] or ends[-1] + length > len(view):
                raise CodecError(f"slice {j} of the sliced payload: {length} bytes from byte {ends[-1]} run past "
                                 f"the payload's {len(view)} bytes or its bound of {self.max_slice_sizes[j]}")
            ends.append(ends[-1] + length)
        return ends

    def decode_slice(self, data: bytes, j: int, *, seed: int = 0) -> torch.Tensor:
        """Slice j's bytes -> (layout.size(j),) float32; CodecError when they cannot be it."""
        self._check_index(j)
        return self.codec.decode(data, self.layout.size(j), seed=slice_seed(seed, j))

    def decode_slice_into(self, datas: Sequence[bytes], j: int, out: torch.Tensor, *, seed: int = 0) -> list[CodecError | None]:
        """decode_slice() of several updates' slice j into the next rows of `out` ((>= len(datas),
        layout.size(j)) float32): per input None, or the CodecError that skipped its row."""
        self._check_index(j)
        return decode_into(self.codec, datas, self.layout.size(j), out, seed=slice_seed(seed, j))

    def _check_index(self, j: int) -> None:
        if not 0 <= j < self.layout.num_slices:
            raise CodecError(f"slice {j} does not exist (the layout has {self.layout.num_slices})")

    def decode(self, payload: bytes, numel: int, *, seed: int = 0) -> torch.Tensor:
        self._check_numel(numel)
        out = torch.empty(numel, dtype=torch.float32)  # filled slice by slice, no intermediate list
        view = memoryview(payload)  # each slice decoded from a view: no copy of it as split() makes
        ends = self._checked_ends(view)
        for j, (start, end) in enumerate(zip(ends, ends[1:])):
            out[self.layout.range(j)] = self.decode_slice(view[start:end], j, seed=seed)
        return out

    def _check_numel(self, numel: int) -> None:
        if numel != self.layout.numel:
            raise ValueError(f"this sliced codec is laid out for {self.layout.numel} values, got {numel}")


RESULT_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
RESULT_SEED = 0  # a compressed result is reproducible by anyone: no round secret in it
# What a compressed result may use: selections and roundings that are pure functions of the values
# (exact comparisons, amax, serial sums). dct-topk (a float matmul) and sign (a vectorised mean
# per block) may round differently on another CPU or thread count, so owners would disagree.
_RESULT_SPARSIFIERS = (ChunkTopK, TopK, RandK, type(None))
_RESULT_VALUES = (CastFormat, BlockQuantFormat, StatFormat)


def result_format(codec_spec: str) -> str:
    """The dtype an aggregated slice travels in: fp32 for a lossless codec, fp16 otherwise
    (bf16 when the run's values are bf16). Rounding happens once, on the owner, before the
    result is hashed and signed, so every peer applies the very same values. (A compressed
    result format, a codec spec, is chosen explicitly: see result_codec.)"""
    values = codec_spec.split("+")[-1].strip()
    if values in ("fp32", "bf16"):
        return values
    return "fp16"


def is_dense_result(fmt: str) -> bool:
    """True for the dense dtype formats (fp32, fp16, bf16), False for a codec spec."""
    return fmt in RESULT_DTYPES


@functools.lru_cache(maxsize=16)
def result_codec(fmt: str) -> StagedCodec:
    """The codec of a compressed result format, e.g. "chunk-topk:4096:64+int8". ValueError for a
    dense format or a spec whose encoding is not reproducible bit for bit (dct-topk, sign)."""
    if is_dense_result(fmt):
        raise ValueError(f"result format {fmt!r} is dense (a dtype), not a codec")
    codec = build_codec(fmt)
    if not (isinstance(codec, StagedCodec) and isinstance(codec.sparsifier, _RESULT_SPARSIFIERS)
            and isinstance(codec.values, _RESULT_VALUES)):
        raise ValueError(
            f"result format {fmt!r}: an aggregate must encode to the same bytes on every owner; use a dense "
            f"dtype (fp32, fp16, bf16) or chunk-topk / topk / randk with fp32, fp16, bf16, int8, int4, int2 "
            f"or stat2 values (not dct-topk or sign)"
        )
    return codec


def max_result_size(size: int, fmt: str) -> int:
    """The most bytes an aggregated slice of `size` values takes in format `fmt`: exact for a dense
    format, an upper bound for a codec whose index part varies (chunk-topk). The actual size is
    len(encode_result(...)); a receiver checks a declared size against this bound."""
    if is_dense_result(fmt):
        return size * torch.empty((), dtype=RESULT_DTYPES[fmt]).element_size()
    return result_codec(fmt).max_encoded_size(size)


def encode_result(values: torch.Tensor, fmt: str) -> bytes:
    """(s,) float32 aggregate -> bytes in format `fmt` (little-endian). A codec format keeps, per
    its sparsifier, the largest magnitudes, ties going to the lower index, so the bytes are a pure
    function of (values, fmt)."""
    if not is_dense_result(fmt):
        # the sparsifiers break ties to the lower index (optim.sparsify.largest_k): a pure function of (values, fmt)
        return result_codec(fmt).encode(values.detach().to(device="cpu", dtype=torch.float32).flatten().contiguous(), seed=RESULT_SEED)
    if fmt == "fp16":  # a value past fp16's range becomes its largest finite value, not inf
        values = values.clamp(-65504.0, 65504.0)
    return values.detach().to(RESULT_DTYPES[fmt]).contiguous().view(torch.uint8).numpy().tobytes()


def decode_result(data: bytes, size: int, fmt: str) -> torch.Tensor:
    """Bytes of an aggregated slice -> (size,) float32; CodecError for a wrong length, bytes the
    format cannot hold, or non-finite values."""
    values = torch.empty(size)
    decode_result_into(data, values, fmt)
    if not all_finite(values):
        raise CodecError("aggregated slice holds NaN or Inf values")
    return values


def decode_result_into(data: bytes, out: torch.Tensor, fmt: str) -> None:
    """decode_result() written into `out` ((size,) float32, e.g. a slice's range of the whole
    aggregate) WITHOUT its finiteness check, which the caller runs over what it wrote (a gather:
    once over many slices, not once per slice); CodecError for a wrong length or bytes the format
    cannot hold."""
    size = out.numel()
    if is_dense_result(fmt):
        dtype = RESULT_DTYPES[fmt]
        expected = size * dtype.itemsize
        if len(data) != expected:
            raise CodecError(f"aggregated slice: expected {expected} bytes for {size} {fmt} values, got {len(data)}")
        out.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype))  # the cast to float32 in the copy
    else:
        out.copy_(result_codec(fmt).decode(bytes(data), size, seed=RESULT_SEED))
