"""Codecs: how a peer's (d,) float32 update becomes bytes on the wire, named by spec strings.

A spec is a value format, optionally preceded by one sparsifier, joined with `+`; the later stage
encodes the VALUES kept by the earlier one:

    fp32  fp16  bf16                 dtype cast (fp32 is lossless)
    int8  int4  int2  [:BLOCK]       blockwise absmax quantization, float32 scale per BLOCK (64)
    sign[:BLOCK]                     1 bit per value, float32 scale (mean |x|) per BLOCK (64)
    stat2[:BLOCK]                    2 bits per value: 4 bins over ±6σ, a float32 lookup table of
                                     the bins' means per BLOCK (4096) (SparseLoCo; optim/stat_quant.py)
    topk:FRACTION                    global top-k by magnitude, k = round(FRACTION * d)
    chunk-topk:CHUNK:K               top-K by magnitude per chunk of CHUNK
    randk:FRACTION                   k coordinates drawn from the shared seed (no index bytes)
    dct-topk:CHUNK:K                 top-K DCT-II coefficients per chunk of CHUNK
    e.g.  topk:0.01+int8   dct-topk:64:4+int8   randk:0.05+fp16   (a sparsifier alone keeps fp32)

Payload = header (4 bytes) + index bytes + value bytes, nothing else. The value bytes' size is a
pure function of (spec, d), and so is the index part's for topk and randk; chunk-topk and
dct-topk Rice-code their offsets, whose size depends on which offsets were kept. So
`max_encoded_size(d)` is an upper bound (exact for the fixed-size codecs) that a receiver checks
a declared size against before reading, and `encoded_length(payload, d)` reads a payload's own
length from its first bytes (the index part is self-delimiting): a payload can be cut out of a
concatenation (optim/slicing.py). Report sizes with len(payload), never max_encoded_size.
Header = 0xC5, format version (1 byte), crc32(spec) & 0xFFFF (uint16): a payload made with another
codec or another format version is refused with a clear message.
Example: fp16 of 1000 values = 4 + 2*1000 = 2004 bytes; int8 = 4 + 4*ceil(d/64) + d.
See optim/quantize.py, optim/sparsify.py and optim/index_coding.py for the exact layouts.
"""

from __future__ import annotations

import math
import struct
import zlib
from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

import numpy as np
import torch

from optim.quantize import CAST_FORMATS, BlockQuantFormat, CastFormat, CodecError, SignFormat, ValueFormat
from optim.stat_quant import StatFormat
from optim.sparsify import ChunkTopK, DctTopK, RandK, Sparsifier, TopK

__all__ = ["Codec", "CodecError", "ErrorFeedback", "build", "HEADER_SIZE", "FORMAT_VERSION"]

MAGIC = 0xC5
# 2: per-chunk offsets bit-packed at a fixed width (chunk-topk, dct-topk; optim/bitpack.py)
# 3: per-chunk offsets Rice-coded, variable length (optim/index_coding.py)
FORMAT_VERSION = 3
HEADER_SIZE = 4

VALID_FORMS = (
    "fp32, fp16, bf16, int8[:BLOCK], int4[:BLOCK], int2[:BLOCK], sign[:BLOCK], stat2[:BLOCK], topk:FRACTION, randk:FRACTION, "
    "chunk-topk:CHUNK:K, dct-topk:CHUNK:K; at most one sparsifier then one value format, "
    "joined with '+' (e.g. topk:0.01+int8, dct-topk:64:4+int8)"
)


@runtime_checkable
class Codec(Protocol):
    spec: str
    lossless: bool

    def encode(self, x: torch.Tensor, *, seed: int = 0) -> bytes: ...

    def decode(self, payload: bytes, numel: int, *, seed: int = 0) -> torch.Tensor: ...

    def max_encoded_size(self, numel: int) -> int: ...

    def encoded_length(self, payload: bytes | memoryview, numel: int) -> int: ...


@dataclass(frozen=True, slots=True)
class StagedCodec:
    """An optional sparsifier followed by a value format (see the module docstring)."""

    sparsifier: Sparsifier | None
    values: ValueFormat | StatFormat

    @property
    def spec(self) -> str:
        if self.sparsifier is None:
            return self.values.name
        return self.sparsifier.name if self.values.name == "fp32" else f"{self.sparsifier.name}+{self.values.name}"

    @property
    def lossless(self) -> bool:
        return self.sparsifier is None and self.values.lossless

    def cast_roundtrip(self, x: torch.Tensor) -> torch.Tensor | None:
        """decode(encode(x)) without the bytes, where that is a plain cast (no sparsifier, a dtype
        cast format): the same values bit for bit (the bytes are the cast's own); None otherwise."""
        if self.is_plain_cast:
            return x.to(self.values.dtype).to(torch.float32)
        return None

    def header(self) -> bytes:
        """The HEADER_SIZE bytes every payload of this codec starts with."""
        return struct.pack("<BBH", MAGIC, FORMAT_VERSION, zlib.crc32(self.spec.encode()) & 0xFFFF)

    def _layout(self, numel: int) -> tuple[int, int]:
        """(most index bytes, number of values) for a vector of numel."""
        if not isinstance(numel, int) or numel < 0:
            raise ValueError(f"numel must be a non-negative int, got {numel!r}")
        if self.sparsifier is None:
            return 0, numel
        return self.sparsifier.max_index_size(numel), self.sparsifier.num_values(numel)

    def max_encoded_size(self, numel: int) -> int:
        """The longest payload for a vector of numel (every payload's length for a fixed-size codec)."""
        max_index_size, num_values = self._layout(numel)
        return HEADER_SIZE + max_index_size + self.values.size(num_values)

    def encoded_length(self, payload: bytes | memoryview, numel: int) -> int:
        """The length of the payload that starts `payload` (which may run on into other bytes),
        read from its header and index part; CodecError when they cannot start one."""
        view = memoryview(payload)
        _, num_values = self._layout(numel)
        if len(view) < HEADER_SIZE:
            raise CodecError(f"{self.spec}: expected at least the {HEADER_SIZE}-byte header, got {len(view)} bytes")
        self._check_header(view)
        index_length = 0 if self.sparsifier is None else self.sparsifier.index_length(view[HEADER_SIZE:], numel)
        return HEADER_SIZE + index_length + self.values.size(num_values)

    def _check_header(self, view: memoryview) -> None:
        magic, version, tag = struct.unpack_from("<BBH", view)
        if magic != MAGIC:
            raise CodecError(f"{self.spec}: not a swarmloco codec payload (first byte {magic:#04x})")
        if version != FORMAT_VERSION:
            raise CodecError(f"{self.spec}: payload format version {version}, this build reads {FORMAT_VERSION}")
        if view[:HEADER_SIZE] != self.header():
            raise CodecError(f"{self.spec}: payload was made by a different codec (spec tag {tag:#06x})")

    def encode(self, x: torch.Tensor, *, seed: int = 0) -> bytes:
        if not isinstance(x, torch.Tensor) or x.dim() != 1 or not x.is_floating_point():
            raise ValueError(f"{self.spec}: encode expects a flat (d,) float tensor, got {_describe(x)}")
        x = x.detach().to(device="cpu", dtype=torch.float32).contiguous()
        if self.sparsifier is None:
            return self.header() + self.values.encode(x)
        index_bytes, kept = self.sparsifier.encode(x, seed)
        return self.header() + index_bytes + self.values.encode(kept)

    def decode(self, payload: bytes, numel: int, *, seed: int = 0) -> torch.Tensor:
        view, index_end, num_values = self._checked(payload, numel)
        values = self.values.decode(view[index_end:], num_values)
        if self.sparsifier is None:
            return values
        return self.sparsifier.decode(view[HEADER_SIZE:index_end], values, numel, seed)

    @property
    def is_plain_cast(self) -> bool:
        """No sparsifier and a plain dtype cast (fp32 / fp16 / bf16): what cast_into() decodes."""
        return self.sparsifier is None and isinstance(self.values, CastFormat)

    def cast_into(self, payloads: Sequence[bytes | memoryview], numel: int, out: torch.Tensor) -> list[CodecError | None]:
        """decode_into() for a plain dtype cast (is_plain_cast): every payload's length and header
        checked as decode() does, then all their values cast in one call."""
        assert self.is_plain_cast
        errors: list[CodecError | None] = []
        size = self.values.size(numel)
        raw = bytearray(size * len(payloads))  # the values of every payload that decodes, back to back
        k = 0
        for payload in payloads:
            try:
                view, index_end, _ = self._checked(payload, numel)
            except CodecError as exc:
                errors.append(exc)
                continue
            raw[k * size : (k + 1) * size] = view[index_end:]
            errors.append(None)
            k += 1
        if k:
            cast = torch.from_numpy(np.frombuffer(raw, dtype=np.uint8, count=k * size)).view(self.values.dtype)
            out[:k].copy_(cast.view(k, numel))  # (k, numel): the cast to float32, once for all rows
        return errors

    def _checked(self, payload: bytes | memoryview, numel: int) -> tuple[memoryview, int, int]:
        """A payload's exact length and header checked, before any of it is decoded: (a view of
        it, where its values start, how many values)."""
        most = self.max_encoded_size(numel)
        if len(payload) > most:  # before reading anything: the bound is the receiver's, not the payload's
            raise CodecError(f"{self.spec}: expected at most {most} bytes for {numel} values, got {len(payload)}")
        view = memoryview(payload)
        expected = self.encoded_length(view, numel)
        if len(payload) != expected:
            raise CodecError(f"{self.spec}: expected exactly {expected} bytes for {numel} values "
                             f"(as its index part says), got {len(payload)}")
        _, num_values = self._layout(numel)
        return view, len(payload) - self.values.size(num_values), num_values


def decode_into(codec: Codec, payloads: Sequence[bytes | memoryview], numel: int, out: torch.Tensor, *,
                seed: int = 0) -> list[CodecError | None]:
    """codec.decode() of each payload into the next row of `out` ((>= len(payloads), numel)
    float32): the k-th payload that decodes fills out[k]. -> per payload None, or the CodecError
    that decode() raises (its row skipped). The same values bit for bit as decoding one by one.

    Why rows at once: an owner decodes the n inputs of each slice it reduces, and each tensor call
    a thread makes lets the other threads of its process take the interpreter; on a busy machine
    each such hand-off then waits for a core. A plain dtype cast (the default fp16) decodes all rows
    in one call (StagedCodec.cast_into); other codecs one by one."""
    if isinstance(codec, StagedCodec) and codec.is_plain_cast:
        return codec.cast_into(payloads, numel, out)
    errors: list[CodecError | None] = []
    k = 0
    for payload in payloads:
        try:
            out[k] = codec.decode(payload, numel, seed=seed)
        except CodecError as exc:
            errors.append(exc)
            continue
        errors.append(None)
        k += 1
    return errors


def _describe(x: object) -> str:
    if isinstance(x, torch.Tensor):
        return f"tensor of shape {tuple(x.shape)} and dtype {x.dtype}"
    return type(x).__name__


def build(spec: str) -> Codec:
    """Parse a spec string (see the module docstring). ValueError names the bad part."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"codec spec {spec!r} is empty; valid forms: {VALID_FORMS}")
    parts = [part.strip().lower() for part in spec.split("+")]
    stages = [_parse_stage(spec, part) for part in parts]
    sparsifiers = [stage for stage in stages if not isinstance(stage, (BlockQuantFormat, CastFormat, SignFormat, StatFormat))]
    if len(stages) > 2 or len(sparsifiers) > 1:
        raise ValueError(f"codec spec {spec!r}: use at most one sparsifier and one value format; valid forms: {VALID_FORMS}")
    if len(stages) == 2 and (stages[0] not in sparsifiers or stages[1] in sparsifiers):
        raise ValueError(
            f"codec spec {spec!r}: the sparsifier comes first and the value format second "
            f"(e.g. topk:0.01+int8); valid forms: {VALID_FORMS}"
        )
    if sparsifiers:
        return StagedCodec(sparsifiers[0], stages[1] if len(stages) == 2 else CAST_FORMATS["fp32"])
    return StagedCodec(None, stages[0])



def _parse_stage(spec: str, part: str) -> ValueFormat | StatFormat | Sparsifier:
    name, *args = part.split(":")

    def fail(why: str) -> ValueError:
        return ValueError(f"codec spec {spec!r}: bad part {part!r}: {why}; valid forms: {VALID_FORMS}")

    def number(text: str, kind: type) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise fail(f"{text!r} is not a{'n integer' if kind is int else ' number'}") from None
        if kind is float and not math.isfinite(value):
            raise fail(f"{text!r} is not finite")
        return value

    try:
        if name in CAST_FORMATS and not args:
            return CAST_FORMATS[name]
        if name in ("int8", "int4", "int2") and len(args) <= 1:
            return BlockQuantFormat(int(name[3:]), *(number(a, int) for a in args))
        if name == "sign" and len(args) <= 1:
            return SignFormat(*(number(a, int) for a in args))
        if name == "stat2" and len(args) <= 1:
            return StatFormat(*(number(a, int) for a in args))
        if name in ("topk", "randk") and len(args) == 1:
            fraction = number(args[0], float)
            if not 0 < fraction <= 1:
                raise fail(f"FRACTION must be in (0, 1], got {fraction}")
            return TopK(fraction) if name == "topk" else RandK(fraction)
        if name in ("chunk-topk", "dct-topk") and len(args) == 2:
            chunk, k = (number(a, int) for a in args)
            return ChunkTopK(chunk, k) if name == "chunk-topk" else DctTopK(chunk, k)
    except ValueError as exc:
        if str(exc).startswith("codec spec"):
            raise
        raise fail(str(exc)) from None
    raise fail("unknown name or wrong number of ':' arguments")


class ErrorFeedback:
    """Sender-side error feedback: what the codec dropped this round is added to the next input.

    residual (d,) float32 stays on this peer (never sent). Each call encodes y = x + decay*residual
    and keeps residual = y - decode(payload) (decay 1: classic error feedback; SparseLoCo's 0.95
    lets stale dropped values fade), so over many rounds the sum of what receivers decode
    tracks the sum of the inputs, off by exactly the current (bounded) residual. Non-finite residual
    entries are reset to 0 so one bad input cannot poison every later round.

    What the swarm did not apply: with keep_sent=True the decoded message of the last encode is
    kept (last_sent, (d,) float32), and restore_unapplied(applied) adds it back to the residual
    wherever the applied aggregate is exactly 0 (the vote did not create that coordinate, a
    compressed aggregate dropped it, or the round was not applied at all: pass zeros). Our values
    there never reached the model, so they stay owed instead of being lost.
    """

    def __init__(self, codec: Codec, numel: int, *, decay: float = 1.0, keep_sent: bool = False):
        if not 0 < decay <= 1:
            raise ValueError(f"error-feedback decay {decay}: use a value in (0, 1] (1.0: classic error feedback)")
        self.codec = codec
        self.numel = numel
        self.decay = decay
        self.keep_sent = keep_sent
        self.residual = torch.zeros(numel, dtype=torch.float32)
        self.last_sent: torch.Tensor | None = None  # (d,) float32, the decoded last message (keep_sent)

    def encode(self, x: torch.Tensor, *, seed: int = 0) -> bytes:
        if x.shape != (self.numel,):
            raise ValueError(f"ErrorFeedback for {self.numel} values got a tensor of shape {tuple(x.shape)}")
        if self.decay != 1.0:
            self.residual.mul_(self.decay)  # SparseLoCo: e <- β·e + x
        corrected = self.residual.add_(x.detach().to(device="cpu", dtype=torch.float32))  # (d,), in place: x + residual
        payload = self.codec.encode(corrected, seed=seed)
        if self.codec.lossless:
            self.last_sent = corrected.clone() if self.keep_sent else None
            self.residual.zero_()
        else:
            cast = getattr(self.codec, "cast_roundtrip", None)  # a plain cast: what receivers decode, without the bytes
            sent = cast(corrected) if cast is not None else None
            if sent is None:
                sent = self.codec.decode(payload, self.numel, seed=seed)  # (d,) what receivers decode
            self.last_sent = sent if self.keep_sent else None
            corrected.sub_(sent)  # what the codec dropped
            corrected.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
        return payload

    def restore_unapplied(self, applied: torch.Tensor) -> int:
        """Add last_sent back to the residual where `applied` ((d,), the decoded aggregate the
        swarm applied) is exactly 0; returns how many of our sent coordinates that was. Once per
        message: last_sent is then forgotten, so a second call restores nothing."""
        if not self.keep_sent:
            raise RuntimeError("restore_unapplied needs ErrorFeedback(..., keep_sent=True): the last message was not kept")
        if not isinstance(applied, torch.Tensor) or applied.shape != (self.numel,):
            raise ValueError(f"restore_unapplied: applied must be a ({self.numel},) tensor, got {_describe(applied)}")
        if self.last_sent is None:
            return 0
        # residual += (applied == 0 and last_sent != 0 ? last_sent : +0.0), then nan_to_num, with the
        # rare exact zeros of the aggregate found once and only they touched: the same bits as the
        # dense where() (x + 0.0 elsewhere turns a -0.0 residual into +0.0), at a quarter of its
        # passes over (d,). The zeros are found with numpy (~0.2 ms at 1M values): torch's == and
        # nonzero took ~1.7 ms on one thread, and a mean of fp16 values has a few exact zeros
        # (cancellations: 17 in 1M here), so a cheaper test for "none" first did not spare them.
        applied = applied.detach().to("cpu")
        restored = 0
        self.residual.add_(0.0)
        exact = applied.float() if applied.dtype == torch.bfloat16 else applied  # numpy has no bfloat16; the cast is exact
        found = np.flatnonzero(exact.numpy() == 0)  # (z,) int64
        if found.size:
            zeros = torch.from_numpy(found)
            sent = self.last_sent[zeros]  # (z,)
            kept = sent != 0
            self.residual[zeros] += torch.where(kept, sent, 0.0)
            restored = int(kept.sum())
        self.residual.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
        self.last_sent = None
        return restored

    def state_dict(self) -> dict:
        last_sent = None if self.last_sent is None else self.last_sent.clone()
        return {"spec": self.codec.spec, "residual": self.residual.clone(), "last_sent": last_sent}

    def load_state_dict(self, d: dict) -> None:
        """Restore a state_dict; one saved before last_sent existed loads with none kept."""
        if d.get("spec") != self.codec.spec:
            raise ValueError(f"error-feedback state was saved for codec {d.get('spec')!r}, this one is {self.codec.spec!r}")
        residual, last_sent = d["residual"], d.get("last_sent")
        for name, value in (("residual", residual), ("last_sent", last_sent)):
            if name == "last_sent" and value is None:
                continue
            if not isinstance(value, torch.Tensor) or value.shape != (self.numel,):
                raise ValueError(f"error-feedback {name} must be a ({self.numel},) tensor, got {_describe(value)}")
        self.residual = residual.detach().to(device="cpu", dtype=torch.float32).clone()
        self.last_sent = None if last_sent is None else last_sent.detach().to(device="cpu", dtype=torch.float32).clone()
