"""Sparsifiers (optim/sparsify.py, dct.py, index_coding.py through the codecs): which coordinates each
keeps, randk's shared index sets, the DCT, and the Rice-coded per-chunk offsets on the wire."""

from __future__ import annotations

import math

import pytest
import torch

from optim import dct
from optim.codecs import HEADER_SIZE, CodecError, build
from optim.sparsify import ChunkTopK, DctTopK, random_index_set
from tests.helpers import ceil_div, chunk_gaps, rice_stream, round_trip, vector

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# --- sparsifiers ----------------------------------------------------------------------------------

def test_topk_keeps_exactly_the_k_largest_magnitudes() -> None:
    x = vector(1000, seed=1)
    y = round_trip("topk:0.05", x)  # k = 50
    kept = y.nonzero().view(-1)
    assert set(kept.tolist()) == set(x.abs().topk(50).indices.tolist())
    assert torch.equal(y[kept], x[kept])
    x_big = vector(200_000, seed=2)  # several 65536-segments
    y_big = round_trip("topk:0.01", x_big)
    assert set(y_big.nonzero().view(-1).tolist()) == set(x_big.abs().topk(2000).indices.tolist())
    y_bitmap = round_trip("topk:0.4", x)
    assert set(y_bitmap.nonzero().view(-1).tolist()) == set(x.abs().topk(400).indices.tolist())


def test_chunk_topk_keeps_the_largest_per_chunk_including_a_short_last_chunk() -> None:
    x = vector(1000, seed=3)
    y = round_trip("chunk-topk:64:5", x)
    for start in range(0, 1000, 64):
        chunk, out = x[start : start + 64], y[start : start + 64]
        expected = set(chunk.abs().topk(min(5, chunk.numel())).indices.tolist())
        assert set(out.nonzero().view(-1).tolist()) == expected
    assert torch.equal(round_trip("chunk-topk:64:50", x)[960:], x[960:])  # 40 left, all kept


def test_randk_index_set_depends_on_seed_only() -> None:
    a, b = vector(5000, seed=4), vector(5000, seed=5)
    support = lambda y: y.nonzero().view(-1)  # noqa: E731
    ya, yb = round_trip("randk:0.02", a, seed=11), round_trip("randk:0.02", b, seed=11)
    assert support(ya).numel() == 100 and torch.equal(support(ya), support(yb))
    assert torch.equal(ya[support(ya)], a[support(ya)])
    other = support(round_trip("randk:0.02", a, seed=12))
    assert len(set(other.tolist()) & set(support(ya).tolist())) < 20  # ~2 expected by chance
    # golden values: the set must not change across torch versions or machines (pure int math)
    assert random_index_set(7, 70000, 700)[:5].tolist() == [56, 135, 326, 364, 499]
    assert random_index_set(7, 5, 3).tolist() == [0, 1, 4]


def test_randk_index_sets_are_uniform_and_large_fractions_work() -> None:
    counts = torch.zeros(100)
    for seed in range(1000):
        chosen = random_index_set(seed, 100, 10)
        assert chosen.unique().numel() == 10
        counts[chosen] += 1
    assert counts.sum() == 10000 and 55 < counts.min() and counts.max() < 145  # binomial(1000, .1): 100 +- 9.5
    many = random_index_set(3, 1000, 900)  # complement construction
    assert many.numel() == 900 and torch.equal(many, many.unique())


def test_dct_is_orthonormal_with_known_values() -> None:
    basis = dct.dct_matrix(8)
    assert torch.allclose(basis @ basis.T, torch.eye(8, dtype=torch.float64), atol=1e-12)
    ones = torch.ones(2, 8)
    assert torch.allclose(dct.dct(ones), torch.tensor([[math.sqrt(8)] + [0.0] * 7] * 2), atol=1e-6)
    # X_1 of x_j = cos(pi (2j+1) / 16) is sqrt(8/2) = 2 (energy of the basis vector with scale 1/2 each)
    j = torch.arange(8, dtype=torch.float32)
    assert torch.allclose(dct.dct(torch.cos(math.pi * (2 * j + 1) / 16)[None])[0, 1], torch.tensor(2.0))
    x = vector(300)
    assert torch.allclose(dct.from_chunks(dct.idct(dct.dct(dct.to_chunks(x, 64))), 300), x, atol=1e-6)
    assert dct.to_chunks(x, 64).shape == (5, 64) and torch.equal(dct.to_chunks(x, 64).view(-1)[300:], torch.zeros(20))


def test_dct_topk_is_exact_on_signals_sparse_in_the_dct_domain() -> None:
    generator = torch.Generator().manual_seed(6)
    coefficients = torch.zeros(16, 64)
    for row in coefficients:
        row[torch.randperm(64, generator=generator)[:4]] = torch.randn(4, generator=generator) * 5
    x = dct.idct(coefficients).view(-1)  # (1024,), 4-sparse per chunk in the DCT domain
    assert torch.allclose(round_trip("dct-topk:64:4", x), x, atol=1e-5)
    assert ((round_trip("dct-topk:64:4+int8", x) - x).norm() / x.norm()) < 0.01
    y = round_trip("dct-topk:64:2", x)  # dropping half the energy-carrying terms loses signal
    assert ((y - x).norm() / x.norm()) > 0.1


# --- per-chunk offsets: bit-packed at ceil(log2(CHUNK)) bits (optim/bitpack.py) --------------------

@pytest.mark.parametrize(
    ("chunk", "k", "d"), [(3, 2, 3 * 50 + 1), (64, 4, 64 * 9 + 40), (100, 7, 100 * 6 + 3), (4096, 64, 4096 * 2 + 1808)]
)
def test_per_chunk_offsets_round_trip_exactly_including_a_short_last_chunk(chunk: int, k: int, d: int) -> None:
    x = vector(d, seed=chunk)
    index_bytes, kept = ChunkTopK(chunk, k).encode(x, 0)
    y = ChunkTopK(chunk, k).decode(memoryview(index_bytes), kept, d, 0)
    expected = torch.zeros(d)
    for start in range(0, d, chunk):  # the short last chunk keeps min(k, its length)
        part = x[start : start + chunk]
        top = part.abs().topk(min(k, part.numel())).indices + start
        expected[top] = x[top]
    assert torch.equal(y, expected)

    offsets, values = dct.top_coefficients(x, chunk, k)  # (num_chunks, k) each
    sparsifier = DctTopK(chunk, k)
    index_bytes, kept = sparsifier.encode(x, 0)
    assert index_bytes == rice_stream(chunk_gaps(offsets.view(-1).tolist(), k), sparsifier.offset_code.parameter)
    y = sparsifier.decode(memoryview(index_bytes), kept, d, 0)
    assert torch.equal(y, dct.from_coefficients(offsets, values, chunk, d))


@pytest.mark.parametrize(
    ("spec", "values_bytes", "min_ratio"),
    [
        ("chunk-topk:4096:64+stat2", lambda m: 16 * ceil_div(m, 4096) + ceil_div(m, 4), 140),  # SparseLoCo
        ("dct-topk:64:4+sign", lambda m: 4 * ceil_div(m, 64) + ceil_div(m, 8), 65),  # DeMo
        ("dct-topk:64:8+sign", lambda m: 4 * ceil_div(m, 64) + ceil_div(m, 8), 33),
    ],
)
def test_recipe_codecs_payload_size_and_ratio(spec: str, values_bytes, min_ratio: float) -> None:  # noqa: ANN001
    d = 445_952  # a small model's parameter count; the short last chunk of 4096 holds 3584
    chunk, k = (int(n) for n in spec.split("+")[0].split(":")[1:])
    m = k * ceil_div(d, chunk)  # every chunk, the short last one too, keeps k here
    codec = build(spec)
    payload = codec.encode(vector(d))
    index_bytes = len(payload) - HEADER_SIZE - values_bytes(m)
    assert index_bytes <= codec.sparsifier.max_index_size(d) < ceil_div(m * 12 if chunk == 4096 else m * 6, 8)  # fixed width: 12 / 6 bits
    assert 4 * d / len(payload) > min_ratio
    assert codec.decode(payload, d).shape == (d,)


@pytest.mark.parametrize("sparsifier", [ChunkTopK(64, 4), DctTopK(64, 4), ChunkTopK(100, 3), DctTopK(4096, 64)])
def test_per_chunk_decoders_refuse_a_wrong_index_length(sparsifier) -> None:  # noqa: ANN001
    d = 1000
    index_bytes, kept = sparsifier.encode(vector(d), 0)
    size = len(index_bytes)
    assert sparsifier.index_length(memoryview(index_bytes + b"\xff" * 3), d) == size
    for wrong, why in ((index_bytes[:-1], "fewer than"), (index_bytes + b"\0", f"its streams end at {size}"), (b"", "fewer than")):
        with pytest.raises(CodecError, match=f"{sparsifier.name}: .*{why}"):
            sparsifier.decode(memoryview(wrong), kept, d, 0)
