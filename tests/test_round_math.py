"""The round math every node runs: deterministic, refusing bad updates, state that round-trips."""

import pytest
import torch

from peer.run.config import ConfigError, RunConfig
from peer.run.config_rules import check_run_config, with_suitable_aggregator
from peer.run.round_math import RoundMath, UpdateRejected, codec_seed


def config(**sections) -> RunConfig:
    """A run config for the whole-vector round math (all-to-all); sliced math: tests/test_slicing.py."""
    data = RunConfig().to_dict()
    data["exchange"]["mode"] = "all-to-all"
    for section, values in sections.items():
        data[section].update(values)
    return RunConfig.from_dict(data)


class ThreadCountRecorder:
    """Stands in for a RoundMath's aggregator or outer optimizer: records torch's thread count
    at each call (aggregator(...), outer.step(...)), then runs the real one."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.threads: list[int] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __call__(self, *args, **kwargs):
        self.threads.append(torch.get_num_threads())
        return self.inner(*args, **kwargs)

    def step(self, *args, **kwargs):
        self.threads.append(torch.get_num_threads())
        return self.inner.step(*args, **kwargs)


def test_apply_runs_single_threaded_and_gives_the_caller_back_its_thread_count():
    """Every node must reach the same bits whatever torch's thread count is where it runs.
    Today's rules are thread-invariant by construction (float64, content order: 1, 2, 4 and 8
    threads give equal bits up to d = 3M), so comparing results alone could not fail; apply()'s
    pin to one thread is what keeps a future rule with a plain float32 reduction honest, so the
    pin itself is asserted, for the rule and the outer step, and that the caller's count comes back."""
    cfg = config(aggregation={"name": "centered-clip"})
    torch.manual_seed(0)
    updates = [torch.randn(5000) * 0.01 for _ in range(3)]
    results = []
    for caller_threads in (1, 3):
        torch.set_num_threads(caller_threads)  # tests/conftest restores the session's count afterwards
        math = RoundMath(cfg, 5000)
        math.aggregator = rule = ThreadCountRecorder(math.aggregator)
        math.outer = outer_step = ThreadCountRecorder(math.outer)
        params = torch.ones(5000)
        math.apply(params, updates, round_=0)
        assert (rule.threads, outer_step.threads) == ([1], [1])
        assert torch.get_num_threads() == caller_threads
        results.append(params)
    assert torch.equal(results[0], results[1])

    # Rows that fail inside the pinned block (unequal lengths): the caller's count still comes back.
    math = RoundMath(cfg, 5000)
    with pytest.raises(RuntimeError, match="equal size"):
        math.apply(torch.ones(5000), [torch.zeros(5000), torch.zeros(4999), torch.zeros(5000)])
    assert torch.get_num_threads() == 3


def test_int8_updates_decoded_by_two_receivers_step_identically_to_nesterov_on_their_mean():
    cfg = config(compression={"codec": "int8"}, aggregation={"name": "mean"})
    torch.manual_seed(0)
    deltas = [torch.randn(5000) * 0.01 for _ in range(3)]
    senders = [RoundMath(cfg, 5000) for _ in deltas]
    payloads = [s.encode(d, 0) for s, d in zip(senders, deltas)]
    results = []
    for _ in range(2):
        receiver = RoundMath(cfg, 5000)
        params = torch.ones(5000)
        receiver.apply(params, [receiver.decode(p, 0) for p in payloads])
        results.append(params)
    assert torch.equal(results[0], results[1])
    # Nesterov on the mean of decoded updates: θ = 1 − lr·(g + m·g) at the first step.
    mean = torch.stack([senders[0].codec.decode(p, 5000, seed=codec_seed(cfg, 0)) for p in payloads]).mean(0)
    torch.testing.assert_close(results[0], 1 - 0.7 * (mean + 0.9 * mean))


def test_non_finite_and_corrupt_updates_are_rejected_with_reasons():
    cfg = config(compression={"codec": "fp16"})
    math = RoundMath(cfg, 100)
    bad = torch.zeros(100)
    bad[3] = float("nan")
    with pytest.raises(UpdateRejected) as err:
        math.decode(math.codec.encode(bad), 0)
    assert err.value.reason == "non-finite"
    with pytest.raises(UpdateRejected) as err:
        math.decode(b"\x00" * 17, 0)
    assert err.value.reason == "undecodable"


def test_global_state_roundtrip_includes_stateful_aggregator():
    cfg = config(aggregation={"name": "centered-clip"})
    a, b = RoundMath(cfg, 50), RoundMath(cfg, 50)
    params = torch.zeros(50)
    a.apply(params, [torch.full((50,), 0.1), torch.full((50,), 0.2), torch.full((50,), 0.3)])
    b.load_global_state_dict(a.global_state_dict())
    assert torch.equal(b.aggregator.previous, a.aggregator.previous)
    updates = [torch.full((50,), 0.5), torch.full((50,), -0.1), torch.full((50,), 0.2)]
    pa, pb = params.clone(), params.clone()
    a.apply(pa, updates)
    b.apply(pb, updates)
    assert torch.equal(pa, pb)


def test_default_median_becomes_centered_clip_on_sparse_codecs_unless_asked():
    sparse = config(compression={"codec": "topk:0.01+int8"})
    assert sparse.aggregation.name == "median"
    assert with_suitable_aggregator(sparse, explicit=False).aggregation.name == "centered-clip"
    assert with_suitable_aggregator(sparse, explicit=True).aggregation.name == "median"
    dense = config(compression={"codec": "fp16"})
    assert with_suitable_aggregator(dense, explicit=False).aggregation.name == "median"


def test_coordinate_wise_rules_refused_on_sparse_codecs():
    with pytest.raises(ConfigError, match="randk"):
        check_run_config(config(compression={"codec": "topk:0.01+int8"}, aggregation={"name": "median"}))
    check_run_config(config(compression={"codec": "randk:0.01+int8"}, aggregation={"name": "median"}))
    check_run_config(config(compression={"codec": "topk:0.01+int8"}, aggregation={"name": "centered-clip"}))


def test_excluded_byzantine_updates_lower_f_instead_of_stalling():
    cfg = config(aggregation={"name": "krum", "num_byzantine": 2})
    math = RoundMath(cfg, 4)
    assert math.effective_byzantine(8) == 2  # 8 >= 2f+3 = 7
    # Two NaN updates were excluded for cause: 6 remain, and the 2 attackers are already out.
    assert math.effective_byzantine(6, excluded_for_cause=2) == 0
    # Two honest peers were late instead: f stays as high as 6 rows allow (2f+3 <= 6 -> f = 1).
    assert math.effective_byzantine(6, excluded_for_cause=0) == 1
    params = torch.zeros(4)
    rows = [torch.full((4,), v) for v in (0.1, 0.11, 0.12, 0.09, 0.1, 0.1)]
    report = math.apply(params, rows, round_=0, excluded_for_cause=2)
    assert report is not None and sum(report.selected) == 1
    # Fewer rows than krum needs at all: the coordinate median of what is there, the mean of the
    # 2 rows (0.3); with fedavg at lr 1 the step is exactly -0.3.
    fallback = RoundMath(config(aggregation={"name": "krum", "num_byzantine": 2}, outer={"name": "fedavg", "lr": 1.0}), 4)
    params = torch.zeros(4)
    fallback.apply(params, [torch.full((4,), 0.2), torch.full((4,), 0.4)], round_=1)
    assert torch.equal(params, torch.full((4,), -0.3))


def test_the_outer_step_follows_its_warm_up_and_schedule_round_by_round():
    cfg = config(outer={"name": "fedavg", "lr": 2.0, "lr_warmup_rounds": 1, "lr_schedule": "linear", "lr_final": 0.5},
                 rounds={"rounds": 5})
    # round 0: half the step (warm-up of 1 round); then linear from 2.0 towards 1.0 over 4 rounds
    assert [cfg.outer.lr_at(r, 5) for r in range(6)] == [1.0, 2.0, 1.75, 1.5, 1.25, 1.0]
    math = RoundMath(cfg, 2)
    steps = []
    for r in range(5):
        params = torch.zeros(2)
        math.apply(params, [torch.ones(2)], round_=r)  # fedavg: θ -= lr * mean
        steps.append(-float(params[0]))
    assert steps == [1.0, 2.0, 1.75, 1.5, 1.25]
    params = torch.zeros(2)
    math.step_with_aggregate(params, torch.ones(2), round_=0)  # the sliced path steps the same way
    assert params.tolist() == [-1.0, -1.0]
    cosine = config(outer={"lr": 1.0, "lr_schedule": "cosine"}, rounds={"rounds": 4}).outer
    assert [round(cosine.lr_at(r, 4), 4) for r in range(4)] == [1.0, 0.8536, 0.5, 0.1464]
    assert config().outer.lr_at(7, 8) == 0.7  # the default: DiLoCo's constant 0.7


@pytest.mark.parametrize("outer, message", [
    ({"lr_warmup_rounds": -1}, "outer.lr_warmup_rounds=-1"),
    ({"lr_schedule": "step"}, "choose constant, cosine or linear"),
    ({"lr_final": 1.5}, "outer.lr_final=1.5"),
])
def test_a_bad_outer_schedule_is_refused_with_what_to_change(outer, message):
    with pytest.raises(ConfigError, match=message):
        config(outer=outer)
