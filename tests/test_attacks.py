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


# --- compression-aware attacks (optim/attacks_sparse.py) against chunk-topk:4096:64+stat2 ----------

D, CHUNK, K, PEERS = 8192, 4096, 64, 6


def sparse_honest(seed=0, scale=1.0):
    """(6, 8192) honest rows as the sparse codec sends them: in each chunk of 4096, offsets 0..31
    are sent by all six peers (value ~ +1) and each peer adds 32 of the pool 100..299 (random
    sign, |value| in [0.5, 1.5)); (counts (8192,) of honest senders per coordinate)."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.zeros(PEERS, D)
    for i in range(PEERS):
        for c in range(D // CHUNK):
            base = c * CHUNK
            rows[i, base : base + 32] = 1.0 + 0.1 * torch.rand(32, generator=g)
            pool = base + 100 + torch.randperm(200, generator=g)[:32]
            sign = torch.randint(0, 2, (32,), generator=g) * 2.0 - 1.0
            rows[i, pool] = sign * (0.5 + torch.rand(32, generator=g))
    return rows * scale, (rows != 0).sum(dim=0)


def per_chunk(mask):
    return mask.view(-1, CHUNK).sum(dim=1).tolist()


def median_norm(rows):
    return torch.linalg.vector_norm(rows.double(), dim=1).median().item()  # the lower median of 6


def roundtrip(x):
    from optim import codecs

    codec = codecs.build("chunk-topk:4096:64+stat2")
    return codec.decode(codec.encode(x), x.numel())


def test_index_poison_takes_the_least_sent_coordinates_opposite_the_honest_mean():
    honest, counts = sparse_honest()
    out = run("index-poison", own=honest[0], honest=honest)
    assert out.dtype == torch.float32 and bool(torch.isfinite(out).all())
    nz = out != 0
    assert per_chunk(nz) == [K, K]
    assert counts[nz].max().item() == 0  # nobody sends them: 4096 - 32 - ~160 such coordinates per chunk
    # Ties (count 0, honest mean 0) go by offset: 32..95 of each chunk (0..31 are sent by all six).
    expected = [c * CHUNK + o for c in range(2) for o in range(32, 32 + K)]
    assert all(counts[i] == 0 for i in expected)
    assert nz.nonzero().view(-1).tolist() == expected
    assert torch.linalg.vector_norm(out.double()).item() == pytest.approx(median_norm(honest), rel=1e-6)
    torch.testing.assert_close(roundtrip(out), out, rtol=1e-5, atol=0.0)  # one magnitude: the codec keeps it
    half = run("index-poison", own=honest[0], honest=honest, scale=1.5, fraction=0.5)
    assert per_chunk(half != 0) == [32, 32]
    assert torch.linalg.vector_norm(half.double()).item() == pytest.approx(1.5 * median_norm(honest), rel=1e-6)


def test_index_poison_on_dense_rows_prefers_few_senders_then_a_large_mean_and_opposes_it():
    # chunk 4, top-2: per chunk each row sends its 2 largest |values|.
    honest = torch.tensor(
        [
            [5.0, 4.0, 0.1, -0.3, 1.0, 2.0, 3.0, 4.0],
            [5.0, 0.2, 4.0, -0.3, 1.0, 2.0, 3.0, 4.0],
            [5.0, 4.0, 0.1, -0.3, 1.0, 2.0, 4.0, 3.0],
        ]
    )
    # chunk 0 senders: [3, 2, 1, 0]; chunk 1: [0, 0, 3, 3]. Means: -0.3 at 3; 1.0, 2.0 at 4, 5.
    out = run("index-poison", own=honest[0], honest=honest, chunk=4, topk=2)
    assert (out != 0).nonzero().view(-1).tolist() == [2, 3, 4, 5]  # 3 (0 senders) then 2 (1); 5 before 4 (|mean| 2 > 1)
    norms = torch.linalg.vector_norm(torch.tensor([[5.0, 4.0, 3.0, 4.0], [5.0, 4.0, 3.0, 4.0], [5.0, 4.0, 4.0, 3.0]]), dim=1)
    a = norms.median().item() / 2  # 4 coordinates of one magnitude
    assert out.tolist() == pytest.approx([0.0, 0.0, -a, a, -a, -a, 0.0, 0.0])


def test_slow_accumulate_pushes_the_same_coordinates_the_same_way_every_round():
    attack = attacks.build("slow-accumulate")
    outs = []
    for r in range(5):
        honest, _ = sparse_honest(seed=r, scale=1.0 + r)
        out = attack(honest[0], honest, round=r, rng=torch.Generator().manual_seed(r), num_byzantine=2)
        assert bool(torch.isfinite(out).all()) and per_chunk(out != 0) == [K, K]
        assert torch.linalg.vector_norm(out.double()).item() == pytest.approx(0.5 * median_norm(honest), rel=1e-6)
        outs.append(out)
    for out in outs[1:]:
        assert torch.equal(out != 0, outs[0] != 0) and torch.equal(torch.sign(out), torch.sign(outs[0]))
    signs = torch.sign(outs[0][outs[0] != 0])
    assert 0 < int((signs > 0).sum()) < 2 * K  # seeded signs, both present
    honest, _ = sparse_honest()
    other = attacks.build("slow-accumulate", seed=7)(honest[0], honest, round=0, rng=torch.Generator(), num_byzantine=2)
    assert int(((other != 0) & (outs[0] != 0)).sum()) < K  # another seed, another set (2 of 64 per chunk by chance)
    torch.testing.assert_close(roundtrip(outs[0]), outs[0], rtol=1e-5, atol=0.0)
    quarter = run("slow-accumulate", own=outs[0], honest=honest, fraction=0.25)
    assert per_chunk(quarter != 0) == [16, 16]


def test_vote_tailored_attackers_agree_on_coordinates_one_honest_peer_sends():
    honest, counts = sparse_honest()
    a = attacks.build("vote-tailored")(honest[0] * 3, honest, round=4, rng=torch.Generator().manual_seed(1), num_byzantine=2)
    b = attacks.build("vote-tailored")(-honest[1], honest, round=4, rng=torch.Generator().manual_seed(2), num_byzantine=2)
    assert torch.equal(a, b) and bool(torch.isfinite(a).all())
    nz = a != 0
    assert counts[nz].unique().tolist() == [1]
    value = honest.sum(dim=0)  # the one honest sender's value there
    assert bool((torch.sign(a[nz]) == -torch.sign(value[nz])).all())
    for c in range(2):  # the K single-sender coordinates with the largest |honest value|
        ones = [i for i in range(c * CHUNK, (c + 1) * CHUNK) if counts[i] == 1]
        ones.sort(key=lambda i: (-abs(value[i].item()), i))
        assert len(ones) > K
        assert sorted(nz[c * CHUNK : (c + 1) * CHUNK].nonzero().view(-1).add(c * CHUNK).tolist()) == sorted(ones[:K])
    assert torch.linalg.vector_norm(a.double()).item() == pytest.approx(2.0 * median_norm(honest), rel=1e-6)
    back = roundtrip(a)
    assert torch.equal(back != 0, nz) and torch.equal(torch.sign(back), torch.sign(a))


def test_vote_tailored_widens_to_a_few_senders_and_is_zero_when_none_qualify():
    honest, counts = sparse_honest()
    wide = run("vote-tailored", own=honest[0], honest=honest, max_honest=3, topk=64, scale=1.0)
    assert set(counts[wide != 0].tolist()) == {1}  # more than 64 single-sender coordinates per chunk: never needs 2
    only_ones = (counts == 1).view(-1, CHUNK).sum(dim=1)
    small = run("vote-tailored", own=honest[0], honest=honest, max_honest=2, chunk=CHUNK, topk=int(only_ones.max()) + 5)
    picked = counts[small != 0]
    assert int((picked == 1).sum()) == int(only_ones.sum()) and set(picked.tolist()) == {1, 2}
    everyone = honest[:, :32].clone()  # every coordinate sent by all six: none reaches f+1 through one honest vote
    assert run("vote-tailored", own=everyone[0], honest=everyone).tolist() == [0.0] * 32


def test_sparse_attack_option_validation():
    with pytest.raises(ValueError, match=r"topk \(128\) must be <= chunk \(64\)"):
        attacks.build("index-poison", chunk=64, topk=128)
    with pytest.raises(ValueError, match=r"fraction must be in \(0, 1\]"):
        attacks.build("slow-accumulate", fraction=1.5)
    with pytest.raises(ValueError, match="seed must be an integer >= 0"):
        attacks.build("slow-accumulate", seed=-1)
    with pytest.raises(ValueError, match="max_honest must be an integer >= 1"):
        attacks.build("vote-tailored", max_honest=0)
    with pytest.raises(ValueError, match="magnitude must be a number > 0"):
        attacks.build("slow-accumulate", magnitude=0)
    with pytest.raises(ValueError, match="scale must be a number > 0"):
        attacks.build("vote-tailored", scale=-2)
