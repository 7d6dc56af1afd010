"""optim/bitpack.py: the fixed-width bit streams and bitmaps behind the index parts of sparsify.py
and index_coding.py."""

from __future__ import annotations

import pytest
import torch

from optim import bitpack
from optim.bitpack import bitmap_positions, pack_bitmap, pack_bits, packed_size, popcounts, unpack_bits
from optim.quantize import CodecError


def reference_pack(values: list[int], width: int) -> bytes:
    """The layout read off the docstring, one bit at a time: value i in bits [i*w, (i+1)*w)."""
    stream = 0
    for i, value in enumerate(values):
        stream |= value << (i * width)
    return stream.to_bytes(packed_size(len(values), width), "little")


@pytest.mark.parametrize("width", range(1, 17))
def test_round_trip_and_layout_for_every_width(width: int) -> None:
    generator = torch.Generator().manual_seed(width)
    for count in (0, 1, 7, 8, 9, 61, 1000):
        values = torch.randint(0, 1 << width, (count,), generator=generator)
        payload = pack_bits(values, width)
        assert payload == reference_pack(values.tolist(), width)
        assert len(payload) == packed_size(count, width) == -(-count * width // 8)
        out = unpack_bits(memoryview(payload), width, count)
        assert out.dtype == torch.int64 and torch.equal(out, values)


def test_known_bytes() -> None:
    assert pack_bits(torch.tensor([1, 2, 3]), 2) == bytes([0b00111001])
    assert pack_bits(torch.tensor([63, 0, 1]), 6) == bytes([0b00111111, 0b00010000, 0])  # value 2 at bit 12
    assert pack_bits(torch.tensor([0xABC, 0x123]), 12) == bytes([0xBC, 0x3A, 0x12])


def test_streams_longer_than_a_piece_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bitpack, "PIECE", 16)  # the piece loop on a small stream: 5 pieces + a short one
    values = torch.randint(0, 1 << 7, (93,), generator=torch.Generator().manual_seed(0))
    payload = pack_bits(values, 7)
    assert payload == reference_pack(values.tolist(), 7)
    assert torch.equal(unpack_bits(payload, 7, 93), values)


def test_wrong_length_and_nonzero_padding_are_refused() -> None:
    payload = pack_bits(torch.tensor([5, 6, 7]), 3)  # 9 bits in 2 bytes: 7 padding bits
    with pytest.raises(CodecError, match="expected 2 bytes for 3 values of 3 bits, got 3"):
        unpack_bits(payload + b"\0", 3, 3)
    with pytest.raises(CodecError, match="expected 2 bytes"):
        unpack_bits(payload[:1], 3, 3)
    for bit in range(9, 16):
        bad = bytearray(payload)
        bad[1] |= 1 << (bit - 8)
        with pytest.raises(CodecError, match="padding bits after the 3 values of 3 bits are not zero"):
            unpack_bits(bytes(bad), 3, 3)


def test_values_and_widths_out_of_range_are_value_errors() -> None:
    with pytest.raises(ValueError, match=r"\[0, 8\)"):
        pack_bits(torch.tensor([8]), 3)
    with pytest.raises(ValueError, match=r"\[0, 8\)"):
        pack_bits(torch.tensor([-1]), 3)
    with pytest.raises(ValueError, match="1..16"):
        pack_bits(torch.tensor([1]), 17)


@pytest.mark.parametrize("num_bits", [0, 1, 7, 8, 9, 1000, 4099])
def test_bitmaps_set_exactly_the_given_bits_low_bit_first(num_bits: int) -> None:
    generator = torch.Generator().manual_seed(num_bits)
    for count in {0, num_bits // 3, num_bits}:
        positions = torch.randperm(num_bits, generator=generator)[:count].sort().values
        payload = pack_bitmap(positions, num_bits)
        assert payload == sum(1 << p for p in positions.tolist()).to_bytes(-(-num_bits // 8), "little")
        assert torch.equal(bitmap_positions(payload), positions)
        assert popcounts(payload).tolist() == [bin(byte).count("1") for byte in payload]
    assert bitmap_positions(bytes([0b10000001, 0, 0b00000100])).tolist() == [0, 7, 18]
