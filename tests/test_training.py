import pytest
import torch

from peer.run.config import InnerConfig, ModelConfig
from peer.learn.data import ShardSampler
from peer.learn.model import build_model, flat_params, load_flat_params
from peer.learn.training import InnerTrainer, evaluate, set_cpu_threads

TINY = ModelConfig(seq_len=16, d_model=32, n_layer=1, n_head=2)
TEXT = torch.frombuffer(bytearray(b"the quick brown fox jumps over the lazy dog. " * 60), dtype=torch.uint8)


def _sampler(seed: int = 0) -> ShardSampler:
    return ShardSampler(TEXT, shard=0, num_shards=1, batch_size=8, seq_len=16, seed=seed)


def test_a_few_steps_lower_loss_on_a_fixed_batch():
    model = build_model(TINY, seed=0)
    fixed = [_sampler(seed=99).next_batch()]
    before = evaluate(model, fixed)
    trainer = InnerTrainer(model, InnerConfig(lr=3e-3, warmup_steps=0), _sampler())
    stats = trainer.run(30)
    after = evaluate(model, fixed)
    assert before > 5.0 and after < before - 1.0
    assert stats.steps == 30 and stats.tokens == 30 * 8 * 16 and stats.seconds > 0
    assert stats.last_loss < stats.mean_loss  # loss was falling during the call


def test_warmup_is_linear_then_constant():
    trainer = InnerTrainer(build_model(TINY, seed=0), InnerConfig(lr=1e-3, warmup_steps=4), _sampler())
    assert [trainer.lr_at(s) for s in range(6)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])
    seen = []
    trainer.run(2, on_step=lambda step, loss: seen.append((step, trainer.optimizer.param_groups[0]["lr"])))
    trainer.run(1, on_step=lambda step, loss: seen.append((step, trainer.optimizer.param_groups[0]["lr"])))
    assert seen == [(1, 2.5e-4), (2, 5e-4), (3, 7.5e-4)]  # the warm-up continues across run() calls
    no_warmup = InnerTrainer(build_model(TINY, seed=0), InnerConfig(lr=1e-3, warmup_steps=0), _sampler())
    assert no_warmup.lr_at(0) == 1e-3


def test_a_phase_cut_where_stop_turns_true_then_resumed_equals_one_uncut_call():
    # Overlapped rounds stop a phase after the step during which the exchange finished and run
    # the rest later: the same steps, batches and AdamW state as one call (nothing moved between).
    whole = InnerTrainer(build_model(TINY, seed=0), InnerConfig(), _sampler())
    whole_stats = whole.run(7)
    cut = InnerTrainer(build_model(TINY, seed=0), InnerConfig(), _sampler())
    calls = []
    first = cut.run(7, stop=lambda: calls.append(cut.step) or cut.step >= 3)
    assert first.steps == 3 and calls == [1, 2, 3]  # asked after each step but the last
    rest = cut.run(7 - first.steps)
    joined = first.then(rest)
    assert torch.equal(flat_params(cut.model), flat_params(whole.model))
    assert joined.steps == 7 and joined.tokens == whole_stats.tokens and joined.last_loss == whole_stats.last_loss
    assert joined.mean_loss == pytest.approx(whole_stats.mean_loss)
    assert cut.run(2, stop=lambda: True).steps == 1  # at least one step is taken


def test_adamw_state_persists_across_rounds_and_in_place_param_loads():
    model = build_model(TINY, seed=0)
    trainer = InnerTrainer(model, InnerConfig(), _sampler())
    trainer.run(3)
    first = model.wte.weight
    state = trainer.optimizer.state[first]
    exp_avg = state["exp_avg"]
    assert int(state["step"]) == 3
    # An outer step replaces the values in place (load_flat_params), not the Parameter objects.
    load_flat_params(model, flat_params(build_model(TINY, seed=1)))
    trainer.run(2)
    assert trainer.optimizer.state[model.wte.weight] is state and state["exp_avg"] is exp_avg
    assert int(state["step"]) == 5 and trainer.step == 5


def test_weight_decay_only_on_matrices():
    trainer = InnerTrainer(build_model(TINY, seed=0), InnerConfig(weight_decay=0.1), _sampler())
    decayed, plain = trainer.optimizer.param_groups
    assert decayed["weight_decay"] == 0.1 and all(p.dim() == 2 for p in decayed["params"])
    assert plain["weight_decay"] == 0.0 and all(p.dim() == 1 for p in plain["params"])
    assert len(decayed["params"]) + len(plain["params"]) == len(list(trainer.model.parameters()))


def test_resume_from_state_dict_continues_bit_identically():
    cfg = InnerConfig(warmup_steps=3)
    model = build_model(TINY, seed=0)
    trainer = InnerTrainer(model, cfg, _sampler())
    trainer.run(4)
    params, state = flat_params(model), trainer.state_dict()
    trainer.run(3)
    expected = flat_params(model)

    resumed_model = build_model(TINY, seed=5)
    load_flat_params(resumed_model, params)
    resumed = InnerTrainer(resumed_model, cfg, _sampler())
    resumed.load_state_dict(state)
    assert resumed.step == 4
    resumed.run(3)
    assert torch.equal(flat_params(resumed_model), expected)


def test_poisoned_sampler_flips_every_label_and_keeps_the_sampler_state():
    from optim.attacks import PoisonedSampler

    clean, poisoned = _sampler(), PoisonedSampler(_sampler())
    for _ in range(3):
        (x, y), (px, py) = clean.next_batch(), poisoned.next_batch()
        assert torch.equal(px, x) and torch.equal(py, 255 - y)  # inputs intact, every target flipped
    resumed = _sampler()  # its state is the wrapped sampler's: a resume continues the same data order
    resumed.load_state_dict(poisoned.state_dict())
    assert torch.equal(resumed.next_batch()[1], 255 - poisoned.next_batch()[1])
    # Trained on, it moves the model differently from the same sampler unpoisoned.
    runs = []
    for sampler in (_sampler(), PoisonedSampler(_sampler())):
        model = build_model(TINY, seed=0)
        InnerTrainer(model, InnerConfig(), sampler).run(2)
        runs.append(flat_params(model))
    assert not torch.equal(*runs)


def test_evaluate_is_token_mean_and_restores_mode():
    model = build_model(ModelConfig(seq_len=16, d_model=32, n_layer=1, n_head=2, dropout=0.5), seed=0)
    model.train()
    batches = [_sampler(seed=s).next_batch() for s in range(2)]
    value = evaluate(model, batches)
    assert model.training
    model.eval()
    with torch.no_grad():
        manual = sum(model(x, y)[1].item() for x, y in batches) / 2  # equal-size batches
    assert value == pytest.approx(manual, rel=1e-6)
    assert evaluate(model, batches) == value and not model.training  # called in eval mode, it leaves eval mode
    with pytest.raises(ValueError):
        evaluate(model, [])


def test_set_cpu_threads():
    previous = torch.get_num_threads()
    try:
        set_cpu_threads(1)
        assert torch.get_num_threads() == 1
        with pytest.raises(ValueError, match="at least 1"):
            set_cpu_threads(0)
    finally:
        torch.set_num_threads(previous)
