"""A compressed aggregate (optim/slicing.py result formats that are codec specs) and error
feedback that keeps what the swarm did not apply (optim/codecs.py ErrorFeedback.restore_unapplied)."""

from __future__ import annotations

import pytest
import torch

from optim import codecs, slicing
from optim.codecs import CodecError, ErrorFeedback
from optim.index_coding import RiceOffsets

D = 446_000  # 108 full chunks of 4096 and a short one of 3632


def vector(seed: int = 0, numel: int = D) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(seed))


def test_sizes_by_hand_for_446k_values():
    # kept: 108 * 64 + min(64, 3632) = 6976; header 4
    # offsets Rice-coded at b = 5 bits (optim/index_coding.py): remainders 6976 * 5 bits = 4360 bytes;
    # unary quotients at most 6976 + 108 * (4032 >> 5) + (3568 >> 5) = 20695 bits = 2587 bytes
    # (12-bit offsets took 6976 * 12 bits = 10464 bytes)
    # int8: 4 * ceil(6976 / 64) + 6976 = 7412        stat2: 16 * ceil(6976 / 4096) + 6976 / 4 = 1776
    assert slicing.max_result_size(D, "chunk-topk:4096:64+int8") == 4 + 4360 + 2587 + 7412 == 14363
    assert slicing.max_result_size(D, "chunk-topk:4096:64+stat2") == 4 + 4360 + 2587 + 1776 == 8727
    assert slicing.max_result_size(D, "fp16") == 2 * D and slicing.max_result_size(D, "bf16") == 2 * D
    assert slicing.max_result_size(D, "fp32") == 4 * D
    assert len(slicing.encode_result(vector(), "fp16")) == 2 * D
    for fmt, values in (("chunk-topk:4096:64+int8", 7412), ("chunk-topk:4096:64+stat2", 1776)):
        size = len(slicing.encode_result(vector(), fmt))
        assert size <= slicing.max_result_size(D, fmt)
        assert 8 * (size - 4 - values) / 6976 < 7.7  # bits per offset on a gaussian aggregate (12 before)


def test_dense_formats_are_unchanged():
    x = vector(1, 1000) * 3e4  # some values past fp16's range
    assert slicing.encode_result(x, "fp16") == x.clamp(-65504.0, 65504.0).to(torch.float16).numpy().tobytes()
    assert slicing.encode_result(x, "bf16") == x.to(torch.bfloat16).view(torch.uint8).numpy().tobytes()
    assert slicing.encode_result(x, "fp32") == x.numpy().tobytes()
    assert torch.equal(slicing.decode_result(slicing.encode_result(x, "fp32"), 1000, "fp32"), x)
    assert [slicing.is_dense_result(f) for f in ("fp32", "fp16", "bf16", "chunk-topk:4096:64+int8")] == [True] * 3 + [False]
    assert slicing.result_format("chunk-topk:4096:64+stat2") == "fp16"


@pytest.mark.parametrize("values", ["fp32", "int8"])
def test_round_trip_keeps_exactly_the_top_k_per_chunk(values):
    fmt = "chunk-topk:4096:64" if values == "fp32" else "chunk-topk:4096:64+int8"
    x = vector(2)
    out = slicing.decode_result(slicing.encode_result(x, fmt), D, fmt)
    padded = torch.nn.functional.pad(x.abs(), (0, 109 * 4096 - D), value=-1.0).view(109, 4096)
    top = torch.topk(padded, 64, dim=1).indices + torch.arange(109)[:, None] * 4096  # randn: no ties
    support = top.view(-1).sort().values
    assert torch.equal((out != 0).nonzero().view(-1), support)
    if values == "fp32":
        assert torch.equal(out[support], x[support])
    else:  # the kept values, blockwise int8 as the codec quantizes them
        int8 = codecs.build("int8")
        assert torch.equal(out[support], int8.decode(int8.encode(x[support]), support.numel()))


def test_ties_go_to_the_lower_index():
    x = torch.zeros(16)
    x[[1, 3, 5, 6]] = 1.0  # chunk 0 of 8: four equal magnitudes for K = 2; chunk 1: all zeros
    payload = slicing.encode_result(x, "chunk-topk:8:2")
    offsets = RiceOffsets(8, 2).decode(memoryview(payload)[4:-4 * 4], 16)  # 4 fp32 values at the end
    assert offsets.tolist() == [1, 3, 0, 1]
    assert slicing.decode_result(payload, 16, "chunk-topk:8:2").nonzero().view(-1).tolist() == [1, 3]
    # global top-k alike: 3 of the 4 equal values, the lowest indices
    decoded = slicing.decode_result(slicing.encode_result(x, "topk:0.1875"), 16, "topk:0.1875")
    assert decoded.nonzero().view(-1).tolist() == [1, 3, 5]


def test_bytes_are_identical_across_encodes_and_thread_counts():
    x = vector(3)
    x[:8192] = torch.randint(-3, 4, (8192,), generator=torch.Generator().manual_seed(4)).float()  # many ties
    threads = torch.get_num_threads()
    try:
        for fmt in ("chunk-topk:4096:64+int8", "chunk-topk:4096:64+stat2", "topk:0.01+int4", "int8"):
            torch.set_num_threads(1)
            reference = slicing.encode_result(x, fmt)
            assert slicing.encode_result(x.clone(), fmt) == reference
            for n in (2, 4):
                torch.set_num_threads(n)
                assert slicing.encode_result(x, fmt) == reference, (fmt, n)
    finally:
        torch.set_num_threads(threads)


def test_garbage_is_refused():
    fmt = "chunk-topk:4096:64+int8"
    good = slicing.encode_result(vector(5, 8192), fmt)
    with pytest.raises(CodecError):
        slicing.decode_result(good[:-1], 8192, fmt)
    with pytest.raises(CodecError):
        slicing.decode_result(good, 4096, fmt)
    with pytest.raises(CodecError):
        slicing.decode_result(b"\x00" + good[1:], 8192, fmt)  # not a codec payload
    with pytest.raises(CodecError):
        slicing.decode_result(slicing.encode_result(vector(5, 8192), "chunk-topk:4096:64+int4"), 8192, fmt)
    for seed in range(5):  # random bytes behind a valid header
        noise = torch.randint(0, 256, (len(good) - 4,), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)
        with pytest.raises(CodecError):
            slicing.decode_result(good[:4] + noise.numpy().tobytes(), 8192, fmt)
    huge = vector(6, 8192)
    huge[7] = 1e6  # past fp16: the kept value encodes as inf
    with pytest.raises(CodecError, match="NaN or Inf"):
        slicing.decode_result(slicing.encode_result(huge, "chunk-topk:4096:64+fp16"), 8192, "chunk-topk:4096:64+fp16")


def test_only_reproducible_codecs_are_result_formats():
    for fmt in ("dct-topk:64:4+int8", "sign", "chunk-topk:4096:64+sign", "fp16"):
        with pytest.raises(ValueError):
            slicing.result_codec(fmt)
    with pytest.raises(ValueError):
        slicing.max_result_size(10, "nonsense")


# --- error feedback: what the swarm did not apply ----------------------------------------------

def test_restore_unapplied_gives_back_what_the_aggregate_dropped():
    feedback = ErrorFeedback(codecs.build("chunk-topk:4:2"), 8, keep_sent=True)
    x = torch.tensor([4.0, 3.0, 0.5, 0.25, 0.0, 0.0, 2.0, -5.0])
    feedback.encode(x)
    assert feedback.last_sent.tolist() == [4.0, 3.0, 0.0, 0.0, 0.0, 0.0, 2.0, -5.0]
    assert feedback.residual.tolist() == [0.0, 0.0, 0.5, 0.25, 0.0, 0.0, 0.0, 0.0]
    applied = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.7, 0.0, 0.0, -2.0])  # 3.0 and 2.0 never reached the model
    assert feedback.restore_unapplied(applied) == 2
    assert feedback.residual.tolist() == [0.0, 3.0, 0.5, 0.25, 0.0, 0.0, 2.0, 0.0]
    # residual + what was applied of ours == everything we had to send
    assert torch.equal(feedback.residual + torch.where(applied != 0, torch.tensor([4.0, 3, 0, 0, 0, 0, 2, -5]), 0.0), x)
    assert feedback.restore_unapplied(applied) == 0  # once per message
    assert feedback.residual.tolist() == [0.0, 3.0, 0.5, 0.25, 0.0, 0.0, 2.0, 0.0]
    # next round the restored values are sent again: 3.0 now beats 0.5 in chunk 0
    feedback.encode(torch.zeros(8))
    assert feedback.last_sent.tolist() == [0.0, 3.0, 0.5, 0.0, 0.0, 0.0, 2.0, 0.0]


def test_a_round_not_applied_restores_everything_sent():
    feedback = ErrorFeedback(codecs.build("fp32"), 4, keep_sent=True)  # lossless: residual 0 after encode
    x = torch.tensor([1.0, -2.0, 0.0, 3.0])
    feedback.encode(x)
    assert feedback.residual.tolist() == [0.0] * 4
    assert feedback.restore_unapplied(torch.zeros(4)) == 3
    assert torch.equal(feedback.residual, x)


def test_restore_unapplied_is_checked():
    plain = ErrorFeedback(codecs.build("chunk-topk:4:2"), 8)
    plain.encode(torch.ones(8))
    assert plain.last_sent is None  # not kept unless asked for
    with pytest.raises(RuntimeError, match="keep_sent"):
        plain.restore_unapplied(torch.zeros(8))
    kept = ErrorFeedback(codecs.build("chunk-topk:4:2"), 8, keep_sent=True)
    assert kept.restore_unapplied(torch.zeros(8)) == 0  # nothing sent yet
    with pytest.raises(ValueError):
        kept.restore_unapplied(torch.zeros(7))


def test_last_sent_survives_resume_and_old_states_load():
    codec = codecs.build("chunk-topk:4:2+int8")
    first = ErrorFeedback(codec, 8, keep_sent=True)
    first.encode(torch.arange(8.0))
    state = first.state_dict()
    resumed = ErrorFeedback(codec, 8, keep_sent=True)
    resumed.load_state_dict(state)
    assert torch.equal(resumed.last_sent, first.last_sent) and torch.equal(resumed.residual, first.residual)
    state["last_sent"][0] = 99.0
    assert resumed.last_sent[0] != 99.0  # a copy
    old = {"spec": codec.spec, "residual": torch.ones(8)}  # saved before last_sent existed
    resumed.load_state_dict(old)
    assert resumed.last_sent is None and resumed.residual.tolist() == [1.0] * 8
    with pytest.raises(ValueError, match="last_sent"):
        resumed.load_state_dict({**old, "last_sent": torch.ones(7)})


@pytest.mark.parametrize("seed", range(8))
def test_restore_unapplied_keeps_the_dense_formulas_bits(seed):
    """The sparse restore (only the aggregate's exact zeros touched) against the dense formula it
    replaced, bit for bit, on vectors full of ±0.0, NaN and ±Inf in every operand."""
    g = torch.Generator().manual_seed(seed)
    specials = torch.tensor([0.0, -0.0, float("nan"), float("inf"), float("-inf"), 1e-45, -3.0])

    def mixed(n: int) -> torch.Tensor:
        x = torch.randn(n, generator=g)
        pick = torch.rand(n, generator=g) < 0.4
        return torch.where(pick, specials[torch.randint(len(specials), (n,), generator=g)], x)

    n = 4096
    feedback = ErrorFeedback(codecs.build("fp16"), n, keep_sent=True)
    residual, sent, applied = mixed(n), mixed(n), mixed(n)
    if seed >= 4:  # a dense aggregate, no exact zero (with ±Inf, with a NaN): nothing restored, the +0.0 pass and nan_to_num still run
        applied = torch.randn(n, generator=g).clamp(-4, 4) + torch.where(torch.rand(n, generator=g) < 0.5, 8.0, -8.0)
        applied[::97] = float("inf") if seed == 7 else float("nan") if seed == 6 else -5.0
    if seed % 2:
        applied = applied.to(torch.bfloat16 if seed % 3 else torch.float64)
    if seed >= 4:
        assert not bool((applied == 0).any())
    feedback.residual, feedback.last_sent = residual.clone(), sent.clone()
    lost = (applied == 0) & (sent != 0)
    expected = (residual + torch.where(lost, sent, 0.0)).nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
    assert feedback.restore_unapplied(applied) == int(lost.sum())
    assert torch.equal(feedback.residual.view(torch.int32), expected.view(torch.int32))


@pytest.mark.parametrize("spec", ["fp16", "bf16", "fp32", "int8", "topk:0.1+fp16"])
def test_a_cast_codecs_roundtrip_is_its_decode(spec):
    """cast_roundtrip (error feedback's shortcut past the bytes) is decode(encode(x)) bit for bit,
    plain and sliced, on values past fp16's range, subnormals, ±0.0, NaN and ±Inf; None for a codec
    that is more than a cast."""
    from optim.slicing import SliceLayout, SlicedCodec

    g = torch.Generator().manual_seed(5)
    x = torch.randn(3000, generator=g) * 10.0 ** torch.randint(-9, 6, (3000,), generator=g)
    x[:8] = torch.tensor([0.0, -0.0, float("nan"), float("inf"), float("-inf"), 70000.0, -1e-40, 6e-8])
    plain = codecs.build(spec)
    for codec in (plain, SlicedCodec(plain, SliceLayout.build(3000, 7))):
        cast = codec.cast_roundtrip(x)
        if spec in ("int8", "topk:0.1+fp16"):
            assert cast is None
            continue
        decoded = codec.decode(codec.encode(x), 3000)
        assert torch.equal(cast.view(torch.int32), decoded.view(torch.int32))
