"""Codecs decode strictly (optim/codecs.py and the formats under it): a truncated, extended,
bit-flipped, malformed or foreign payload is a CodecError naming the problem, never another
exception and never a silently wrong vector; non-finite values pass or are refused by format.
Sizes, error bounds and error feedback: tests/test_codecs.py."""

from __future__ import annotations

import struct

import pytest
import torch

from optim.codecs import HEADER_SIZE, CodecError, build
from tests.helpers import ALL_CODEC_SPECS as ALL_SPECS, chunk_gaps, rice_stream, round_trip, vector

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# A payload of the wrong length: past the receiver's bound, shorter than a header, or not the
# length its own header and index part say; per-chunk codecs may find a cut index part first.
SIZE_PROBLEM = r"expected (exactly|at most|at least)|fewer than"


# --- strict decoding ---------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", ALL_SPECS)
def test_truncated_extended_and_header_bit_flips_raise_codec_error(spec: str) -> None:
    codec, d = build(spec), 1000
    payload = codec.encode(vector(d))
    for bad in (payload[:-1], payload + b"\0", b"", payload[:HEADER_SIZE]):
        with pytest.raises(CodecError, match=SIZE_PROBLEM):
            codec.decode(bad, d)
    for bit in range(8 * HEADER_SIZE):
        flipped = bytearray(payload)
        flipped[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(CodecError):
            codec.decode(bytes(flipped), d)
    with pytest.raises(CodecError, match=SIZE_PROBLEM):
        codec.decode(payload, 2 * d)  # the receiver's layout decides the size, not the payload


def test_payload_from_another_codec_of_the_same_size_is_refused() -> None:
    payload = build("fp16").encode(vector(100))
    with pytest.raises(CodecError, match="different codec"):
        build("bf16").decode(payload, 100)


def move_offset(spec: str, d: int, i: int, to: int):  # noqa: ANN201 - an edit for corrupt()
    """Offset i (of the flat per-chunk offsets) moved to `to` by changing its gap alone, the index
    part re-coded as optim/index_coding.py lays it out (so the bytes stay well-formed and only
    the offsets' meaning is wrong)."""
    codec = build(spec)
    sparsifier = codec.sparsifier
    code, m = sparsifier.offset_code, sparsifier.num_values(d)

    def edit(payload: bytearray) -> None:
        index = bytes(payload[HEADER_SIZE : len(payload) - codec.values.size(m)])
        span = d if spec.startswith("chunk") else code.chunk * -(-d // code.chunk)
        offsets = code.decode(index, span).tolist()
        gaps = chunk_gaps(offsets, code.k)
        gaps[i] += to - offsets[i]
        payload[HEADER_SIZE : len(payload) - codec.values.size(m)] = rice_stream(gaps, code.parameter)

    return edit


def corrupt(spec: str, d: int, edit) -> bytes:  # noqa: ANN001 - edit(bytearray) -> None
    payload = bytearray(build(spec).encode(vector(d, seed=9)))
    edit(payload)
    return bytes(payload)


@pytest.mark.parametrize(
    ("spec", "d", "edit", "message"),
    [
        # topk:0.01 of 1000: header, 10 uint16 offsets at [4, 24), then 10 float32 values
        ("topk:0.01", 1000, lambda p: struct.pack_into("<H", p, 4 + 18, 1000), "out of range"),
        ("topk:0.01", 1000, lambda p: struct.pack_into("<HH", p, 4, 7, 7), "strictly increasing"),
        ("topk:0.01", 200_000, lambda p: struct.pack_into("<I", p, 4 + 4000, 70000), "segment counts"),
        ("topk:0.01", 200_000, lambda p: struct.pack_into("<i", p, 4 + 4000, -1), "segment counts"),
        ("topk:0.5", 1000, lambda p: p.__setitem__(4, p[4] ^ 1), "bits set"),  # bitmap popcount
        ("topk:0.5", 1001, lambda p: p.__setitem__(4 + 125, 0x80), "past the end"),
        # per-chunk offsets, Rice-coded gaps after the header (tests/test_index_coding.py has the rest);
        # gaps are >= 0, so offsets strictly increase by construction: only the range can be wrong
        ("chunk-topk:100:4", 1000, move_offset("chunk-topk:100:4", 1000, 7, 100), "chunk-topk:100:4: an offset is >= .*chunk size 100"),
        ("dct-topk:100:4", 1000, move_offset("dct-topk:100:4", 1000, 39, 127), "dct-topk:100:4: an offset is >= .*chunk size 100"),
        ("chunk-topk:64:4", 1000, move_offset("chunk-topk:64:4", 1000, 63, 40), "the vector ends at 1000"),  # last chunk: 40
        # 70 offsets, b = 3: the remainders' 210 bits fill 27 bytes, the top 6 bits of byte 4 + 26 are padding
        ("chunk-topk:100:7", 1000, lambda p: p.__setitem__(4 + 26, p[4 + 26] | 0x80), "padding bits"),
        ("dct-topk:100:7", 1000, lambda p: p.__setitem__(4 + 26, p[4 + 26] | 0x04), "padding bits"),
        ("int8", 1000, lambda p: struct.pack_into("<f", p, 4, float("nan")), "scale"),
        ("int8", 1000, lambda p: struct.pack_into("<f", p, 8, -1.0), "scale"),
        ("int8", 1000, lambda p: p.__setitem__(-1, 255), "code"),  # q = 128 > 127
        ("int4", 1000, lambda p: p.__setitem__(-1, 0xF0), "code"),  # nibble 15 -> q = 8 > 7
        ("int2", 1000, lambda p: p.__setitem__(-1, 0x03), "code"),  # 3 -> q = 2 > 1
        ("int4", 1001, lambda p: p.__setitem__(-1, p[-1] | 0x10), "padding bits"),
        ("sign", 1001, lambda p: p.__setitem__(-1, p[-1] | 0x02), "padding bits"),  # bit of value 1001
        ("sign", 1000, lambda p: struct.pack_into("<f", p, 4, float("inf")), "scale"),
    ],
)
def test_malformed_bodies_raise_codec_error(spec: str, d: int, edit, message: str) -> None:  # noqa: ANN001
    with pytest.raises(CodecError, match=message):
        build(spec).decode(corrupt(spec, d, edit), d)


@pytest.mark.parametrize("spec", ALL_SPECS)
def test_random_corruption_gives_codec_error_or_a_vector_never_another_exception(spec: str) -> None:
    codec, d = build(spec), 700
    payload = codec.encode(vector(d), seed=1)
    generator = torch.Generator().manual_seed(0)
    for _ in range(60):
        mutated = bytearray(payload)
        for position in torch.randint(HEADER_SIZE, len(payload), (3,), generator=generator).tolist():
            mutated[position] = int(torch.randint(0, 256, (1,), generator=generator))
        try:
            out = codec.decode(bytes(mutated), d, seed=1)
        except CodecError:
            continue
        assert out.shape == (d,)


@pytest.mark.parametrize("spec", ["fp32", "fp16", "bf16", "topk:0.1", "randk:0.5"])
def test_nan_passes_through_float_formats(spec: str) -> None:
    x = vector(100)
    x[0] = float("nan")
    x[1] = float("inf")
    y = round_trip(spec, x, seed=2)
    kept = round_trip(spec, vector(100), seed=2) != 0  # same support rule (topk: NaN/inf rank as largest)
    assert torch.isnan(y[0]) or not kept[0]
    assert not torch.isfinite(y).all() or not (kept[0] or kept[1])


@pytest.mark.parametrize("spec", ["int8", "int4", "int2", "sign", "topk:0.1+int8", "dct-topk:64:4+int8", "dct-topk:64:4"])
def test_non_finite_input_to_int_or_dct_formats_encodes_then_is_refused_or_non_finite(spec: str) -> None:
    x = vector(200)
    x[5] = float("nan")
    codec = build(spec)
    payload = codec.encode(x)  # must not crash
    try:
        y = codec.decode(payload, 200)
    except CodecError as exc:
        assert "scale" in str(exc)
    else:
        assert not torch.isfinite(y).all()  # dct-topk (fp32 values): NaN spreads, the network layer rejects it
