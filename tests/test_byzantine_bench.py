"""scripts/byzantine_bench.py: the gap arithmetic, the refusals, and a tiny end-to-end run;
scripts/byzantine_report.py: the default pick."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from scripts import byzantine_bench as bench
from scripts import byzantine_cases as cases
from scripts import byzantine_report as report


def _record(agg: str, f: int, attack: str, seed: int, loss: float | None, status: str = "ok", codec: str = "fp16") -> dict:
    options = tuple(sorted(bench.ATTACK_OPTIONS.get(attack, {}).items())) if attack != bench.CLEAN else ()
    case = bench.Case("main", agg, f, attack, seed, codec, options)
    return {"key": case.key, "phase": "main", "aggregator": agg, "f": f, "attack": attack, "seed": seed,
            "codec": codec, "attack_options": dict(options), "status": status, "final_val_loss": loss}


def _results(*records: dict) -> dict[str, dict]:
    clean = [_record("mean", 0, bench.CLEAN, 0, 4.0), _record("mean", 0, bench.CLEAN, 1, 2.0)]
    clean[0]["phase"] = clean[1]["phase"] = "clean"
    return {r["key"]: r for r in [*clean, *records]}


def test_gap_is_relative_to_the_clean_mean_run_of_the_same_seed_then_averaged():
    # seed 0: (4.2 - 4.0) / 4.0 = +5%; seed 1: (2.0 - 2.0) / 2.0 = 0% -> mean +2.5%
    results = _results(_record("median", 2, "alie", 0, 4.2), _record("median", 2, "alie", 1, 2.0))
    g, status = bench.gap(results, "median", 2, "alie")
    assert status == "ok" and g == pytest.approx(0.025)
    assert cases.loss_of(results, "median", 2, "alie") == pytest.approx(3.1)
    assert bench.gap(results, "krum", 2, "alie") == (None, "missing")


def test_a_diverged_run_is_an_infinite_gap_and_a_stopped_one_is_reported_not_averaged():
    results = _results(_record("mean", 2, "huge-norm", 0, math.nan), _record("krum", 2, "nan", 0, None, "error"))
    assert bench.gap(results, "mean", 2, "huge-norm") == (math.inf, "ok")
    assert bench.gap(results, "krum", 2, "nan") == (None, "error")


def test_refusal_follows_the_rules_minimum_rows_including_bucketing():
    assert bench.refusal("krum", 2) is None  # 2f+3 = 7 <= 8
    assert bench.refusal("krum", 3) == "needs 9 rows, has 8"
    assert bench.refusal("median", 3) is None  # 2f+1 = 7 <= 8
    # 8 rows in buckets of 2 -> 4 rows; each attacker spoils one bucket, so f=2 needs 2f+1 = 5 rows.
    assert bench.refusal("centered-clip+bucket2", 1) is None
    assert bench.refusal("centered-clip+bucket2", 2) == "needs 5 rows, has 4"


def test_pick_default_takes_the_best_worst_case_among_rules_quiet_without_attackers():
    records = []
    for agg, fp, worst in (("median", 4.2, 4.1), ("centered-clip", 4.02, 4.1), ("geometric-median", 4.0, 4.3)):
        records.append(_record(agg, 2, bench.CLEAN, 0, fp))  # median: +5% with no attacker -> not eligible
        records += [_record(agg, 2, a, 0, worst if a == "alie" else 4.0) for a in bench.CLASSIC_ATTACKS]
    default, lines = report.pick_default(_results(*records))
    assert default == "centered-clip"  # worst +2.5% beats geometric-median's +7.5%
    assert any(line.startswith("median:") and "not eligible" in line for line in lines)


def test_tiny_end_to_end_run_writes_json_markdown_and_heatmap(tmp_path):
    code = bench.main(["--profile", "tiny", "--workers", "0", "--phases", "main", "--seeds", "0",
                       "--limit", "3", "--out", str(tmp_path)])
    assert code == 0
    runs = json.loads((tmp_path / "byzantine.json").read_text())["runs"]
    assert [r["key"] for r in runs] == [
        "fp16|mean|f0|none|s0", "fp16|mean|f2|gaussian|s0", "fp16|mean|f2|sign-flip(scale=4.0)|s0"
    ]
    assert all(r["status"] == "ok" for r in runs)
    clean, noise = runs[0]["final_val_loss"], runs[1]["final_val_loss"]
    # Two attackers sending N(0, 1) noise (norm ~ sqrt(d)) swamp a plain mean of ~1e-3-sized updates.
    assert noise > clean + 0.5
    assert bench.gap({r["key"]: r for r in runs}, "mean", 2, bench.CLEAN) == (0.0, "ok")  # mean's FP = the reference
    md = (tmp_path / "byzantine.md").read_text()
    assert "## f = 2 of 8 attackers" in md and "| mean |" in md
    assert (tmp_path / "byzantine.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sliced_cells_are_keyed_apart_and_measured_against_the_sliced_clean_run():
    assert bench.Case("main", "median", 2, "alie", 0).key == "fp16|median|f2|alie|s0"  # the first grid's keys
    assert bench.Case("main", "median", 2, "alie", 0, exchange="sliced").key == "sliced|fp16|median|f2|alie|s0"
    a2a = _results(_record("median", 2, "alie", 0, 4.2))
    sliced = {}
    for agg, f, attack, loss in (("mean", 0, bench.CLEAN, 5.0), ("median", 2, "alie", 5.5)):
        r = _record(agg, f, attack, 0, loss)
        key = bench.Case("clean" if attack == bench.CLEAN else "main", agg, f, attack, 0, exchange="sliced").key
        sliced[key] = {**r, "key": key, "exchange": "sliced"}
    both = {**a2a, **sliced}
    assert bench.gap(both, "median", 2, "alie") == (pytest.approx(0.05), "ok")  # (4.2 - 4.0) / 4.0
    assert bench.gap(both, "median", 2, "alie", exchange="sliced") == (pytest.approx(0.10), "ok")  # (5.5 - 5.0) / 5.0
    assert cases.loss_of(both, "median", 2, "alie", exchange="sliced") == 5.5


def test_the_sliced_exchange_refuses_whole_vector_rules_and_plans_the_lying_owner():
    assert "refused by the sliced exchange" in bench.refusal("krum", 2, exchange="sliced")
    assert "refused by the sliced exchange" in bench.refusal("centered-clip+nnm", 2, exchange="sliced")
    assert bench.refusal("median", 3, exchange="sliced") is None and bench.refusal("krum", 2) is None
    cases = bench.plan(["main"], [0], {}, "sliced")
    assert {c.aggregator for c in cases} == {"mean", "median", "trimmed-mean", "centered-clip"}
    assert all(c.exchange == "sliced" for c in cases)
    assert {c.aggregator for c in cases if c.attack == "lying-owner"} == {"median", "trimmed-mean", "centered-clip"}


def test_tiny_sliced_run_counts_the_lying_owners_lies_and_writes_its_own_report(tmp_path):
    code = bench.main(["--profile", "tiny", "--workers", "0", "--phases", "main", "--seeds", "0", "--exchange", "sliced",
                       "--aggregators", "median", "--limit", "2", "--out", str(tmp_path)])
    assert code == 0 and not (tmp_path / "byzantine.json").exists()
    runs = json.loads((tmp_path / "byzantine_sliced.json").read_text())["runs"]
    assert [r["key"] for r in runs] == ["sliced|fp16|mean|f0|none|s0", "sliced|fp16|median|f2|none|s0"]
    assert all(r["status"] == "ok" and r["exchange"] == "sliced" for r in runs)
    lying = bench.run_case(bench.Case("main", "median", 2, "lying-owner", 0, exchange="sliced"), bench.PROFILES["tiny"])
    lies = lying["lying_owner"]
    # 2 liars of 8 own 16 of the 32 slices a round (r = 2). Which slices they own is drawn from the committed
    # headers, so from the training data: the default corpus is this machine's standard library, and the draw
    # differs between machines. What holds on every machine: a lie beside an honest co-owner's result is always
    # caught, so a round's uncaught lies sit on slices whose both owners lie (2 lies each; only a spot check
    # reaches them); θ is the no-attacker run's, bit for bit, exactly when no lie got through.
    assert lying["status"] == "ok" and lies["told"] == 32 and len(lies["rounds"]) == 2
    for rnd in lies["rounds"]:
        assert rnd["told"] == 16 and 0 <= rnd["told"] - rnd["caught"] <= 2 * rnd["slices_with_only_liars"]
        if rnd["slices_with_only_liars"] == 0:
            assert rnd["caught"] == 16 and rnd["named"] == [0, 1]
    assert lies["uncaught"] == lies["told"] - lies["caught"]
    assert (lying["final_params_sha256"] == runs[1]["final_params_sha256"]) == (lies["uncaught"] == 0)
    md = (tmp_path / "byzantine_sliced.md").read_text()
    assert "Refused in sliced mode, not run: krum, multi-krum, geometric-median" in md
    assert "| median | " in md and "## Targets (issue 10)" in md


def test_tiny_recipe_grid_resolves_the_recipe_and_measures_every_cell_against_its_clean_run(tmp_path):
    from scripts import byzantine_recipe as recipe

    assert recipe.main(["--profile", "tiny", "--workers", "0", "--attacks", "sign-flip", "--seeds", "0",
                        "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "byzantine_recipe.json").read_text())
    s = data["meta"]["recipe"]
    assert s["exchange"] == "sliced" and s["recipe"] == "sparseloco" and s["overrides"]["aggregation.name"] == s["rule"]
    runs = data["runs"]
    # the recipe's clean run, f = 0 / 2 / 3 declared with no attacker, the n - f honest peers alone at f = 2 and 3
    # (the second reference), sign-flip at f = 2 and 3 (keys deduplicated)
    assert len(runs) == len({0, 2, 3, s["declared_f"]}) + 4 and all(r["status"] == "ok" and r["recipe"] == s for r in runs)
    assert {(r["f"], r["attack"]) for r in runs if r["attack"] != "none"} == {
        (2, "sign-flip"), (3, "sign-flip"), (2, "honest-only"), (3, "honest-only")}
    md = (tmp_path / "byzantine_recipe.md").read_text()
    assert md.count("honest peers alone (f = ") == 2  # the second reference, per f
    assert f"| {s['declared_f']} (the recipe as shipped) | {s['rule']} | +0.0% (" in md  # its own reference
    assert any(line.startswith("| sign-flip | scale=4.0 | ") and line.count("%") == 2 for line in md.splitlines())
    assert md.count("of the recipe's clean run: **") == 2 and f"result format `{s['result_format']}`" in md
    assert recipe.main(["--report-only", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "byzantine_recipe.md").read_text() == md  # the md is a function of the JSON


def test_recipe_grid_merges_only_runs_of_this_code_and_config():
    from scripts import byzantine_recipe as recipe

    profile = recipe.PROFILES["tiny"]
    settings = recipe.resolved(profile)
    case = recipe.plan(settings, [0], ["sign-flip"], (2,))[-1]
    assert case.attack == "sign-flip" and recipe.case_of({**dataclasses.asdict(case), "attack_options": dict(case.attack_options)}) == case
    current = {**dataclasses.asdict(case), "attack_options": dict(case.attack_options), "key": case.key,
               "fingerprint": recipe.fingerprint(case, profile)}
    stale = {**current, "key": case.key.replace("s0", "s9"), "seed": 9, "fingerprint": "0" * 16}
    results: dict = {}
    assert recipe.merge_runs(results, [current, stale], profile) == 1 and list(results) == [case.key]
