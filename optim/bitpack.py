"""Bit streams: fixed-width packing of small unsigned integers, and bitmaps (set-bit positions).
Behind the index parts of optim/sparsify.py and optim/index_coding.py.

Layout: value i of a stream of `width`-bit values occupies bits [i*width, (i+1)*width) of the
byte string, bit b being bit (b % 8) of byte b // 8 (little-endian bit order: the first value
starts in the low bits of byte 0). The stream is padded with zero bits to a whole byte, so n
values take exactly ceil(n * width / 8) bytes.

How: 8 consecutive values fill exactly `width` bytes, so a (G, 8) block of values maps to a
(G, width) block of bytes with the same byte positions and shifts in every row; a value spans at
most 3 bytes (width <= 16, shift <= 7). Packing is 8 x 3 column adds (the bits of different
values never overlap, so adding is OR-ing), unpacking 8 column gathers. Work runs in pieces of
PIECE values, so temporaries stay a few tens of MB however long the stream.

A bitmap is the width-1 case read as positions: bit p (same bit order) is set for each p given,
ceil(num_bits / 8) bytes (the global `topk` bitmap, the unary quotients of the Rice code).
"""

from __future__ import annotations

import torch

from optim.quantize import CodecError, tensor_from_bytes, tensor_to_bytes

MAX_WIDTH = 16
PIECE = 1 << 21  # values per piece; a multiple of 8, so every piece starts on a byte boundary


def packed_size(count: int, width: int) -> int:
    """Bytes that `count` values of `width` bits take on the wire: ceil(count * width / 8)."""
    return -(-count * width // 8)


def _check_width(width: int) -> None:
    if not 1 <= width <= MAX_WIDTH:
        raise ValueError(f"bit width {width}: use 1..{MAX_WIDTH}")


def _layout(width: int) -> list[tuple[int, int]]:
    """(first byte, shift) of value j in a group of 8 values, j = 0..7."""
    return [(j * width >> 3, j * width & 7) for j in range(8)]


def pack_bits(values: torch.Tensor, width: int) -> bytes:
    """Integer (n,) values in [0, 2**width) -> exactly packed_size(n, width) bytes."""
    _check_width(width)
    values = values.reshape(-1)
    if values.numel() and (int(values.min()) < 0 or int(values.max()) >= 1 << width):
        raise ValueError(f"pack_bits: values must lie in [0, {1 << width}) for width {width}")
    pieces = [_pack_piece(piece, width) for piece in values.split(PIECE)]
    return b"".join(pieces)[: packed_size(values.numel(), width)]


def _pack_piece(values: torch.Tensor, width: int) -> bytes:
    groups = -(-values.numel() // 8)
    padded = torch.zeros(groups * 8, dtype=torch.int32)
    padded[: values.numel()] = values  # zero values make the padding bits zero
    padded = padded.view(groups, 8)
    out = torch.zeros(groups, width + 2, dtype=torch.int32)  # 2 spare columns: spill of value 7 (always 0)
    for j, (byte, shift) in enumerate(_layout(width)):
        shifted = padded[:, j] << shift  # < 2**23: three bytes
        for t in range(3):
            out[:, byte + t] += (shifted >> (8 * t)) & 0xFF
    return tensor_to_bytes(out[:, :width].to(torch.uint8))


def unpack_bits(payload: bytes | memoryview, width: int, count: int) -> torch.Tensor:
    """Inverse of pack_bits: int64 (count,) values. Raises CodecError when the payload is not
    exactly packed_size(count, width) bytes or its padding bits are not zero."""
    _check_width(width)
    if len(payload) != packed_size(count, width):
        raise CodecError(f"bit-packed stream: expected {packed_size(count, width)} bytes for {count} "
                         f"values of {width} bits, got {len(payload)}")
    piece_bytes = PIECE * width // 8
    pieces = [_unpack_piece(payload[start : start + piece_bytes], width)
              for start in range(0, len(payload), piece_bytes)]
    values = torch.cat(pieces) if pieces else torch.empty(0, dtype=torch.int64)
    # The values decoded past `count` are exactly the padding bits (plus zeros we appended).
    if bool(values[count:].any()):
        raise CodecError(f"bit-packed stream: padding bits after the {count} values of {width} bits are not zero")
    return values[:count]


def _unpack_piece(payload: memoryview | bytes, width: int) -> torch.Tensor:
    groups = -(-len(payload) // width)
    # (groups, width + 2): the payload zero-extended to whole groups, plus 2 columns that value 7's
    # 3-byte read may touch; its bits end at the row's end, so they are masked off anyway.
    rows = torch.zeros(groups, width + 2, dtype=torch.int32)
    body = torch.zeros(groups * width, dtype=torch.int32)
    body[: len(payload)] = tensor_from_bytes(payload, torch.uint8)
    rows[:, :width] = body.view(groups, width)
    mask = (1 << width) - 1
    out = torch.empty(groups, 8, dtype=torch.int64)
    for j, (byte, shift) in enumerate(_layout(width)):
        word = rows[:, byte] | (rows[:, byte + 1] << 8) | (rows[:, byte + 2] << 16)
        out[:, j] = (word >> shift) & mask
    return out.view(-1)


_BIT_WEIGHTS = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8)
_POPCOUNT = torch.tensor([bin(byte).count("1") for byte in range(256)], dtype=torch.int64)


def pack_bitmap(positions: torch.Tensor, num_bits: int) -> bytes:
    """Distinct int64 (n,) positions in [0, num_bits) -> ceil(num_bits / 8) bytes with exactly those
    bits set (bit p is bit p % 8 of byte p // 8)."""
    bits = torch.zeros(-(-num_bits // 8) * 8, dtype=torch.uint8)
    bits[positions] = 1
    return tensor_to_bytes((bits.view(-1, 8) * _BIT_WEIGHTS).sum(dim=1, dtype=torch.uint8))


def bitmap_positions(payload: bytes | memoryview) -> torch.Tensor:
    """Inverse of pack_bitmap: int64 (n,) positions of the set bits, increasing."""
    packed = tensor_from_bytes(payload, torch.uint8)
    nonzero = packed.nonzero().view(-1)  # (z,) only bytes with a set bit are expanded
    bits = (packed[nonzero, None] >> torch.arange(8, dtype=torch.uint8)) & 1  # (z, 8)
    at = bits.nonzero()  # (n, 2): row in `nonzero`, bit within the byte; row-major: increasing
    return nonzero[at[:, 0]] * 8 + at[:, 1]


def popcounts(payload: bytes | memoryview) -> torch.Tensor:
    """int64 (len(payload),) number of set bits of each byte."""
    return _POPCOUNT[tensor_from_bytes(payload, torch.uint8).to(torch.int64)]
