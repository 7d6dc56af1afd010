"""optim/index_coding.py: the Rice-coded per-chunk offsets of chunk-topk / dct-topk. Layout against
a bit-by-bit reference, exact round trips, the measured size against the fixed 12 bits and the
entropy, the hard upper bound, and strict decoding of malformed streams."""

from __future__ import annotations

import math
import time

import pytest
import torch

from optim.codecs import CodecError, build
from optim.index_coding import RiceOffsets, rice_parameter
from optim.sparsify import ChunkTopK, largest_k
from tests.helpers import ceil_div, chunk_gaps, rice_stream, vector

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def random_offsets(code: RiceOffsets, span: int, seed: int) -> torch.Tensor:
    """(m,) a uniformly random set of min(K, length) offsets in every chunk, increasing per chunk."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for start in range(0, span, code.chunk):
        length = min(code.chunk, span - start)
        rows.append(torch.randperm(length, generator=generator)[: min(code.k, length)].sort().values)
    return torch.cat(rows) if rows else torch.empty(0, dtype=torch.int64)


def gaussian_top_k_bits(chunk: int, k: int, chunks: int = 200) -> float:
    """Index bits per kept offset for the top-K per chunk of a gaussian vector."""
    x = vector(chunk * chunks, seed=k)
    index_bytes, _ = ChunkTopK(chunk, k).encode(x, 0)
    return 8 * len(index_bytes) / (k * chunks)


# --- layout and round trips -------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("chunk", "k", "span"),
    [(64, 4, 64 * 3 + 10), (100, 7, 1000), (4096, 64, 4096 * 2 + 1808), (8, 1, 8 * 5 + 3), (16, 16, 16 * 4 + 5),
     (4096, 192, 1000), (3, 2, 3 * 50 + 1), (1, 1, 17), (65536, 5, 70_000)],
)
def test_encoder_writes_the_reference_layout_and_decodes_it_back(chunk: int, k: int, span: int) -> None:
    code = RiceOffsets(chunk, k)
    offsets = random_offsets(code, span, seed=span)
    assert offsets.numel() == code.count(span)
    data = code.encode(offsets)
    assert data == rice_stream(chunk_gaps(offsets.tolist(), k), code.parameter)
    assert data == code.encode(offsets.clone())  # deterministic: owners sign identical bytes
    assert code.length(data + b"\xff\x01" * 7, span) == len(data) <= code.max_size(span)
    assert torch.equal(code.decode(data, span), offsets)


@pytest.mark.parametrize(
    ("spec", "d"),
    [("chunk-topk:4096:64", 4096 * 3 + 100), ("chunk-topk:4096:64", 1000), ("chunk-topk:4096:64", 64),
     ("chunk-topk:4096:64", 10), ("chunk-topk:64:64", 64 * 5 + 7), ("chunk-topk:64:1", 64 * 5 + 7),
     ("dct-topk:64:4", 1000), ("dct-topk:64:64", 300), ("chunk-topk:4096:192+stat2", 4096 * 4 + 3)],
)
def test_codec_round_trip_keeps_exactly_the_top_k_per_chunk(spec: str, d: int) -> None:
    codec = build(spec)
    x = vector(d, seed=d)
    payload = codec.encode(x)
    assert payload == codec.encode(x.clone())
    y = codec.decode(payload, d)
    if spec.startswith("dct") or "+" in spec:
        assert y.shape == (d,)
        return
    chunk, k = (int(n) for n in spec.split(":")[1:])
    for start in range(0, d, chunk):
        part = x[start : start + chunk]
        top = set((part.abs().topk(min(k, part.numel())).indices + start).tolist())
        assert set(y[start : start + chunk].nonzero().view(-1).add(start).tolist()) == top
    assert torch.equal(y[y != 0], x[y != 0])


def test_ties_round_trip_to_the_lower_indices() -> None:
    x = torch.zeros(4096 * 2 + 50)
    x[::3] = 1.0  # equal magnitudes: each chunk keeps its first 64 multiples of 3
    codec = build("chunk-topk:4096:64")
    y = codec.decode(codec.encode(x), x.numel())
    assert y[:4096].nonzero().view(-1).tolist() == list(range(0, 192, 3))
    assert y[4096:8192].nonzero().view(-1).add(4096).tolist() == list(range(4098, 4098 + 192, 3))
    assert y[8192:].nonzero().view(-1).add(8192).tolist() == list(range(8193, 8242, 3))  # the short chunk: all 17


# --- size ---------------------------------------------------------------------------------------------

def entropy_bits(chunk: int, k: int) -> float:
    """log2 C(chunk, k) / k: the fewest bits per offset a code of uniformly random k-sets can average."""
    return (math.lgamma(chunk + 1) - math.lgamma(k + 1) - math.lgamma(chunk - k + 1)) / math.log(2) / k


@pytest.mark.parametrize(("k", "bound"), [(64, 7.7), (192, 6.1)])
def test_gaussian_top_k_takes_far_fewer_bits_than_twelve_and_near_the_entropy(k: int, bound: float) -> None:
    bits = gaussian_top_k_bits(4096, k)
    assert bits < bound < 12
    assert entropy_bits(4096, k) < bits < 1.04 * entropy_bits(4096, k)  # 7.38 / 7.50 and 5.76 / 5.86 measured


def test_rice_parameter_is_the_measured_best_or_within_a_twentieth_of_a_bit() -> None:
    assert [rice_parameter(4096, k) for k in (1, 4, 16, 64, 192, 512, 2048, 4096)] == [11, 9, 7, 5, 4, 2, 0, 0]
    for k in (16, 64, 192, 512):
        offsets = largest_k(vector(4096 * 100, seed=k).abs().view(-1, 4096), k)  # (100, k)
        gaps = torch.tensor(chunk_gaps(offsets.view(-1).tolist(), k))
        bits = {b: (b + 1) * gaps.numel() + int((gaps >> b).sum()) for b in range(13)}
        assert bits[rice_parameter(4096, k)] <= min(bits.values()) + 0.05 * gaps.numel(), k


@pytest.mark.parametrize(("chunk", "k"), [(4096, 64), (4096, 192), (4096, 1), (4096, 4096), (100, 7), (64, 4), (65536, 3)])
def test_max_size_is_never_exceeded_and_is_reached_by_offsets_at_the_chunk_ends(chunk: int, k: int) -> None:
    for span in (chunk * 3, chunk * 3 + chunk // 3 + 1, max(1, chunk // 2), 1):
        code = RiceOffsets(chunk, k)
        most = code.max_size(span)
        ends, starts, spread, one_gap = [], [], [], []
        for start in range(0, span, chunk):
            length = min(chunk, span - start)
            n = min(k, length)
            ends.append(torch.arange(length - n, length))  # one gap of length - n, then zeros
            starts.append(torch.arange(n))  # all gaps zero
            spread.append(torch.linspace(0, length - 1, n).round().long().unique())  # even gaps
            one_gap.append(torch.cat([torch.arange(n - 1), torch.tensor([length - 1])]) if n > 1 else torch.tensor([length - 1]))
        for name, rows in (("ends", ends), ("starts", starts), ("one gap", one_gap), ("random", None)):
            offsets = random_offsets(code, span, seed=span) if rows is None else torch.cat(rows)
            data = code.encode(offsets)
            assert len(data) <= most, (name, span)
            assert torch.equal(code.decode(data, span), offsets)
        assert len(code.encode(torch.cat(ends))) == most  # the bound is tight
        if all(row.numel() == min(k, min(chunk, span - c * chunk)) for c, row in enumerate(spread)):
            assert len(code.encode(torch.cat(spread))) <= most


def test_bound_in_bits_is_k_times_b_plus_1_plus_the_quotients_of_the_free_room() -> None:
    code, d = RiceOffsets(4096, 64), 4096 * 108 + 3632  # 446,000 values: the short last chunk keeps 64 too
    b = code.parameter
    bits = 109 * 64 * (b + 1) + 108 * ((4096 - 64) >> b) + ((3632 - 64) >> b)
    assert code.max_size(d) == ceil_div(109 * 64 * b, 8) + ceil_div(bits - 109 * 64 * b, 8)


# --- strict decoding ------------------------------------------------------------------------------------

CODE, SPAN = RiceOffsets(100, 7), 1000  # b = 3, 70 offsets: remainders 210 bits in 27 bytes (6 padding bits)


def valid() -> tuple[list[int], bytes]:
    offsets = random_offsets(CODE, SPAN, seed=5)
    return chunk_gaps(offsets.tolist(), CODE.k), CODE.encode(offsets)


def with_gap(gaps: list[int], i: int, value: int) -> list[int]:
    return gaps[:i] + [value] + gaps[i + 1 :]


def test_the_strict_decoding_fixture_is_what_it_says() -> None:
    gaps, data = valid()
    assert CODE.parameter == 3 and CODE.count(SPAN) == 70 == len(gaps) and ceil_div(70 * 3, 8) == 27
    assert data == rice_stream(gaps, 3)


def malformed() -> list[tuple[str, bytes, str]]:
    gaps, data = valid()
    last_offset_of_chunk_0 = sum(g + 1 for g in gaps[:7]) - 1
    return [
        ("truncated by a byte", data[:-1], "fewer than 70 set bits"),
        ("only the remainders", data[:27], "fewer than the 27 of the remainders"),
        ("empty", b"", "fewer than the 27"),
        ("a trailing byte", data + b"\0", "its streams end at"),
        ("trailing bytes with set bits", data + b"\xff\xff", "its streams end at"),
        ("an all-zero unary stream", data[:27] + bytes(len(data) - 27), "fewer than 70 set bits"),
        ("an all-zero stream as long as the bound", bytes(CODE.max_size(SPAN)), "fewer than 70 set bits"),
        ("too few terminators", data[:27] + rice_stream(gaps[:-1], 3)[26:], "fewer than 70 set bits"),  # 69 of them
        ("a terminator too many", rice_stream(gaps + [0], 3), "71 set bits, expected 70"),  # in the last byte, as the 70th
        ("a quotient pushing chunk 0 past its end", rice_stream(with_gap(gaps, 6, gaps[6] + 100 - last_offset_of_chunk_0), 3),
         "chunk size 100"),
        ("a quotient pushing the last chunk past its end", rice_stream(with_gap(gaps, 69, gaps[69] + 100), 3), "chunk size 100"),
        ("nonzero remainder padding", data[:26] + bytes([data[26] | 0x80]) + data[27:], "padding bits"),
    ]


@pytest.mark.parametrize("case", range(12))
def test_malformed_streams_raise_codec_error_naming_the_problem(case: int) -> None:
    name, data, message = malformed()[case]
    with pytest.raises(CodecError, match=message):
        CODE.decode(data, SPAN)


def test_an_offset_past_a_short_last_chunk_is_refused() -> None:
    code, span = RiceOffsets(64, 4), 64 * 3 + 10  # the last chunk holds 10 positions, keeps 4
    offsets = random_offsets(code, span, seed=1)
    gaps = chunk_gaps(offsets.tolist(), 4)
    last = offsets[-1].item()
    with pytest.raises(CodecError, match="the vector ends at 202"):
        code.decode(rice_stream(with_gap(gaps, 15, gaps[15] + 10 - last), code.parameter), span)
    assert torch.equal(code.decode(rice_stream(with_gap(gaps, 15, gaps[15] + 9 - last), code.parameter), span)[-1], torch.tensor(9))


@pytest.mark.parametrize("spec", ["chunk-topk:4096:64+stat2", "chunk-topk:100:7", "dct-topk:64:4+int8"])
def test_random_bytes_behind_a_valid_header_are_refused_or_decode_in_range_never_another_error(spec: str) -> None:
    codec, d = build(spec), 9000
    payload = codec.encode(vector(d))
    generator = torch.Generator().manual_seed(0)
    refused = {0: 0, 1: 0, 2: 0}  # by kind of candidate
    for trial in range(120):
        length = int(torch.randint(4, codec.max_encoded_size(d) + 1, (1,), generator=generator))
        noise = torch.randint(0, 256, (length - 4,), generator=generator, dtype=torch.uint8).numpy().tobytes()
        if trial % 3 == 1:  # mostly the real stream, a few bytes changed
            mutated = bytearray(payload)
            for at in torch.randint(4, len(payload), (3,), generator=generator).tolist():
                mutated[at] = int(torch.randint(0, 256, (1,), generator=generator))
            candidate = bytes(mutated)
        elif trial % 3 == 2:  # all zero or all ones
            candidate = payload[:4] + (b"\0" if trial % 2 else b"\xff") * (length - 4)
        else:
            candidate = payload[:4] + noise
        try:
            y = codec.decode(candidate, d)
        except CodecError:
            refused[trial % 3] += 1
            continue
        assert y.shape == (d,)
    assert refused[0] == refused[2] == 40  # noise or constant bytes of a random length: never a payload
    assert refused[1] > 0  # a few bytes changed: refused where they hit the index part or its length


def test_decoding_the_longest_garbage_stays_fast() -> None:
    codec, d = build("chunk-topk:4096:64+stat2"), 10_000_000
    most = codec.max_encoded_size(d)
    payload = bytearray(codec.encode(torch.zeros(8)))[:4] + bytes(most - 4)  # no terminator anywhere
    start = time.perf_counter()
    with pytest.raises(CodecError, match="fewer than"):
        codec.decode(bytes(payload), d)
    with pytest.raises(CodecError, match="at most"):
        codec.decode(bytes(payload) + b"\0", d)  # past the bound: refused before reading
    assert time.perf_counter() - start < 2.0
