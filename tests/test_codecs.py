"""Codecs (optim/codecs.py, quantize.py, stat_quant.py): sizes, error bounds, spec parsing, error
feedback. Strict decoding of damaged payloads: tests/test_codec_decoding.py; which coordinates the
sparsifiers keep: tests/test_sparsify.py."""

from __future__ import annotations

import math
import struct

import pytest
import torch

from optim import codecs, dct
from optim.codecs import HEADER_SIZE, Codec, CodecError, ErrorFeedback, build
from tests.helpers import ALL_CODEC_SPECS as ALL_SPECS, ceil_div, chunk_gaps, rice_stream, round_trip, vector

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# --- sizes: header 4 bytes + index bytes + value bytes, nothing else ---------------------------------

@pytest.mark.parametrize(
    ("spec", "d", "expected"),
    [
        ("fp32", 1000, 4 + 4 * 1000),
        ("fp16", 1000, 4 + 2 * 1000),  # the brief's example: 2000 + header
        ("bf16", 1000, 4 + 2 * 1000),
        ("int8", 1000, 4 + 4 * ceil_div(1000, 64) + 1000),  # float32 scale per block of 64
        ("int4", 1001, 4 + 4 * ceil_div(1001, 64) + ceil_div(1001, 2)),
        ("int2", 1001, 4 + 4 * ceil_div(1001, 64) + ceil_div(1001, 4)),
        ("int8:128", 1000, 4 + 4 * 8 + 1000),
        ("topk:0.01", 1000, 4 + 2 * 10 + 4 * 10),  # k=10 uint16 offsets, one segment: no counts
        ("topk:0.01+int8", 1000, 4 + 2 * 10 + (4 + 10)),
        ("topk:0.01", 200_000, 4 + (2 * 2000 + 4 * 3) + 4 * 2000),  # 4 segments of 65536: 3 counts
        ("topk:0.5", 1000, 4 + 125 + 4 * 500),  # bitmap (125 bytes) beats 1000 bytes of offsets
        ("randk:0.1+fp16", 1000, 4 + 0 + 2 * 100),  # indices come from the seed: none on the wire
        ("sign", 1001, 4 + 4 * ceil_div(1001, 64) + ceil_div(1001, 8)),  # 1 bit + a scale per 64
        ("randk:0.2+sign", 1000, 4 + 0 + (4 * ceil_div(200, 64) + 25)),
        ("stat2", 1001, 4 + 16 * 1 + ceil_div(1001, 4)),  # a 4-entry float32 table per 4096 + 2 bits each
    ],
)
def test_encoded_size_is_exact(spec: str, d: int, expected: int) -> None:
    codec = build(spec)
    assert codec.max_encoded_size(d) == expected
    assert len(codec.encode(vector(d))) == expected


def kept_offsets(spec: str, x: torch.Tensor) -> list[int]:
    """The flat per-chunk offsets chunk-topk / dct-topk keep of x, chunk by chunk, increasing."""
    kind, chunk, k = spec.split("+")[0].split(":")
    chunk, k = int(chunk), int(k)
    if kind == "dct-topk":
        return dct.top_coefficients(x, chunk, k)[0].view(-1).tolist()
    return [o for start in range(0, x.numel(), chunk)
            for o in sorted(x[start : start + chunk].abs().topk(min(k, x[start : start + chunk].numel())).indices.tolist())]


@pytest.mark.parametrize(
    ("spec", "d", "values_bytes", "m"),
    [  # m kept values; the offsets Rice-coded at b = index_coding.rice_parameter(CHUNK, K) (3 at 64:4)
        ("chunk-topk:64:4", 1000, lambda m: 4 * m, 64),  # 15 full chunks + 40 left: 64 kept
        ("chunk-topk:64:50", 1000, lambda m: 4 * m, 790),  # short last chunk keeps its 40
        ("chunk-topk:300:20", 1000, lambda m: 4 * m, 80),
        ("dct-topk:64:4+int8", 1000, lambda m: 4 + m, 64),  # 16 chunks x 4 coefficients
        ("dct-topk:512:16", 1000, lambda m: 4 * m, 32),
        ("chunk-topk:32:1+sign", 1000, lambda m: 4 * 1 + 4, 32),  # 31 full chunks + 8 left: 32 kept
        ("chunk-topk:4096:64+stat2", 10_000, lambda m: 16 + ceil_div(m, 4), 192),  # 2 full + 1808 left
    ],
)
def test_per_chunk_sizes_are_header_rice_coded_offsets_and_values(spec: str, d: int, values_bytes, m: int) -> None:  # noqa: ANN001
    codec, x = build(spec), vector(d)
    offsets = kept_offsets(spec, x)
    k = int(spec.split("+")[0].split(":")[2])
    assert len(offsets) == m
    expected = HEADER_SIZE + len(rice_stream(chunk_gaps(offsets, k), codec.sparsifier.offset_code.parameter)) + values_bytes(m)
    payload = codec.encode(x)
    assert len(payload) == expected <= codec.max_encoded_size(d)
    assert codec.encoded_length(payload + bytes(5), d) == expected


@pytest.mark.parametrize("spec", ALL_SPECS)
@pytest.mark.parametrize("d", [0, 1, 7, 65, 1000])
def test_every_codec_round_trips_any_length_deterministically(spec: str, d: int) -> None:
    codec = build(spec)
    x = vector(d, seed=d)
    payload = codec.encode(x, seed=3)
    assert payload == codec.encode(x.clone(), seed=3)
    y = codec.decode(payload, d, seed=3)
    assert y.shape == (d,) and y.dtype == torch.float32
    assert isinstance(codec, Codec)
    assert codec.lossless == (spec == "fp32")


# --- error bounds -------------------------------------------------------------------------------

def test_fp32_is_exact_and_fp16_bf16_relative_error() -> None:
    x = vector(5000) * 10
    assert torch.equal(round_trip("fp32", x), x)
    assert ((round_trip("fp16", x) - x).abs() <= x.abs() * 2**-11 + 2**-24).all()  # half an fp16 ulp
    assert ((round_trip("bf16", x) - x).abs() <= x.abs() * 2**-8).all()


@pytest.mark.parametrize(("bits", "block"), [(8, 64), (4, 64), (2, 64), (8, 128), (4, 7)])
def test_blockwise_absmax_error_is_at_most_half_a_scale(bits: int, block: int) -> None:
    x = vector(1000, seed=bits) * torch.logspace(-3, 2, 1000)  # blocks of very different magnitude
    y = round_trip(f"int{bits}:{block}", x)
    qmax = 2 ** (bits - 1) - 1
    padded = torch.nn.functional.pad(x, (0, ceil_div(1000, block) * block - 1000)).view(-1, block)
    scale = (padded.abs().amax(dim=1) / qmax).repeat_interleave(block)[:1000]  # (d,)
    assert ((y - x).abs() <= scale / 2 * (1 + 1e-5)).all()
    levels = (y / torch.where(scale > 0, scale, 1)).round()
    assert torch.allclose(y, levels * scale, rtol=1e-6) and levels.abs().max() <= qmax
    # each block's largest-magnitude value is represented exactly (q = +-qmax)
    peaks = padded.abs().argmax(dim=1) + torch.arange(padded.shape[0]) * block
    peaks = peaks[peaks < 1000]
    assert torch.allclose(y[peaks], x[peaks], rtol=1e-6)


def test_int2_is_ternary_and_zero_blocks_stay_zero() -> None:
    x = torch.cat([torch.tensor([3.0, -1.0, 0.5, -3.0]), torch.zeros(64)])
    y = round_trip("int2:4", x)
    assert y[:4].tolist() == [3.0, 0.0, 0.0, -3.0]  # scale 3: |-1|/3 and 0.5/3 round to 0
    assert torch.equal(y[4:], torch.zeros(64))


def test_sign_is_mean_magnitude_times_sign_per_block() -> None:
    # blocks of 4: [3, -1, 0.5, -3] -> mean |x| 1.875; short last block [1, -2] -> 1.5 (its own mean)
    x = torch.tensor([3.0, -1.0, 0.5, -3.0, 1.0, -2.0])
    y = round_trip("sign:4", x)
    assert y.tolist() == [1.875, -1.875, 1.875, -1.875, 1.5, -1.5]
    assert torch.equal(round_trip("sign:4", torch.zeros(8)), torch.zeros(8))  # zero blocks stay zero


def test_sign_scale_is_the_l2_best_for_the_signs() -> None:
    x = vector(640, seed=5)
    y = round_trip("sign", x)
    assert torch.equal(torch.sign(y), torch.sign(x))
    # mean |x| minimises ||s*sign(x) - x|| over s: scaling it either way adds error, block by block
    err = (y - x).view(-1, 64).norm(dim=1)
    for factor in (0.9, 1.1):
        assert ((y * factor - x).view(-1, 64).norm(dim=1) > err).all()


def test_chained_value_format_quantizes_the_kept_values() -> None:
    x = vector(10_000, seed=7)
    exact, quantized = round_trip("topk:0.01", x), round_trip("topk:0.01+int8", x)
    assert torch.equal(exact.nonzero(), quantized.nonzero())
    scale = exact.abs().max() / 127  # kept values span 64-blocks; the global absmax bounds every scale
    assert ((exact - quantized).abs() <= scale / 2 * (1 + 1e-5)).all()


# --- spec parsing -----------------------------------------------------------------------------------

def test_spec_is_normalised() -> None:
    assert build(" TopK:0.01 + INT8 ").spec == "topk:0.01+int8"
    assert build("topk:0.010+fp32").spec == "topk:0.01"
    assert build("int8:64").spec == "int8"
    assert build("dct-topk:64:4").spec == "dct-topk:64:4"


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ("", "empty"), ("fp64", "'fp64'"), ("int3", "'int3'"), ("topk", "'topk'"), ("topk:0", "(0, 1]"),
        ("topk:1.5", "(0, 1]"), ("topk:abc", "not a number"), ("randk:nan", "not finite"),
        ("chunk-topk:64", "'chunk-topk:64'"), ("dct-topk:64:65", "K <= CHUNK"),
        ("dct-topk:8192:4", "4096"), ("chunk-topk:64:x", "not an integer"), ("int8:0", "block size"),
        ("int8+topk:0.1", "sparsifier comes first"), ("topk:0.1+randk:0.1", "at most one"),
        ("fp16+int8", "at most one"), ("topk:0.1+int8+fp16", "at most one"), ("sign:0", "block size"),
        ("sign:4:4", "'sign:4:4'"), ("sign+topk:0.1", "sparsifier comes first"),
    ],
)
def test_bad_specs_raise_value_error_naming_the_problem(spec: str, named: str) -> None:
    with pytest.raises(ValueError, match="valid forms") as excinfo:
        build(spec)
    assert named in str(excinfo.value)
    assert not isinstance(excinfo.value, CodecError)


def test_encode_rejects_non_flat_input_and_accepts_other_float_dtypes() -> None:
    with pytest.raises(ValueError, match=r"flat \(d,\)"):
        build("fp16").encode(torch.zeros(2, 3))
    x = vector(100).double()
    assert torch.equal(round_trip("fp32", x), x.float())


# --- error feedback -----------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", ["topk:0.05+int8", "randk:0.1", "dct-topk:64:4+int4", "int2", "randk:0.2+sign"])
def test_error_feedback_decoded_sum_tracks_input_sum(spec: str) -> None:
    codec, d = build(spec), 640
    feedback = ErrorFeedback(codec, d)
    sent, received, without_feedback = torch.zeros(d), torch.zeros(d), torch.zeros(d)
    residual_norms = []
    for round_index in range(200):
        x = vector(d, seed=100 + round_index) + 0.5  # a consistent drift that plain compression loses
        payload = feedback.encode(x, seed=round_index)
        sent += x
        received += codec.decode(payload, d, seed=round_index)
        without_feedback += codec.decode(codec.encode(x, seed=round_index), d, seed=round_index)
        residual_norms.append(feedback.residual.norm().item())
    assert torch.allclose(received + feedback.residual, sent, rtol=1e-4, atol=1e-2)  # nothing lost, only delayed
    assert max(residual_norms[100:]) < 1.5 * max(residual_norms[:50])  # bounded, not growing with rounds
    gap = (received - sent).norm() / sent.norm()
    assert gap < 0.1 and gap < 0.5 * (without_feedback - sent).norm() / sent.norm()


def test_error_feedback_state_round_trip_and_lossless_codec() -> None:
    codec = build("topk:0.1")
    first = ErrorFeedback(codec, 100)
    first.encode(vector(100, seed=1))
    second = ErrorFeedback(codec, 100)
    second.load_state_dict(first.state_dict())
    assert first.encode(vector(100, seed=2)) == second.encode(vector(100, seed=2))
    with pytest.raises(ValueError, match="saved for codec"):
        ErrorFeedback(build("fp16"), 100).load_state_dict(first.state_dict())
    with pytest.raises(ValueError, match=r"\(50,\) tensor"):
        ErrorFeedback(codec, 50).load_state_dict(first.state_dict())
    lossless = ErrorFeedback(build("fp32"), 10)
    lossless.encode(vector(10))
    assert torch.equal(lossless.residual, torch.zeros(10))


def test_error_feedback_resets_non_finite_residual() -> None:
    feedback = ErrorFeedback(build("fp16"), 4)
    feedback.encode(torch.tensor([1e6, 1.0, float("nan"), 2.0]))  # 1e6 overflows fp16 to inf
    assert torch.isfinite(feedback.residual).all()


def test_codecs_module_reexports_codec_error() -> None:
    assert codecs.CodecError is CodecError and issubclass(CodecError, ValueError)


# --- SparseLoCo's value format and error-feedback decay ------------------------------------------

def test_stat2_decodes_every_value_to_its_bins_mean_over_6_sigma() -> None:
    x = torch.tensor([-9.0, -2.0, -1.0, 0.5, 1.5, 2.5, 8.0, 0.0])
    sigma = float(x.pow(2).mean().sqrt())  # 4.375...: bins of 3σ ≈ 13.1 wide
    y = round_trip("stat2", x)
    # bin edges -3σ, 0, 3σ: {-9, -2, -1} | {0.5, 1.5, 2.5, 8, 0}, each decoded to its bin's mean
    assert 3 * sigma > 9
    assert torch.allclose(y[:3], torch.full((3,), -4.0))
    assert torch.allclose(y[3:], torch.full((5,), 2.5))
    wide = round_trip("stat2", torch.tensor([-100.0, -1.0, 1.0, 100.0] + [0.5] * 60))  # outliers get outer bins
    assert wide[0] == -100.0 and wide[3] == 100.0 and abs(float(wide[1]) + 1.0) < 1e-6


def test_stat2_keeps_each_bins_mean_and_refuses_a_non_finite_table() -> None:
    x = vector(5000, seed=4)
    codes, table = build("stat2").values.quantize(x)
    for block in range(2):
        part, c = x[block * 4096:(block + 1) * 4096], codes[block * 4096:(block + 1) * 4096].long()
        for b in range(4):
            if (c == b).any():
                assert math.isclose(float(part[c == b].mean()), float(table[block, b]), rel_tol=1e-5, abs_tol=1e-6)
    payload = bytearray(build("stat2").encode(x))
    payload[HEADER_SIZE:HEADER_SIZE + 4] = struct.pack("<f", float("nan"))
    with pytest.raises(CodecError, match="not finite"):
        build("stat2").decode(bytes(payload), 5000)


def test_error_feedback_with_decay_follows_e_beta_e_plus_delta_minus_sent() -> None:
    codec = build("chunk-topk:8:1")  # keeps the largest of every 8, fp32 values: sent = exactly those
    feedback = ErrorFeedback(codec, 16, decay=0.95)
    e = torch.zeros(16)
    for step in range(4):
        delta = vector(16, seed=step)
        sent = codec.decode(feedback.encode(delta), 16)
        e = 0.95 * e + delta
        assert torch.allclose(sent, codec.decode(codec.encode(e), 16))  # top-k of the decayed accumulator
        e = e - sent
        assert torch.allclose(feedback.residual, e, atol=1e-6)
    with pytest.raises(ValueError, match="decay"):
        ErrorFeedback(codec, 16, decay=1.5)


@pytest.mark.parametrize("spec", ["topk:0.01+int8", "topk:0.01+int8:65536", "chunk-topk:4096:64+stat2"])
def test_sparse_updates_averaged_with_error_feedback_lose_nothing_but_the_residuals(spec: str) -> None:
    # The project's sparse path, pinned: 4 peers, each with its own error feedback, the receiver
    # averaging the decoded payloads over ALL peers (zero-filled). Over rounds, what was applied is
    # the mean of everything the peers put in, minus the mean of what they still hold back.
    d, peers = 20_000, 4
    senders = [ErrorFeedback(build(spec), d) for _ in range(peers)]
    applied, inputs = torch.zeros(d, dtype=torch.float64), torch.zeros(d, dtype=torch.float64)
    for r in range(6):
        decoded = []
        for i, sender in enumerate(senders):
            delta = vector(d, seed=100 * r + i) * (1 + i)
            inputs += delta.double() / peers
            decoded.append(build(spec).decode(sender.encode(delta), d))
        applied += torch.stack(decoded).mean(dim=0).double()
    held_back = torch.stack([s.residual for s in senders]).mean(dim=0).double()
    assert torch.allclose(applied, inputs - held_back, atol=1e-4)
