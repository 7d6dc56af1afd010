"""Attacks: every one checked numerically against its definition."""

import math
from statistics import NormalDist

import pytest
import torch

from optim import aggregate, attacks

OWN = torch.tensor([1.0, -2.0, 2.0])
HONEST = torch.tensor([[1.0, 0.0, 2.0], [3.0, 2.0, 2.0], [2.0, 4.0, 2.0]])  # mean (2, 2, 2)


def run(name, own=OWN, honest=HONEST, num_byzantine=1, history=None, seed=0, **options):
    attack = attacks.build(name, **options)
    return attack(
        own,
        honest,
        round=3,
        rng=torch.Generator().manual_seed(seed),
        num_byzantine=num_byzantine,
        history=history,
    )


def test_sign_flip():
    assert run("sign-flip").tolist() == [-1.0, 2.0, -2.0]
    assert run("sign-flip", scale=3.0).tolist() == [-3.0, 6.0, -6.0]


def test_gaussian_is_seeded_noise_with_sigma():
    big = torch.zeros(20000)
    a = run("gaussian", own=big, honest=big[None], sigma=2.0, seed=1)
    b = run("gaussian", own=big, honest=big[None], sigma=2.0, seed=1)
    assert torch.equal(a, b)
    assert not torch.equal(a, run("gaussian", own=big, honest=big[None], sigma=2.0, seed=2))
    assert a.std().item() == pytest.approx(2.0, rel=0.03)
    assert abs(a.mean().item()) < 0.05


def test_label_flip_is_a_data_attack():
    attack = attacks.build("label-flip")
    assert attack.data_poisoning
    assert not attacks.build("sign-flip").data_poisoning
    out = run("label-flip")
    assert torch.equal(out, OWN) and out.data_ptr() != OWN.data_ptr()
    x = torch.tensor([[65, 66]])
    y = torch.tensor([[0, 255]])
    px, py = attacks.poison_batch(x, y)
    assert torch.equal(px, x) and py.tolist() == [[255, 0]]
    assert attacks.poison_batch(x, torch.tensor([[3]]), vocab=10)[1].tolist() == [[6]]
    with pytest.raises(ValueError, match=r"targets must lie in \[0, 10\)"):
        attacks.poison_batch(x, torch.tensor([[10]]), vocab=10)


def test_alie_z_formula_and_update():
    # n = 8, f = 2: s = floor(8/2 + 1) - 2 = 3, z = Phi^-1((8 - 3) / 8) = Phi^-1(0.625) ~ 0.3186.
    z = attacks.alie_z(8, 2)
    assert z == pytest.approx(NormalDist().inv_cdf(0.625))
    assert z == pytest.approx(0.318639, abs=1e-6)
    honest = torch.tensor([[0.0, 1.0], [2.0, 1.0], [4.0, 1.0], [6.0, 1.0], [8.0, 1.0], [10.0, 1.0]])
    # 6 honest + 2 Byzantine = 8 peers. Mean (5, 1); unbiased std (sqrt 14, 0).
    out = run("alie", own=torch.zeros(2), honest=honest, num_byzantine=2)
    torch.testing.assert_close(out, torch.tensor([5.0 - z * math.sqrt(14.0), 1.0]))
    out = run("alie", own=torch.zeros(2), honest=honest, num_byzantine=2, z=1.5)
    torch.testing.assert_close(out, torch.tensor([5.0 - 1.5 * math.sqrt(14.0), 1.0]))
    with pytest.raises(ValueError, match="majority.*pass the z option"):
        attacks.alie_z(4, 3)


def test_ipm_points_against_the_honest_mean():
    out = run("ipm")
    assert out.tolist() == pytest.approx([-0.2, -0.2, -0.2])
    mean = HONEST.mean(dim=0)
    cosine = torch.nn.functional.cosine_similarity(out, mean, dim=0).item()
    assert cosine == pytest.approx(-1.0)
    assert run("ipm", eps=2.0).tolist() == pytest.approx([-4.0, -4.0, -4.0])


def test_mimic_copies_one_honest_peer():
    # Distances from the mean (2,2,2): row 0 sqrt 5, row 1 1, row 2 sqrt 4 = 2 -> row 0.
    assert run("mimic").tolist() == HONEST[0].tolist()
    assert run("mimic", peer=2).tolist() == HONEST[2].tolist()
    with pytest.raises(ValueError, match="peer=5 but only 3 honest"):
        run("mimic", peer=5)


def test_stale_replay():
    history = [torch.full((3,), 10.0), torch.full((3,), 20.0), torch.full((3,), 30.0)]
    assert run("stale-replay", history=history).tolist() == [30.0] * 3
    assert run("stale-replay", history=history, delay=3).tolist() == [10.0] * 3
    assert run("stale-replay", history=history, delay=4).tolist() == OWN.tolist()  # not enough history
    assert run("stale-replay").tolist() == OWN.tolist()


def test_free_rider():
    assert run("free-rider").tolist() == [0.0, 0.0, 0.0]
    assert run("free-rider", mode="copy").tolist() == [2.0, 2.0, 2.0]


def test_nan_and_inf():
    assert torch.isnan(run("nan")).all()
    out = run("nan", inf=True)
    assert torch.isinf(out).all() and (out > 0).all()
    # The aggregator refuses such rows rather than propagating them.
    with pytest.raises(ValueError, match="NaN or Inf"):
        aggregate.build("mean")(torch.stack([OWN, out]))


def test_huge_norm_ratio_and_direction():
    out = run("huge-norm")
    honest_mean_norm = torch.linalg.vector_norm(HONEST, dim=1).mean().item()  # (sqrt 5 + sqrt 17 + sqrt 24) / 3
    assert torch.linalg.vector_norm(out).item() / honest_mean_norm == pytest.approx(1e6, rel=1e-5)
    cosine = torch.nn.functional.cosine_similarity(out, OWN, dim=0).item()
    assert cosine == pytest.approx(1.0, abs=1e-6)
    out = run("huge-norm", own=torch.zeros(3), factor=10.0)  # zero update: all-ones direction
    torch.testing.assert_close(out, torch.full((3,), 10.0 * honest_mean_norm / math.sqrt(3)))


def test_robust_rule_resists_huge_norm_but_mean_does_not():
    honest = torch.randn(6, 50, generator=torch.Generator().manual_seed(0))
    bad = run("huge-norm", own=honest[0], honest=honest)
    rows = torch.cat([honest, bad[None]])
    assert torch.linalg.vector_norm(aggregate.build("mean")(rows)) > 1e4
    assert torch.linalg.vector_norm(aggregate.build("trimmed-mean", 1)(rows)) < 10


def test_every_attack_returns_float32_of_own_shape_and_leaves_inputs_alone():
    own, honest = OWN.clone(), HONEST.clone()
    for name in attacks.NAMES:
        out = run(name, own=own, honest=honest, history=[torch.ones(3)])
        assert out.shape == (3,) and out.dtype == torch.float32, name
        assert torch.equal(own, OWN) and torch.equal(honest, HONEST), name


def test_validation_messages():
    with pytest.raises(ValueError, match="valid names: sign-flip, gaussian"):
        attacks.build("flip")
    with pytest.raises(ValueError, match="unknown option.*sigma.*accepted: scale"):
        attacks.build("sign-flip", sigma=1.0)
    with pytest.raises(ValueError, match="accepted: none"):
        attacks.build("label-flip", scale=1.0)
    with pytest.raises(ValueError, match="sigma must be a number > 0"):
        attacks.build("gaussian", sigma=0)
    with pytest.raises(ValueError, match="mode must be 'zero' or 'copy'"):
        attacks.build("free-rider", mode="steal")
    with pytest.raises(ValueError, match="delay must be an integer >= 1"):
        attacks.build("stale-replay", delay=0)
    with pytest.raises(ValueError, match=r"honest must be \(k, 3\)"):
        run("ipm", honest=torch.zeros(2, 4))
    with pytest.raises(ValueError, match="needs at least one honest update"):
        run("alie", honest=torch.zeros(0, 3))
    with pytest.raises(ValueError, match="num_byzantine counts the attackers"):
        run("sign-flip", num_byzantine=0)
