"""Outer optimizers (optim/outer.py): Nesterov against torch SGD, FedAvg, DeMo's decoupled momentum."""

from __future__ import annotations

import pytest
import torch

from optim import codecs, dct, outer
from optim.outer import OuterOptimizer, build
from tests.helpers import vector

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("foreach", [False, True])
def test_nesterov_matches_torch_sgd_over_several_steps(foreach: bool) -> None:
    params = vector(257, seed=0)
    reference = torch.nn.Parameter(params.clone())
    sgd = torch.optim.SGD([reference], lr=0.7, momentum=0.9, nesterov=True, foreach=foreach)
    optimizer = build("nesterov")
    for step in range(6):
        aggregate = vector(257, seed=10 + step) * 0.01
        reference.grad = aggregate.clone()
        sgd.step()
        optimizer.step(params, optimizer.transmit(aggregate))
        assert torch.equal(params, reference.detach())  # same operations in the same order: bit-exact
    assert torch.equal(optimizer.global_state_dict()["momentum_buffer"], sgd.state[reference]["momentum_buffer"])


def test_nesterov_golden_values_by_hand() -> None:
    params, optimizer = torch.tensor([1.0]), build("nesterov", lr=0.7, momentum=0.9)
    optimizer.step(params, torch.tensor([1.0]))  # buf = 1; θ = 1 - 0.7*(1 + 0.9*1) = -0.33
    assert params.item() == pytest.approx(-0.33, abs=1e-6)
    optimizer.step(params, torch.tensor([1.0]))  # buf = 1.9; θ = -0.33 - 0.7*(1 + 1.71) = -2.227
    assert params.item() == pytest.approx(-2.227, abs=1e-6)


def test_fedavg_subtracts_the_scaled_aggregate_and_transmits_unchanged() -> None:
    params = torch.tensor([1.0, 2.0, 3.0])
    optimizer = build("fedavg")
    delta = torch.tensor([0.5, -1.0, 0.0])
    assert torch.equal(optimizer.transmit(delta), delta)
    optimizer.step(params, delta)
    assert params.tolist() == [0.5, 3.0, 3.0]  # θ_global - mean(θ_global - θ_local) = mean θ_local
    build("fedavg", lr=0.5).step(params, torch.tensor([1.0, 1.0, 1.0]))
    assert params.tolist() == [0.0, 2.5, 2.5]


def test_demo_transmitted_part_plus_remaining_momentum_is_the_accumulated_momentum() -> None:
    optimizer = build("demo", decay=0.9, chunk=64, topk=4)
    expected_momentum = torch.zeros(1000)
    for round_index in range(4):
        delta = vector(1000, seed=20 + round_index)
        expected_momentum = 0.9 * expected_momentum + delta
        sent = optimizer.transmit(delta)
        remaining = optimizer.local_state_dict()["momentum"]
        assert torch.allclose(sent + remaining, expected_momentum, atol=1e-5)
        expected_momentum = remaining  # only what was not sent carries over
        # what was sent is 4-sparse per chunk in the DCT domain (the full chunks; the last is padded)
        coefficients = dct.dct(dct.to_chunks(sent, 64))[:-1]
        assert ((coefficients.abs() > 1e-4).sum(dim=1) <= 4).all()
        assert sent.norm() > 0.1 * (sent + remaining).norm()  # the kept components carry real energy


@pytest.mark.parametrize("d", [1024, 1000])
def test_demo_transmitted_part_round_trips_through_its_codec(d: int) -> None:
    optimizer = build("demo")
    optimizer.transmit(vector(d, seed=1))
    sent = optimizer.transmit(vector(d, seed=2))
    codec = codecs.build(optimizer.codec_spec)
    assert codec.spec == "dct-topk:64:4"
    decoded = codec.decode(codec.encode(sent), d)
    # exact up to rounding when d fills whole chunks; a short last chunk loses a little to truncation
    tolerance = 1e-5 if d % 64 == 0 else 0.1
    assert (decoded - sent).norm() <= tolerance * sent.norm()
    assert torch.allclose(decoded[: d // 64 * 64], sent[: d // 64 * 64], atol=1e-5)


def test_demo_step_applies_the_sign_of_the_aggregate() -> None:
    params = torch.tensor([1.0, 1.0, 1.0])
    build("demo", lr=0.01).step(params, torch.tensor([2.0, -3e-9, 0.0]))
    assert torch.allclose(params, torch.tensor([0.99, 1.01, 1.0]))


def test_state_dicts_round_trip_and_resume_identically() -> None:
    params_a = vector(300, seed=3)
    first = build("nesterov")
    for step in range(3):
        first.step(params_a, vector(300, seed=30 + step))
    second = build("nesterov")
    second.load_global_state_dict(first.global_state_dict())
    second.load_local_state_dict(first.local_state_dict())
    params_b = params_a.clone()
    first.step(params_a, vector(300, seed=40))
    second.step(params_b, vector(300, seed=40))
    assert torch.equal(params_a, params_b)

    demo_a, demo_b = build("demo"), build("demo")
    demo_a.transmit(vector(300, seed=5))
    demo_b.load_local_state_dict(demo_a.local_state_dict())
    demo_b.load_global_state_dict(demo_a.global_state_dict())
    assert torch.equal(demo_a.transmit(vector(300, seed=6)), demo_b.transmit(vector(300, seed=6)))
    state = demo_a.local_state_dict()
    demo_a.transmit(vector(300, seed=7))
    assert not torch.equal(state["momentum"], demo_a.local_state_dict()["momentum"])  # a copy, not a view

    demo_a.load_local_state_dict({})  # an empty dict (nothing saved) resets to a fresh state
    assert demo_a.local_state_dict()["momentum"] is None

    fresh = build("nesterov")
    fresh.load_global_state_dict(build("nesterov").global_state_dict())  # before any step: no buffer
    assert fresh.global_state_dict()["momentum_buffer"] is None


def test_state_from_another_optimizer_or_layout_is_refused() -> None:
    with pytest.raises(ValueError, match="saved by outer optimizer 'demo'"):
        build("nesterov").load_global_state_dict({"name": "demo"})
    nesterov = build("nesterov")
    nesterov.load_global_state_dict({"name": "nesterov", "momentum_buffer": torch.zeros(5)})
    with pytest.raises(ValueError, match="expected 3"):
        nesterov.step(torch.zeros(3), torch.zeros(3))
    with pytest.raises(ValueError, match="float32"):
        build("demo").load_local_state_dict({"name": "demo", "momentum": torch.zeros(3, dtype=torch.float64)})


@pytest.mark.parametrize("name", outer.NAMES)
def test_every_optimizer_checks_shapes_and_follows_the_protocol(name: str) -> None:
    optimizer = build(name)
    assert isinstance(optimizer, OuterOptimizer)
    with pytest.raises(ValueError, match="expected 4"):
        optimizer.step(torch.zeros(4), torch.zeros(5))
    with pytest.raises(ValueError, match="flat"):
        optimizer.step(torch.zeros(2, 2), torch.zeros(4))


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("adam", {}, "choose one of nesterov, fedavg, demo"),
        ("nesterov", {"decay": 0.9}, "no option decay; it accepts lr, momentum"),
        ("nesterov", {"momentum_buffer": None}, "no option momentum_buffer"),
        ("demo", {"momentum": 0.9}, "accepts lr, decay, chunk, topk"),
        ("nesterov", {"lr": 0.0}, "positive learning rate"),
        ("nesterov", {"momentum": 1.0}, r"\[0, 1\)"),
        ("demo", {"topk": 65}, "topk <= chunk"),
        ("demo", {"decay": 0.0}, r"\(0, 1\]"),
        ("fedavg", {"lr": -1.0}, "positive"),
    ],
)
def test_build_rejects_bad_names_and_options(name: str, options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build(name, **options)


def test_build_passes_options() -> None:
    optimizer = build("demo", lr=0.01, decay=0.99, chunk=32, topk=2)
    assert (optimizer.lr, optimizer.decay, optimizer.chunk, optimizer.topk) == (0.01, 0.99, 32, 2)
    assert optimizer.codec_spec == "dct-topk:32:2"
