"""Dense value formats: dtype casts (fp32/fp16/bf16) and blockwise absmax int8/int4/int2.

A value format turns a flat float32 vector of n values into exactly `size(n)` bytes and back.
It is the last stage of every codec (optim/codecs.py): alone it encodes the whole update, after a
sparsifier it encodes the kept values. All byte layouts are little-endian.

Blockwise absmax (`intB[:BLOCK]`, B in 8/4/2, BLOCK default 64): the values are cut into blocks of
BLOCK; each block stores one float32 scale s = absmax / qmax (qmax = 2**(B-1) - 1: 127, 7, 1) and
one code per value, q = round(x / s) in [-qmax, qmax], so |x - q*s| <= s/2. Codes are stored as
q + qmax in B bits, packed little-end-first into bytes (int2 is therefore ternary, {-s, 0, +s}).
Layout: scales (float32, ceil(n/BLOCK)) then codes (ceil(n*B/8) bytes).
WHY float32 scales: an fp16 scale underflows for the tiny pseudo-gradients of late training and
costs only 0.5 bit/value less at BLOCK=64.

Scaled sign (`sign[:BLOCK]`, BLOCK default 64): one bit per value (1 = negative) and one float32
scale per block, s = mean |x| over the block; decode gives +-s. WHY mean and not absmax: among
vectors s*sign(x), s = mean|x| is the one closest to x in L2 (the 1-bit compressor of EF-SignSGD,
Karimireddy et al. 2019), and unlike ternary int2 (which rounds every value below absmax/2 to 0)
every value moves the right way. Layout: scales (float32, ceil(n/BLOCK)) then bits (ceil(n/8)
bytes, first value in the low bit). 1.5 bits/value at BLOCK=64, against 2.5 for int2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

DEFAULT_BLOCK = 64
MAX_BLOCK = 1 << 16


class CodecError(ValueError):
    """A payload that is corrupt, truncated or oversized; the message says what is wrong.

    Defined here (the lowest codec layer) and re-exported by optim.codecs, where users import it.
    """


def tensor_from_bytes(payload: bytes | bytearray | memoryview, dtype: torch.dtype) -> torch.Tensor:
    """Copy little-endian bytes into a new writable 1-D tensor of `dtype`; length must divide."""
    if len(payload) == 0:
        return torch.empty(0, dtype=dtype)  # torch cannot view an empty byte tensor as wider elements
    raw = np.frombuffer(payload, dtype=np.uint8).copy()  # copy: the caller's buffer may be read-only
    return torch.from_numpy(raw).view(dtype)


def tensor_to_bytes(x: torch.Tensor) -> bytes:
    return x.contiguous().view(torch.uint8).numpy().tobytes()


@dataclass(frozen=True, slots=True)
class CastFormat:
    """fp32 / fp16 / bf16: a plain dtype cast. Non-finite values pass through unchanged (fp16 also
    turns |x| > 65504 into inf); the network layer rejects non-finite decoded updates."""

    name: str
    dtype: torch.dtype

    @property
    def lossless(self) -> bool:
        return self.dtype == torch.float32

    def size(self, n: int) -> int:
        return n * torch.finfo(self.dtype).bits // 8

    def encode(self, x: torch.Tensor) -> bytes:
        return tensor_to_bytes(x.to(self.dtype))

    def decode(self, payload: memoryview, n: int) -> torch.Tensor:
        if len(payload) != self.size(n):
            raise CodecError(f"{self.name}: expected {self.size(n)} bytes for {n} values, got {len(payload)}")
        return tensor_from_bytes(payload, self.dtype).to(torch.float32)


def _checked_scales(fmt: "BlockQuantFormat | SignFormat", payload: memoryview, n: int) -> tuple[torch.Tensor, int]:
    """Check a blockwise payload's exact length and read its float32 block scales (finite, >= 0)."""
    if len(payload) != fmt.size(n):
        raise CodecError(f"{fmt.name}: expected {fmt.size(n)} bytes for {n} values, got {len(payload)}")
    num_scale_bytes = 4 * fmt.num_blocks(n)
    scales = tensor_from_bytes(payload[:num_scale_bytes], torch.float32)
    if not bool(torch.isfinite(scales).all()) or bool((scales < 0).any()):
        raise CodecError(f"{fmt.name}: a block scale is negative or not finite")
    return scales, num_scale_bytes


class BlockedFormat:
    """What the lossy block formats share (intB, sign, stat2): the block size check, the spec name
    (`KIND` alone at the default block, `KIND:BLOCK` otherwise) and the block count. Subclasses are
    frozen, slotted dataclasses with a `block` field."""

    __slots__ = ()
    default_block: ClassVar[int] = DEFAULT_BLOCK
    block: int

    @property
    def kind(self) -> str:
        raise NotImplementedError

    def _check_block(self) -> None:
        if not 1 <= self.block <= MAX_BLOCK:
            raise ValueError(f"{self.kind}:{self.block}: block size must be in [1, {MAX_BLOCK}]")

    @property
    def name(self) -> str:
        return self.kind if self.block == self.default_block else f"{self.kind}:{self.block}"

    @property
    def lossless(self) -> bool:
        return False

    def num_blocks(self, n: int) -> int:
        return -(-n // self.block)


@dataclass(frozen=True, slots=True)
class BlockQuantFormat(BlockedFormat):
    """intB[:BLOCK]: blockwise absmax quantization, see the module docstring for the layout."""

    bits: int  # 8, 4 or 2
    block: int = DEFAULT_BLOCK

    def __post_init__(self) -> None:
        if self.bits not in (8, 4, 2):
            raise ValueError(f"int{self.bits}: only int8, int4 and int2 exist")
        self._check_block()

    @property
    def kind(self) -> str:
        return f"int{self.bits}"

    @property
    def qmax(self) -> int:
        return (1 << (self.bits - 1)) - 1

    def size(self, n: int) -> int:
        return 4 * self.num_blocks(n) + math.ceil(n * self.bits / 8)

    def scales(self, x: torch.Tensor) -> torch.Tensor:
        """Per-block scale absmax / qmax, float32 (num_blocks,). NaN/inf inputs give a non-finite
        scale, which decode refuses: a non-finite update cannot cross the wire in an int format."""
        blocks = self._pad(x, self.num_blocks(x.numel()) * self.block).view(-1, self.block)
        return blocks.abs().amax(dim=1) / self.qmax if blocks.numel() else x.new_zeros(0)

    def encode(self, x: torch.Tensor) -> bytes:
        n = x.numel()
        scales = self.scales(x)  # (num_blocks,)
        usable = torch.isfinite(scales) & (scales > 0)
        divisor = torch.where(usable, scales, torch.ones_like(scales))
        blocks = self._pad(x, scales.numel() * self.block).view(-1, self.block)  # (num_blocks, block)
        q = torch.round(blocks / divisor[:, None]).nan_to_num_(0.0).clamp_(-self.qmax, self.qmax)
        codes = (q.reshape(-1)[:n].to(torch.int16) + self.qmax).to(torch.uint8)  # (n,) in [0, 2*qmax]
        return tensor_to_bytes(scales) + tensor_to_bytes(self._pack(codes))

    def decode(self, payload: memoryview, n: int) -> torch.Tensor:
        scales, num_scale_bytes = _checked_scales(self, payload, n)
        codes = self._unpack(tensor_from_bytes(payload[num_scale_bytes:], torch.uint8), n)  # (n,)
        if bool((codes > 2 * self.qmax).any()):
            raise CodecError(f"{self.name}: a code is outside [-{self.qmax}, {self.qmax}]")
        q = codes.to(torch.float32) - self.qmax
        blocks = self._pad(q, scales.numel() * self.block).view(-1, self.block)
        return (blocks * scales[:, None]).reshape(-1)[:n]

    @staticmethod
    def _pad(x: torch.Tensor, length: int) -> torch.Tensor:
        return x if x.numel() == length else torch.nn.functional.pad(x, (0, length - x.numel()))

    def _pack(self, codes: torch.Tensor) -> torch.Tensor:
        """(n,) uint8 codes of `bits` each -> (ceil(n*bits/8),) bytes, first code in the low bits."""
        per_byte = 8 // self.bits
        if per_byte == 1:
            return codes
        slots = self._pad(codes, -(-codes.numel() // per_byte) * per_byte).view(-1, per_byte)
        shifts = torch.arange(0, 8, self.bits, dtype=torch.uint8)  # (per_byte,)
        return (slots << shifts).sum(dim=1, dtype=torch.uint8)  # bit fields do not overlap: sum == or

    def _unpack(self, packed: torch.Tensor, n: int) -> torch.Tensor:
        per_byte = 8 // self.bits
        if per_byte == 1:
            return packed
        shifts = torch.arange(0, 8, self.bits, dtype=torch.uint8)
        codes = ((packed[:, None] >> shifts) & ((1 << self.bits) - 1)).reshape(-1)  # (num_bytes * per_byte,)
        if bool(codes[n:].any()):
            raise CodecError(f"{self.name}: the padding bits after the last code are not zero")
        return codes[:n]


@dataclass(frozen=True, slots=True)
class SignFormat(BlockedFormat):
    """sign[:BLOCK]: scaled sign, see the module docstring for the layout."""

    block: int = DEFAULT_BLOCK

    def __post_init__(self) -> None:
        self._check_block()

    @property
    def kind(self) -> str:
        return "sign"

    def size(self, n: int) -> int:
        return 4 * self.num_blocks(n) + -(-n // 8)

    def scales(self, x: torch.Tensor) -> torch.Tensor:
        """Per-block mean |x|, float32 (num_blocks,); a short last block averages its own values.
        NaN/inf inputs give a non-finite scale, which decode refuses."""
        n, blocks = x.numel(), self.num_blocks(x.numel())
        padded = BlockQuantFormat._pad(x.abs(), blocks * self.block).view(-1, self.block)  # (num_blocks, block)
        counts = torch.full((blocks,), float(self.block))
        if blocks and n % self.block:
            counts[-1] = n % self.block
        return padded.sum(dim=1) / counts

    def encode(self, x: torch.Tensor) -> bytes:
        n = x.numel()
        negative = BlockQuantFormat._pad((x < 0).to(torch.uint8), -(-n // 8) * 8).view(-1, 8)  # (ceil(n/8), 8)
        weights = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8)
        return tensor_to_bytes(self.scales(x)) + tensor_to_bytes((negative * weights).sum(dim=1, dtype=torch.uint8))

    def decode(self, payload: memoryview, n: int) -> torch.Tensor:
        scales, num_scale_bytes = _checked_scales(self, payload, n)
        packed = tensor_from_bytes(payload[num_scale_bytes:], torch.uint8)
        bits = ((packed[:, None] >> torch.arange(8, dtype=torch.uint8)) & 1).reshape(-1)  # (ceil(n/8)*8,)
        if bool(bits[n:].any()):
            raise CodecError(f"{self.name}: the padding bits after the last value are not zero")
        signs = 1.0 - 2.0 * bits[:n].to(torch.float32)  # (n,) +-1
        return signs * scales.repeat_interleave(self.block)[:n]


ValueFormat = CastFormat | BlockQuantFormat | SignFormat

CAST_FORMATS = {
    "fp32": CastFormat("fp32", torch.float32),
    "fp16": CastFormat("fp16", torch.float16),
    "bf16": CastFormat("bf16", torch.bfloat16),
}
