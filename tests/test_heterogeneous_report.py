"""benchmarks/heterogeneous.md is a pure function of benchmarks/heterogeneous.json
(scripts/bench_heterogeneous.py --report-only), its rows ran the issue's speeds, and every peer of
every row ended on its coordinator's hash."""

from __future__ import annotations

import json
import sys

import pytest

from tests.helpers import ROOT, assert_md_regenerates

sys.path.insert(0, str(ROOT / "scripts"))

import bench_heterogeneous  # noqa: E402
import heterogeneous_report  # noqa: E402


def test_heterogeneous_md_is_generated_from_its_json(tmp_path):
    source = ROOT / "benchmarks/heterogeneous.json"
    assert_md_regenerates(bench_heterogeneous.main, ["--report-only", "--json", str(source)], "heterogeneous.md", tmp_path)
    rows = json.loads(source.read_text())["rows"]
    assert {"fixed-h", "window", "homogeneous"} <= set(rows)
    for name, row in rows.items():  # rows of other seeds are named <row>-s<seed>, and ran that seed
        plan, seed = heterogeneous_report.seed_of(name)
        assert plan in ("fixed-h", "window", "homogeneous") and row["config"]["seed"] == seed, name
        if plan == "window":  # the speed probes: a rate per peer, slower with a smaller quota
            rates = row["calibration"]["rates"]
            assert len(rates) == 4 and min(rates[:2]) > rates[2] > rates[3] > 0, name
    assert rows["fixed-h"]["speeds"] == rows["window"]["speeds"] == [1.0, 1.0, 0.5, 0.25]
    assert rows["fixed-h"]["window_s"] == 0 < rows["window"]["window_s"]
    assert all(heterogeneous_report.in_sync(row) for row in rows.values())
    # a fixed H counts every update the same; the window counts each peer's work
    assert heterogeneous_report.counted_shares(rows["fixed-h"]) == [0.25] * 4
    window = heterogeneous_report.counted_shares(rows["window"])
    assert window[0] > window[2] > window[3]


@pytest.mark.parametrize("name", ["heterogeneous_matched", "heterogeneous_swarmclock"])
def test_matched_speed_runs_regenerate_and_ran_the_speeds_they_claim(name, tmp_path):
    """Rows whose quotas were matched to the speeds: the md is their JSON's, and a row said to be
    matched had a calibration attempt within the tolerance, whose quotas the swarm got."""
    source = ROOT / f"benchmarks/{name}.json"
    if not source.exists():
        pytest.skip(f"{source.name} not recorded")
    assert_md_regenerates(bench_heterogeneous.main, ["--report-only", "--json", str(source)], f"{name}.md", tmp_path)
    for row_name, row in json.loads(source.read_text())["rows"].items():
        assert heterogeneous_report.in_sync(row), row_name
        calibration = row.get("calibration")
        if not calibration:
            continue
        best = min(calibration["attempts"], key=lambda a: a["worst_off"])
        assert row["cores"] == best["cores"] == calibration["cores"], row_name
        ratios = best["speed_ratios"]
        assert calibration["matched"] == all(abs(x / s - 1) <= bench_heterogeneous.SPEED_TOLERANCE
                                             for x, s in zip(ratios, row["speeds"])), row_name


def test_byzantine_mixed_md_is_generated_from_its_json(tmp_path):
    import byzantine_mixed

    source = ROOT / "benchmarks/byzantine_mixed.json"
    assert_md_regenerates(byzantine_mixed.main, ["--report-only", "--json", str(source)], "byzantine_mixed.md", tmp_path)
    runs = json.loads(source.read_text())["runs"]
    attacked = [r for r in runs if r["attack"] not in ("none", "honest-only")]
    assert attacked and all(r["claim_work"] == 4.0 and r["peer_speeds"] == list(byzantine_mixed.SPEEDS) for r in attacked)
    alone = [r for r in runs if r["attack"] == "honest-only"]  # the attackers' peers gone, nobody claiming more
    assert alone and all(r["claim_work"] == 1.0 and r["peer_speeds"] == list(byzantine_mixed.SPEEDS[2:]) for r in alone)
    # the window gave each speed its steps; the attackers' 4x claims were capped: the two of them
    # never count more than the minority cap (a third) however much they claim
    assert all(r["steps_per_round"] == [8, 8, 4, 2, 8, 8, 4, 2] for r in runs if r["status"] == "ok" and r not in alone)
    assert all(sum(r["counted_share"][:2]) <= 1 / 3 + 1e-6 for r in attacked if r["status"] == "ok" and r["aggregator"] != "mean")
