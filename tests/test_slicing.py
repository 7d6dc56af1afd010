"""Slices of the flat vector: layout, per-slice codec, per-slice robust math, owner draw (signed
results: tests/test_slice_results.py)."""

from __future__ import annotations

import pytest
import torch

from optim import codecs, finite, slicing
from peer.run import slice_plan
from peer.run.config import ConfigError, RunConfig
from peer.run.round_math import RoundMath, UpdateRejected, codec_seed
from protocol.reasons import Reason


def sliced_config(**aggregation) -> RunConfig:
    return RunConfig.from_dict({"exchange": {"mode": "sliced", "slices": 8}, "aggregation": aggregation or {"name": "median"}})


def test_layout_covers_the_vector_on_block_boundaries():
    codec = codecs.build("int8")
    layout = slicing.SliceLayout.build(10_000, 7, slicing.codec_alignment(codec))
    assert slicing.codec_alignment(codec) == 64
    assert layout.bounds[0] == 0 and layout.bounds[-1] == 10_000
    assert all(b % 64 == 0 for b in layout.bounds[:-1])
    assert sum(layout.size(j) for j in range(layout.num_slices)) == 10_000
    assert slicing.codec_alignment(codecs.build("chunk-topk:96:4+int8")) == 192  # lcm(96, 64)
    with pytest.raises(ValueError):
        slicing.SliceLayout(10, (0, 5, 5, 10))


def test_sliced_int8_decodes_to_the_same_values_as_unsliced():
    x = torch.randn(10_000, generator=torch.Generator().manual_seed(0))
    codec = codecs.build("int8")
    sliced = slicing.SlicedCodec(codec, slicing.SliceLayout.build(10_000, 5, 64))
    payload = sliced.encode(x)
    assert len(payload) == sliced.max_encoded_size(10_000)
    assert torch.equal(sliced.decode(payload, 10_000), codec.decode(codec.encode(x), 10_000))
    parts = sliced.split(payload)
    assert [len(p) for p in parts] == [sliced.max_slice_payload_size(j) for j in range(5)]  # int8: fixed sizes
    layout = sliced.layout
    assert torch.equal(sliced.decode_slice(parts[3], 3), sliced.decode(payload, 10_000)[layout.range(3)])
    with pytest.raises(codecs.CodecError):
        sliced.decode_slice(parts[3], 2 if layout.size(2) != layout.size(3) else 99)
    with pytest.raises(codecs.CodecError):
        sliced.split(payload[:-1])


def test_variable_length_slices_split_where_each_says_it_ends():
    d = 445_952  # the demo model and the public-swarm recipe's payload codec; 32 slices asked, 28 of 4 chunks made
    x = torch.randn(d, generator=torch.Generator().manual_seed(2))
    codec = codecs.build("chunk-topk:4096:64+stat2")
    sliced = slicing.SlicedCodec(codec, slicing.SliceLayout.build(d, 32, slicing.codec_alignment(codec)))
    payload = sliced.encode(x)
    parts = sliced.split(payload)
    assert len(payload) < sliced.max_encoded_size(d) and sliced.encoded_length(payload, d) == len(payload)
    assert all(len(p) <= sliced.max_slice_payload_size(j) for j, p in enumerate(parts))
    assert len({len(p) for p in parts}) > 1  # Rice-coded offsets: slices differ in length
    whole = sliced.decode(payload, d)
    for j in (0, 17, sliced.layout.num_slices - 1):
        assert torch.equal(sliced.decode_slice(parts[j], j), whole[sliced.layout.range(j)])
    for bad in (payload[:-1], payload + b"\0", payload[: len(parts[0])]):
        with pytest.raises(codecs.CodecError, match="sliced payload"):
            sliced.split(bad)
    moved = bytearray(payload)
    moved[len(parts[0]) + len(parts[1]) - 1] ^= 0xFF  # the last byte of slice 1 (a stat2 value byte)
    assert len(sliced.split(bytes(moved))[1]) == len(parts[1])  # values do not move a boundary
    with pytest.raises(codecs.CodecError, match="slice 1 of the sliced payload"):
        sliced.split(payload[: len(parts[0])] + bytes(sliced.max_slice_payload_size(1)) + payload[len(parts[0]) :])


def test_sparse_codecs_select_per_slice():
    x = torch.zeros(4096)
    x[:100] = 10.0  # every large value sits in slice 0
    sliced = slicing.SlicedCodec(codecs.build("topk:0.01"), slicing.SliceLayout.build(4096, 4))
    out = sliced.decode(sliced.encode(x), 4096)
    assert int((out[:1024] != 0).sum()) == 10  # k = 1% of each 1024-slice, not 41 globally
    assert int((out[1024:] != 0).sum()) <= 30


def test_sliced_math_matches_whole_vector_math_up_to_the_result_format():
    gen = torch.Generator().manual_seed(1)
    updates = [torch.randn(5000, generator=gen) for _ in range(5)]
    for name in ("mean", "median", "trimmed-mean"):
        whole = RunConfig.from_dict({"aggregation": {"name": name, "num_byzantine": 1}})
        sliced = RunConfig.from_dict({"exchange": {"mode": "sliced", "slices": 8}, "aggregation": {"name": name, "num_byzantine": 1}})
        a, b = torch.zeros(5000), torch.zeros(5000)
        RoundMath(whole, 5000).apply(a, updates, round_=0)
        RoundMath(sliced, 5000).apply(b, updates, round_=0)
        # coordinate-wise rules are exact per slice; the aggregate travels as fp16 (rel. error <= 2^-11)
        assert torch.allclose(a, b, rtol=2e-3, atol=1e-6), name
        assert not torch.equal(a, torch.zeros(5000))


def test_reduce_slice_is_bit_identical_for_any_row_order():
    math = RoundMath(sliced_config(name="centered-clip"), 4000)
    rows = torch.randn(6, math.layout.size(2), generator=torch.Generator().manual_seed(2))
    assert math.reduce_slice(rows, 2, round_=3) == math.reduce_slice(rows.flip(0), 2, round_=3)
    assert math.reduce_slice(rows, 2, round_=3) != math.reduce_slice(rows * 2, 2, round_=3)


def test_sparse_trimmed_mean_reduces_a_slice_bit_identically_for_any_row_order():
    math = RoundMath(sliced_config(name="sparse-trimmed-mean", num_byzantine=1), 4000)
    gen = torch.Generator().manual_seed(4)
    rows = torch.randn(5, math.layout.size(1), generator=gen)
    rows.masked_fill_(torch.rand(rows.shape, generator=gen) > 0.3, 0.0)  # sparse: supports differ
    rows[3] *= 100.0  # clipped
    assert math.reduce_slice(rows, 1, round_=3) == math.reduce_slice(rows[[4, 2, 0, 3, 1]], 1, round_=3)
    combined = math.decode_result(math.reduce_slice(rows, 1, round_=3), 1)
    assert 0 < int((combined != 0).sum()) < rows.shape[1]  # coordinates with < f+1 = 2 senders stay 0


@pytest.mark.parametrize("rule", ["krum", "multi-krum", "geometric-median"])
def test_whole_vector_rules_are_refused_in_sliced_mode(rule):
    with pytest.raises(ConfigError, match="slice"):
        RoundMath(sliced_config(name=rule), 1000)


def test_owner_draw_is_balanced_distinct_and_seeded():
    servers = [f"peer{i:02d}" for i in range(6)]
    seed = slice_plan.owner_seed("run", 3, ["a" * 64, "b" * 64])
    owners = slice_plan.assign_owners(servers, 32, 2, seed)
    assert all(len(set(o)) == 2 for o in owners)
    counts = {p: len(slice_plan.owned_by(owners, p)) for p in servers}
    assert max(counts.values()) - min(counts.values()) <= 1 and sum(counts.values()) == 64
    assert owners == slice_plan.assign_owners(list(reversed(servers)), 32, 2, seed)
    other = slice_plan.assign_owners(servers, 32, 2, slice_plan.owner_seed("run", 3, ["c" * 64, "b" * 64]))
    assert other != owners
    assert slice_plan.assign_owners(servers[:1], 4, 2, seed) == [["peer00"]] * 4
    assert slice_plan.assign_owners([], 2, 2, seed) == [[], []]


def test_collusion_odds_follow_the_owner_draw():
    # 3 servers, 2 colluding, r = 2: every round some slice has only colluding owners, and the
    # honest peer's non-owned slices are exactly theirs, so one spot check always catches them.
    odds = slice_plan.collusion_odds(3, 2, 2, 8, 1, trials=200)
    assert odds["p_round_offers_a_lie"] == 1.0 and odds["p_lie_survives_round"] == 0.0
    assert odds["expected_rounds_until_caught"] == 1.0
    # 8 servers, 2 colluding, r = 2: they share owner pairs only when the draw pairs them (1 in 7)
    odds = slice_plan.collusion_odds(8, 2, 2, 32, 1, trials=4000)
    assert odds["p_round_offers_a_lie"] == pytest.approx(1 / 7, abs=0.02)
    assert 0.0 < odds["p_lie_survives_round"] < 0.2
    no_checks = slice_plan.collusion_odds(8, 2, 2, 32, 0, trials=500)
    assert no_checks["p_lie_survives_round"] == 1.0 and no_checks["expected_rounds_until_caught"] == float("inf")


def decode_alone(math: RoundMath, data: bytes, j: int, round_: int) -> torch.Tensor:
    """The reference: one input through the codec alone (CastFormat.decode's own copy and cast), with
    the refusals an owner makes."""
    try:
        values = math.sliced_codec.decode_slice(data, j, seed=codec_seed(math.cfg, round_))
    except codecs.CodecError as exc:
        raise UpdateRejected(Reason.UNDECODABLE, f"slice {j} does not decode: {exc}") from None
    if not finite.all_finite(values):
        raise UpdateRejected(Reason.NON_FINITE, f"slice {j} holds NaN or Inf values")
    return values


@pytest.mark.parametrize("codec", ["fp16", "bf16", "fp32", "int8", "topk:0.1+int8"])
def test_a_slices_rows_decoded_at_once_are_the_one_by_one_decodes_bit_for_bit_and_refuse_what_they_refuse(codec):
    """RoundMath.decode_slices (the owner's reduce): each input decoded as the codec decodes it alone,
    into the next row; a corrupt, truncated or foreign input and a non-finite one are refused with
    the reason a one-by-one decode gives, and the rows after them move up."""
    cfg = RunConfig.from_dict({"exchange": {"mode": "sliced", "slices": 4}, "compression": {"codec": codec}})
    math = RoundMath(cfg, 4096)
    j, round_ = 2, 7
    gen = torch.Generator().manual_seed(3)
    good = [math.sliced_codec.split(math.encode(torch.randn(4096, generator=gen), round_))[j] for _ in range(4)]
    cast = codec in ("fp16", "bf16", "fp32")  # a NaN passes a cast's encode (a quantizer's error feedback refuses it)
    poisoned = torch.randn(4096, generator=gen)
    poisoned[math.layout.range(j)][5] = float("nan")
    nan = math.sliced_codec.split(math.encode(poisoned, round_))[j] if cast else good[3][:5]
    other = RoundMath(RunConfig.from_dict({"exchange": {"mode": "sliced", "slices": 4},
                                           "compression": {"codec": "fp32" if codec != "fp32" else "fp16"}}), 4096)
    foreign = other.sliced_codec.split(other.encode(torch.randn(4096, generator=gen), round_))[j]
    datas = [good[0], good[1][:-2], good[2], foreign, nan, good[3]]
    out = torch.full((len(datas), math.layout.size(j)), 7.0)
    got = math.decode_slices(datas, j, round_, out)

    expected_rows, expected_reasons = [], []
    for data in datas:
        try:
            expected_rows.append(decode_alone(math, data, j, round_))
            expected_reasons.append(None)
        except UpdateRejected as exc:
            expected_reasons.append((exc.reason, str(exc)))
    assert [None if g is None else (g.reason, str(g)) for g in got] == expected_reasons
    assert expected_reasons[0] is None and expected_reasons[1] is not None and expected_reasons[3] is not None
    assert expected_reasons[4][0] == (Reason.NON_FINITE if cast else Reason.UNDECODABLE)
    assert len(expected_rows) == got.count(None)
    assert torch.equal(out[: len(expected_rows)], torch.stack(expected_rows))  # bit for bit, in order


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64, torch.bfloat16])
def test_finite_rows_flags_exactly_the_rows_with_nan_or_inf(dtype):
    """finite.finite_rows, the owner's check of a slice's decoded rows: a row with NaN, +Inf or
    -Inf anywhere is flagged, a row of huge finite values (whose sum overflows) is not; numpy's
    path (float16/32/64) and torch's (bfloat16) agree."""
    big = torch.finfo(dtype).max
    rows = torch.randn(6, 300).to(dtype)
    rows[1, 299] = float("nan")
    rows[2, 0] = float("inf")
    rows[3, 150] = float("-inf")
    rows[4] = big  # finite, but its sum is not
    rows[5, ::2] = -big
    assert finite.finite_rows(rows) == [True, False, False, False, True, True]
    assert finite.finite_rows(rows[:1]) == [True] and finite.finite_rows(rows[1:4]) == [False] * 3


@pytest.mark.parametrize("codec", ["fp16", "bf16", "fp32"])
def test_a_cast_codecs_whole_vector_encode_is_its_slices_own_encodes_bit_for_bit(codec):
    """SlicedCodec.encode casts a plain-cast codec's vector once and cuts the payloads from it: the
    bytes are each slice's own encode (codec header + values), also for NaN, ±Inf, -0.0, values past
    fp16's range and a float64 input; a wrong shape or an integer tensor is refused as before."""
    c = codecs.build(codec)
    sliced = slicing.SlicedCodec(c, slicing.SliceLayout.build(1000, 7, slicing.codec_alignment(c)))
    x = torch.randn(1000, generator=torch.Generator().manual_seed(5)) * 1e3
    x[[3, 400, 999]] = torch.tensor([float("nan"), float("inf"), float("-inf")])
    x[10], x[11] = -0.0, 1e6  # 1e6: past fp16's range
    for v in (x, x.double()):
        expected = b"".join(c.encode(v[sliced.layout.range(j)].float()) for j in range(sliced.layout.num_slices))
        assert sliced.encode(v) == expected
        assert sliced.split(sliced.encode(v)) == [c.encode(v[sliced.layout.range(j)].float()) for j in range(sliced.layout.num_slices)]
    with pytest.raises(ValueError):
        sliced.encode(x.view(10, 100))
    with pytest.raises(ValueError):
        sliced.encode(torch.arange(1000))


def test_finite_rows_masks_a_row_at_a_time_past_its_bound(monkeypatch):
    """Past MASK_ELEMENTS values (all-to-all's (n, d) rows) finite_rows checks one row at a time, with
    the same answers as the one-mask path."""
    rows = torch.randn(5, 1000)
    rows[1, 999], rows[3, 0] = float("nan"), float("-inf")
    whole = finite.finite_rows(rows)
    monkeypatch.setattr(finite, "MASK_ELEMENTS", 100)
    assert finite.finite_rows(rows) == whole == [True, False, True, False, True]
