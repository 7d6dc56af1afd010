"""The agreed support (optim/shared_support.py) and its simulate round (peer/cli/simulate_shared.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from optim import codecs, shared_support
from optim.shared_support import PublicScore, SupportPlan, SupportValues
from peer.run.config import ConfigError, RunConfig


def _plan(**kw) -> SupportPlan:
    return SupportPlan(**{"chunk": 64, "k": 8, "mix": 0.5, "values": "fp32", "result": "fp32", **kw})


def test_round_support_is_k_per_chunk_sorted_and_a_pure_function_of_score_and_seed():
    plan = _plan()
    score = torch.zeros(64 * 3 + 20)  # a partial last chunk of 20
    a = shared_support.round_support(score, plan, seed=7)
    assert torch.equal(a, shared_support.round_support(score.clone(), plan, seed=7))
    assert a.numel() == 4 * 8 and torch.equal(a, a.sort().values) and a.unique().numel() == a.numel()
    assert [int(((a >= c * 64) & (a < (c + 1) * 64)).sum()) for c in range(4)] == [8, 8, 8, 8]
    assert not torch.equal(a, shared_support.round_support(score, plan, seed=8))  # the random part moves with the round


def test_round_support_takes_the_top_share_by_public_score_and_fills_the_rest_at_random():
    plan = _plan(mix=0.5)  # 4 of 8 by score
    score = torch.zeros(128)
    hot = torch.tensor([3, 10, 20, 30, 40, 50, 60, 63, 70, 90])  # 8 in chunk 0, 2 in chunk 1
    score[hot] = torch.arange(1.0, 11.0) * torch.tensor([1, -1] * 5)
    support = set(shared_support.round_support(score, plan, seed=1).tolist())
    assert {40, 50, 60, 63} <= support  # chunk 0: the 4 largest |score|
    assert {70, 90} <= support  # chunk 1: only 2 have a score; 6 random ones join them
    assert len(support) == 16


def test_vote_support_needs_f_plus_1_proposers_most_votes_first():
    plan = dataclasses.replace(_plan(mix=0.0), votes=3)  # f = 2
    votes = torch.zeros(64, dtype=torch.int32)
    votes[:8] = torch.tensor([8, 7, 6, 5, 4, 3, 3, 3])  # honest favourites, all >= 3
    votes[40:48] = 2  # what f = 2 attackers alone proposed
    support = shared_support.support_by_votes(votes, plan, seed=5)
    assert support.tolist() == list(range(8))
    votes[4:8] = 0  # only 4 qualify: the other 4 slots are the seeded random order's, the same on every node
    fewer = shared_support.support_by_votes(votes, plan, seed=5)
    assert set(range(4)) <= set(fewer.tolist()) and fewer.numel() == 8
    assert torch.equal(fewer, shared_support.support_by_votes(votes.clone(), plan, seed=5))


def test_proposals_are_each_chunks_top_k():
    plan = _plan(k=2)
    x = torch.zeros(70)
    x[[5, 9, 33, 64, 69]] = torch.tensor([1.0, -3.0, 2.0, 0.5, -0.25])
    assert shared_support.proposals(x, plan).nonzero().view(-1).tolist()[:2] == [9, 33]
    assert shared_support.proposals(x, plan)[[64, 69]].all()  # the partial last chunk keeps its own 2


def test_support_values_carry_values_only_and_error_feedback_keeps_the_rest():
    numel, bounds_of_slices = 256, (0, 128, 256)
    support = torch.tensor([1, 5, 130, 200])
    codec = SupportValues("fp32")
    codec.set_round(support, shared_support.slice_bounds(support, bounds_of_slices))
    x = torch.randn(numel)
    feedback = codecs.ErrorFeedback(codec, numel, decay=1.0, keep_sent=True)
    payload = feedback.encode(x)
    assert len(payload) == 2 * (codecs.HEADER_SIZE + 2 * 4)  # per slice: a header and 2 fp32 values, no index
    assert torch.equal(codec.decode_values(payload), x[support])
    expected = x.clone()
    expected[support] = 0
    assert torch.equal(feedback.residual, expected)
    with pytest.raises(codecs.CodecError, match="expected 24 bytes"):
        codec.decode_values(payload[:-1])


def test_a_slice_the_support_misses_sends_nothing_and_still_decodes():
    support = torch.tensor([0, 1, 5])
    codec = SupportValues("fp32")
    codec.set_round(support, [0, 2, 2, 3])  # the second of three slices holds no support coordinate
    x = torch.arange(8, dtype=torch.float32)
    payload = codec.encode(x)
    assert len(payload) == codec.max_encoded_size(8) == 2 * codecs.HEADER_SIZE + 3 * 4
    assert torch.equal(codec.decode(payload, 8)[support], x[support])


def test_public_score_is_an_ema_of_the_applied_aggregates():
    score = PublicScore(3, decay=0.5)
    score.update(torch.tensor([1.0, 0.0, -2.0]))
    score.update(torch.tensor([1.0, 4.0, 0.0]))
    assert score.score.tolist() == [1.5, 4.0, -1.0]
    other = PublicScore(3, decay=0.9)
    other.load_state_dict(score.state_dict())
    assert other.decay == 0.5 and torch.equal(other.score, score.score)


def test_parse_takes_chunk_k_and_values_from_the_codec_and_says_what_to_write():
    plan = shared_support.parse("shared:0.25", "chunk-topk:4096:64+stat2")
    assert (plan.chunk, plan.k, plan.top, plan.values, plan.result, plan.votes) == (4096, 64, 16, "stat2", "fp16", 0)
    assert shared_support.parse("vote", "chunk-topk:4096:128+stat2", "stat2", num_byzantine=2).votes == 3
    with pytest.raises(ValueError, match="shared:MIX"):
        shared_support.parse("shared", "chunk-topk:4096:64+stat2")
    with pytest.raises(ValueError, match="needs compression.codec = chunk-topk"):
        shared_support.parse("shared:0.5", "topk:0.01+int8")
    with pytest.raises(ValueError, match="value format alone"):
        shared_support.parse("vote", "chunk-topk:4096:64+stat2", "chunk-topk:4096:192+stat2")


def test_the_swarm_refuses_the_prototype_and_the_config_accepts_a_coordinate_wise_rule_with_it():
    from peer.cli.run_flags import resolve_run_config
    from peer.run.round_math import RoundMath

    cfg = resolve_run_config(RunConfig(), {"compression.codec": "chunk-topk:4096:128+stat2", "exchange.support": "vote",
                                           "aggregation.name": "trimmed-mean", "aggregation.num_byzantine": 1,
                                           "exchange.result_codec": "stat2"})
    with pytest.raises(ConfigError, match="only `swarmloco simulate` runs"):
        RoundMath(cfg, 1000)
    with pytest.raises(ConfigError, match="shared:MIX"):
        resolve_run_config(RunConfig(), {"exchange.support": "sometimes"})


def test_aligned_rule_holds_against_attackers_and_is_zero_off_the_support():
    from peer.cli.run_flags import resolve_run_config
    from peer.cli.simulate_shared import SharedSupportRound, swarm_math_config
    from peer.run.round_math import RoundMath

    cfg = resolve_run_config(RunConfig(), {"compression.codec": "chunk-topk:4096:64+fp32", "exchange.support": "shared:0",
                                           "aggregation.name": "trimmed-mean", "aggregation.num_byzantine": 2,
                                           "exchange.result_codec": "fp32", "compression.error_feedback_decay": 1.0})
    numel = 3 * 4096
    exchange = SharedSupportRound(cfg, RoundMath(swarm_math_config(cfg), numel), peers=8)
    generator = torch.Generator().manual_seed(0)
    honest = [1.0 + 0.1 * torch.randn(numel, generator=generator) for _ in range(6)]
    attackers = [torch.full((numel,), -1e3) for _ in range(2)]
    support = exchange.begin(0, attackers + honest)
    rows = [exchange.decode(exchange.encode(i, delta)) for i, delta in enumerate(attackers + honest)]
    applied = exchange.aggregate(rows, 0, excluded_for_cause=0)
    on = applied[support]
    low = torch.stack([h[support] for h in honest]).min(dim=0).values
    high = torch.stack([h[support] for h in honest]).max(dim=0).values
    assert bool(((on >= low) & (on <= high)).all())  # every coordinate within the honest values' range
    off = torch.ones(numel, dtype=torch.bool)
    off[support] = False
    assert int(applied[off].count_nonzero()) == 0 and support.numel() == 3 * 64
    exchange.finish(applied)
    assert torch.equal(exchange.score.score, applied)
    assert not torch.equal(exchange.begin(1, honest), support)  # mix 0: a fresh random support each round
