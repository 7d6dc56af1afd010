"""min-max, min-sum and agr-tailored (optim/attacks_minmax.py), and the Divide-and-Conquer rule
(optim/aggregate_dnc.py), on the one-shot setting of issue 15 and in the sliced exchange."""

from __future__ import annotations

import json
import math

import pytest
import torch

from optim import aggregate, attacks
from optim.attacks_minmax import min_max_gamma, min_sum_gamma, perturbation, tailored_progress
from peer.run.config import RunConfig
from peer.run.round_math import RoundMath


def synthetic(n_honest: int, d: int = 4000, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Honest updates = signal μ + noise whose per-coordinate spread is 3x the signal's."""
    g = torch.Generator().manual_seed(seed)
    mu = 0.01 * torch.randn(d, generator=g)
    return mu, mu + 0.03 * torch.randn(n_honest, d, generator=g)


def craft(name: str, honest: torch.Tensor, f: int, **options) -> torch.Tensor:
    return attacks.build(name, **options)(honest[0], honest, round=0, rng=torch.Generator(), num_byzantine=f)


def progress(rule: str, honest: torch.Tensor, bad: torch.Tensor, f: int, mu: torch.Tensor, **options) -> float:
    rows = torch.cat([bad.expand(f, -1), honest])
    out = aggregate.build(rule, f, **options)(rows, seed=3).double()
    return float(out @ mu.double()) / float(mu.double() @ mu.double())


def halving_search(fits, gamma: float = 10.0, tol: float = 1e-9) -> float:
    """The paper's search for γ (Shejwalkar & Houmansadr 2021, Algorithm 1), as an oracle."""
    step, best = gamma / 2, 0.0
    while step > tol:
        if fits(gamma):
            best = gamma
            gamma += step
        else:
            gamma -= step
        step /= 2
    return best


@pytest.mark.parametrize("kind", ["unit-vector", "std", "sign"])
def test_min_max_and_min_sum_scale_is_the_largest_the_constraint_allows(kind):
    _, honest = synthetic(7, d=500)
    h = honest.double()
    mu, p = h.mean(dim=0), perturbation(kind, honest)
    pair = torch.cdist(h, h).square()
    radius, budget = pair.max().item(), pair.sum(dim=1).max().item()

    def worst(gamma):
        return (mu + gamma * p - h).square().sum(dim=1)

    gmm, gms = min_max_gamma(honest, p), min_sum_gamma(honest, p)
    assert gmm == pytest.approx(halving_search(lambda g: worst(g).max().item() <= radius), rel=1e-6)
    assert gms == pytest.approx(halving_search(lambda g: worst(g).sum().item() <= budget), rel=1e-6)
    assert worst(gmm).max().item() == pytest.approx(radius, rel=1e-9)  # tight: at the boundary
    assert worst(gms).sum().item() == pytest.approx(budget, rel=1e-9)
    bad = craft("min-max", honest, 2, perturbation=kind).double()
    torch.testing.assert_close(bad, (mu + gmm * p).float().double())
    assert torch.cdist(bad[None], h).max().item() <= radius**0.5 * (1 + 1e-6)  # no farther than honest pairs
    bad = craft("min-sum", honest, 2, perturbation=kind).double()
    assert torch.cdist(bad[None], h).square().sum().item() <= budget * (1 + 1e-5)


def test_perturbations_point_against_the_honest_mean():
    _, honest = synthetic(5, d=300)
    mu = honest.double().mean(dim=0)
    cos = torch.nn.functional.cosine_similarity
    assert cos(perturbation("unit-vector", honest), mu, dim=0).item() == pytest.approx(-1.0)
    assert torch.linalg.vector_norm(perturbation("unit-vector", honest)).item() == pytest.approx(1.0)
    assert torch.equal(perturbation("std", honest), -honest.double().std(dim=0))
    assert torch.equal(perturbation("sign", honest), -torch.sign(mu))
    # One honest update: no spread to hide in, the attacker sends it back.
    one = honest[:1]
    assert torch.equal(craft("min-max", one, 1), one[0]) and torch.equal(craft("min-sum", one, 1, perturbation="std"), one[0])


def test_issue_15_one_shot_figures():
    # n = 10, f = 3: min-max halves what median and trimmed mean keep (issue: 0.20); DnC keeps it all.
    mu, honest = synthetic(7, d=20_000)
    bad = craft("min-max", honest, 3)
    assert progress("mean", honest, bad, 3, mu) == pytest.approx(0.35, abs=0.05)
    assert progress("median", honest, bad, 3, mu) < 0.3
    assert progress("krum", honest, bad, 3, mu) < 0  # Krum picks the attackers' row: it walks backwards
    assert progress("dnc", honest, bad, 3, mu) > 0.9


def test_agr_tailored_hurts_its_rule_more_than_min_max():
    mu, honest = synthetic(7, d=4000, seed=1)
    tailored = craft("agr-tailored", honest, 3)  # rule median, the old default
    generic = craft("min-max", honest, 3)
    assert tailored_progress("median", honest, tailored, 3) < tailored_progress("median", honest, generic, 3) - 0.05
    assert progress("median", honest, tailored, 3, mu) < progress("median", honest, generic, 3, mu) - 0.05
    with pytest.raises(ValueError, match="rule must name an aggregator"):
        attacks.build("agr-tailored", rule="nope")
    with pytest.raises(ValueError, match="perturbation must be one of unit-vector, std, sign"):
        attacks.build("min-max", perturbation="up")


# ------------------------------------------------------------------ Divide-and-Conquer


def test_dnc_drops_the_attackers_and_averages_the_rest():
    mu, honest = synthetic(7, d=3000, seed=2)
    bad = craft("min-sum", honest, 3)
    rows = torch.cat([honest[:3], bad.expand(3, -1), honest[3:]])
    agg = aggregate.build("dnc", 3)
    out = agg(rows, seed=5)
    assert agg.last_report.selected == [True] * 3 + [False] * 3 + [True] * 4
    assert agg.last_report.weights == pytest.approx([1 / 7] * 3 + [0.0] * 3 + [1 / 7] * 4)
    torch.testing.assert_close(out, honest.double().mean(dim=0).float())


def test_dnc_subsets_come_from_the_seed_and_never_empty_the_kept_set():
    _, honest = synthetic(8, d=3000, seed=3)
    agg = aggregate.build("dnc", 2, subsample=500, iterations=5)
    a, b = agg(honest, seed=7), agg(honest.flip(0), seed=7)
    assert torch.equal(a, b)  # any row order, same bits
    assert not torch.equal(a, agg(honest, seed=8))  # another round's seed, other subsets, other drops
    # No attacker: 5 rounds each drop 2 of 8 rows; the kept set shrinks but is never emptied.
    kept = sum(agg.last_report.selected)
    assert 1 <= kept <= 6
    with pytest.raises(ValueError, match="option c must be a number > 0"):
        aggregate.build("dnc", 1, c=0)
    with pytest.raises(ValueError, match="dnc with num_byzantine=2 needs at least 2f\\+1 = 5"):
        aggregate.build("dnc", 2)(honest[:4])


def test_dnc_runs_per_slice_in_the_sliced_exchange():
    cfg = RunConfig.from_dict({"exchange": {"mode": "sliced", "slices": 4},
                               "aggregation": {"name": "dnc", "num_byzantine": 2}})
    math = RoundMath(cfg, 2000)  # not refused: each slice's owners run DnC on that slice alone
    mu, honest = synthetic(6, d=2000, seed=4)
    bad = craft("min-max", honest, 2)
    rows = torch.cat([bad.expand(2, -1), honest])  # (8, 2000)
    for j in range(math.layout.num_slices):
        part = rows[:, math.layout.range(j)]
        data = math.reduce_slice(part, j, round_=3)
        assert data == math.reduce_slice(part.flip(0), j, round_=3)  # every owner signs the same bytes
        # per slice the two attackers are the outliers: the slice's result is the honest mean (fp16)
        torch.testing.assert_close(math.decode_result(data, j), honest[:, math.layout.range(j)].mean(dim=0),
                                   atol=1e-4, rtol=2e-3)
    median = RoundMath(RunConfig.from_dict({"exchange": {"mode": "sliced", "slices": 4},
                                            "aggregation": {"name": "median", "num_byzantine": 2}}), 2000)
    j = 0
    lost = median.decode_result(median.reduce_slice(rows[:, median.layout.range(j)], j, round_=3), j)
    assert float(lost.double() @ mu[median.layout.range(j)].double()) < 0.8 * float(mu[median.layout.range(j)].double().square().sum())


def test_simulate_reaches_the_new_attacks_and_dnc_by_name(tmp_path, capsys):
    from peer.cli.main import main
    from tests.helpers import write_run_config

    config = write_run_config(tmp_path / "run.json", model={"d_model": 16, "seq_len": 16}, inner={"steps": 2},
                              rounds={"rounds": 2}, data={"max_corpus_bytes": 100_000})
    out = tmp_path / "sim.json"
    code = main(["simulate", "--config", str(config), "--peers", "5", "--num-byzantine", "2", "--aggregator", "dnc",
                 "--attack", "min-sum", "--attack-option", "perturbation=std", "--json", str(out)])
    assert code == 0, capsys.readouterr().err
    result = json.loads(out.read_text())
    assert (result["attack"], result["attack_options"], result["aggregator"]) == ("min-sum", {"perturbation": "std"}, "dnc")
    assert result["config"]["exchange"]["mode"] == "sliced"  # dnc runs slice by slice, not refused
    assert math.isfinite(result["final_val_loss"]) and result["final_val_loss"] < result["initial_val_loss"]
    assert main(["simulate", "--config", str(config), "--num-byzantine", "1", "--attack", "min-max",
                 "--attack-option", "perturbation=up"]) == 2
    assert "perturbation must be one of unit-vector, std, sign" in capsys.readouterr().err


def test_strong_grid_resumes_and_reruns_a_run_whose_config_changed(tmp_path):
    from scripts import byzantine_strong as strong
    from scripts.byzantine_bench import load

    args = ["--profile", "tiny", "--rules", "median", "--seeds", "0", "--workers", "0", "--out", str(tmp_path)]
    assert strong.main([*args, "--limit", "2"]) == 0
    path = tmp_path / "byzantine_strong.json"
    first = load(path)
    assert len(first) == 2 and all(r["status"] == "ok" and r["fingerprint"] for r in first.values())
    todo = [c for c in strong.plan([0], ["median"])
            if first.get(c.key, {}).get("fingerprint") != strong.fingerprint(c, strong.PROFILES["tiny"])]
    assert len(todo) == len(strong.plan([0], ["median"])) - 2  # the stored runs are skipped
    data = json.loads(path.read_text())
    data["runs"][0]["fingerprint"] = "stale"  # as if its config had changed since
    path.write_text(json.dumps(data))
    assert strong.main([*args, "--limit", "1"]) == 0
    again = load(path)
    assert again[data["runs"][0]["key"]]["fingerprint"] == first[data["runs"][0]["key"]]["fingerprint"]
    assert "min-max(perturbation=std)" in strong.LABELS and "agr-tailored(rule=dnc)" in strong.LABELS


def test_oneshot_script_writes_json_and_the_md_from_it(tmp_path):
    from scripts import oneshot_attacks

    assert oneshot_attacks.main(["--d", "300", "--seeds", "0", "--rounds", "2", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "oneshot_attacks.json").read_text())
    shot = data["one_shot"]
    assert shot["dnc|f3|min-max"] > 0.9 and shot["median|f3|min-max"] < 0.6  # dnc drops the attackers, median follows
    assert shot["median+bucket2|f3|none"] is None  # refused: 5 buckets < 2f + 1
    md = (tmp_path / "oneshot_attacks.md").read_text()
    assert oneshot_attacks.main(["--report-only", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "oneshot_attacks.md").read_text() == md
