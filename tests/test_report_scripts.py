"""The benchmark reports, written from their JSON by the scripts: a report is a pure function of
its JSON (regenerated, it is the committed md; rewritten, the same bytes), names the JSON and the
config behind each row, and judges its goals from the stored runs.

- bench_compression's --resume re-runs a stored run whose config differs from the row's, and its
  table names the aggregator each run really used;
- wan_emulation's report names the JSON behind each row; vs_hivemind's and measure_scale's md
  are their committed JSON's; bench_fidelity's md is rewritten from its JSON alone, and its
  goals are judged on 3 paired seeds against each row's twin.
Smoke tests of the measuring modes: tests/test_scripts_smoke.py.
"""

from __future__ import annotations

import json
import sys

import pytest

from tests.helpers import ROOT, assert_md_regenerates

sys.path.insert(0, str(ROOT / "scripts"))

import bench_compression  # noqa: E402
import bench_vs_hivemind  # noqa: E402
import compression_report  # noqa: E402
import vs_hivemind_report  # noqa: E402
import wan_emulation  # noqa: E402


def _stored_run(label: str, seed: int, aggregator: str, final: float) -> dict:
    """A compression.json run as the bench stores it, with the config the row runs today."""
    row = next(r for r in bench_compression.ROWS if r.label == label)
    config = bench_compression.row_options(row, seed, 4, 24, 25).run_config().to_dict()
    config["aggregation"]["name"] = aggregator
    return {"label": label, "seed": seed, "baseline": row.baseline, "peers": 4, "rounds": 24, "inner_steps": 25,
            "config": config, "final_val_loss": final}


def test_compression_resume_reruns_a_run_whose_config_changed():
    runs = [_stored_run("DiLoCo fp32", 0, "mean", 1.85), _stored_run("DiLoCo fp32", 1, "median", 1.88),
            _stored_run("int8", 0, "mean", 1.86), _stored_run("DDP", 0, "mean", 1.75)]
    del runs[2]["config"]["exchange"]  # a table added to RunConfig after the run: not a reason to re-run
    stale = bench_compression.stale_runs(runs, bench_compression.ROWS, peers=4, default_h=25, steps=600)
    assert stale == {1: ["aggregation.name: 'median' -> 'mean'"]}
    # a row that is not being run now, or another length, is left alone
    assert bench_compression.stale_runs(runs, bench_compression.ROWS[2:3], peers=4, default_h=25, steps=600) == {}
    assert bench_compression.stale_runs(runs, bench_compression.ROWS, peers=4, default_h=25, steps=300) == {}
    # DeMo steps by demo_lr: a run stored when outer.lr still held Nesterov's 0.7 is the same run,
    # but a different demo_lr is not
    demo = _stored_run("DeMo lr 5e-3 + int8", 0, "mean", 2.03)
    demo["config"]["outer"]["lr"] = 0.7
    assert bench_compression.stale_runs([demo], bench_compression.ROWS, peers=4, default_h=25, steps=600) == {}
    demo["config"]["outer"]["demo_lr"] = 1e-3
    assert bench_compression.stale_runs([demo], bench_compression.ROWS, peers=4, default_h=25, steps=600) == {
        0: ["outer.demo_lr: 0.001 -> 0.005"]}
    # the table says which run used another aggregator than its row states
    summary = compression_report.summarize(bench_compression.ROWS, [dict(r, **_curves()) for r in runs], 600)
    fp32 = next(s for s in summary if s["row"].label == "DiLoCo fp32")
    assert compression_report._aggregator_cell(fp32) == "mean **but seed 1: median**"
    assert compression_report.off_aggregator_runs(summary) == ["DiLoCo fp32 seed 1: median"]


def _curves() -> dict:
    return {"val_loss_per_round": [2.0] * 24, "initial_val_loss": 5.5, "bytes_per_peer_per_round": 1.0,
            "upload_bytes_per_peer_per_round": 1.0, "total_bytes": 96.0, "ddp_equivalent_bytes": 960.0,
            "cumulative_bytes_per_round": list(range(24)), "wall_s": 1.0}


def test_wan_report_names_the_json_behind_each_row(tmp_path):
    source = ROOT / "benchmarks/wan_sync_h25_r6.json"
    saved = json.loads(source.read_text())
    wan_emulation.write_markdown(tmp_path / "wan.md", [{"json": "benchmarks/wan_sync_h25_r6.json", **saved}])
    text = (tmp_path / "wan.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| wan_sync_h25_r6.json | fp16 |"))
    # 6 rounds x 4 peers: rounds 1-5 ranged 59-79% per peer, the last round 67-72%
    # synchronous: no landing; written before JSONs named the documented round trips: no bound
    assert row.endswith("| **68.2%** | 59–79% (last: 67–72%) | - | - | - | - | - |")
    assert f"`benchmarks/wan_sync_h25_r6.json`: `{saved['command']}`" in text
    assert "not recorded in these JSONs" in text  # not this machine's versions passed off as the run's


def test_wan_bound_is_bytes_at_the_link_rate_plus_the_documented_round_trips():
    # 2 peers x 2 rounds; medians: sent 1.25 MB, received 1.5 MB -> 1.5 MB at 100 Mbit/s = 0.12 s, + 8 x 50 ms
    rows = [{"round": r, "timeline": {"committed": 100.0 * r + c, "applied": 100.0 * r + a}}
            for r, marks in ((0, ((0.0, 1.0), (0.5, 1.1))), (1, ((0.2, 0.9), (0.0, 0.8)))) for c, a in marks]
    result = {"round_trips": 8, "rate_mbit": 100.0, "rtt_ms": 50.0, "rows": rows,
              "median": {"bytes_sent": 1_250_000, "bytes_received": 1_500_000, "fetch_s": 0.78}}
    assert wan_emulation.link_bound_s(result) == pytest.approx(0.52)
    # from each round's last commit (0.5, 0.2) to each peer's applied: 0.5, 0.6, 0.7, 0.6
    assert wan_emulation.exchange_span_s(result) == pytest.approx(0.6)
    assert wan_emulation.bound_cells(result) == ["0.52 (8 RT)", "1.50x: reached", "0.60", "1.15x"]
    result["median"]["fetch_s"] = 0.79
    assert wan_emulation.bound_cells(result)[1] == "1.52x: **NOT reached**"
    assert wan_emulation.bound_cells({**result, "round_trips": None}) == ["-", "-", "0.60", "-"]  # all-to-all: no documented count


def test_wan_reduce_times_are_medians_per_slice_over_the_peer_rounds_that_reduced():
    rows = [{"reduce_times": {"calls": 4, "wall_s": 0.04, "cpu_s": 0.008, "core_wait_s": 0.03}},   # 10 / 2 / 7.5 ms a slice
            {"reduce_times": {"calls": 2, "wall_s": 0.06, "cpu_s": 0.006, "core_wait_s": 0.05}},   # 30 / 3 / 25
            {"reduce_times": {"calls": 1, "wall_s": 0.02, "cpu_s": 0.004, "core_wait_s": 0.01}},   # 20 / 4 / 10
            {"reduce_times": {"calls": 0, "wall_s": 0.0, "cpu_s": 0.0, "core_wait_s": 0.0}},       # owned nothing: left out
            {"reduce_times": None}, {}]                                                             # older JSONs
    assert wan_emulation.reduce_times_text({"rows": rows}) == (
        "wall 20.0 ms, CPU 3.0 ms, waiting for a core 10.0 ms (median per slice over 3 peer-rounds)")
    unknown = [{"reduce_times": {**row["reduce_times"], "core_wait_s": None}} for row in rows[:3]]
    assert "waiting for a core not recorded (no per-thread schedstat)" in wan_emulation.reduce_times_text({"rows": unknown})
    assert wan_emulation.reduce_times_text({"rows": rows[4:]}) == ""


def test_vs_hivemind_report_from_a_run_that_stopped_early_has_no_nan(tmp_path):
    # the JSON kept from the re-implemented harness's run, stopped at 8 x 10M: no wall_s, no load_after
    out = tmp_path / "vs.md"
    assert bench_vs_hivemind.main(["--report-only", str(ROOT / "benchmarks/vs_hivemind_before_sliced.json"), "--write-md", str(out)]) == 0
    text = out.read_text()
    wall = next(line for line in text.splitlines() if line.startswith("- total wall time:"))
    assert wall == "- total wall time: not recorded (this JSON was written before its run finished; the run did not reach its end)"
    assert "nan" not in text.lower() and vs_hivemind_report.OLD_HARNESS in text
    assert vs_hivemind_report.wall_time_text(812.4, True) == "812 s"
    assert vs_hivemind_report.wall_time_text(300.0, False).startswith("300 s until the last configuration")


def test_vs_hivemind_md_is_generated_from_its_json(tmp_path):
    """Every figure of benchmarks/vs_hivemind.md's tables comes from the JSONs its header names."""
    committed = (ROOT / "benchmarks/vs_hivemind.md").read_text().split("<!-- notes -->")[0]
    sources = committed.split(" from ", 1)[1].split(". One row")[0]
    json_paths = [name.strip(" `") for name in sources.split(",")]
    assert "benchmarks/vs_hivemind.json" in json_paths and len(json_paths) >= 2  # the newest run first
    assert_md_regenerates(bench_vs_hivemind.main, ["--report-only", *(str(ROOT / p) for p in json_paths)], "vs_hivemind.md",
                          tmp_path, out_flag="--write-md")
    rows = [row for p in json_paths for row in json.loads((ROOT / p).read_text())["rows"]]
    assert {(r["peers"], r["numel"], r["mode"]) for r in rows} >= {(8, 1_000_000, "sliced"), (8, 10_000_000, "sliced")}
    assert all(r["swarmloco_identical_on_every_peer"] for r in rows)


def test_scale_md_is_generated_from_its_json(tmp_path):
    """benchmarks/scale.md's tables and verdicts come from benchmarks/scale.json, and every run in it finished in sync."""
    import measure_scale

    assert_md_regenerates(measure_scale.main, ["--report-only", "--json", str(ROOT / "benchmarks/scale.json")], "scale.md",
                          tmp_path, out_flag="--write-md")
    runs = json.loads((ROOT / "benchmarks/scale.json").read_text())["runs"]
    assert {(r["mode"], r["peers"]) for r in runs} >= {("sliced", n) for n in (3, 6, 9, 12)} | {("all-to-all", 3), ("all-to-all", 12)}
    assert all(r["ok"] for r in runs)


def test_bench_fidelity_smoke_resumes_and_rewrites_its_md_from_the_json(tmp_path):
    import bench_fidelity

    argv = ["--rounds", "1", "--inner-steps", "1", "--rows", "DiLoCo fp32", "--out", str(tmp_path)]
    assert bench_fidelity.main(argv) == 0
    runs = json.loads((tmp_path / "fidelity.json").read_text())["runs"]
    assert [(r["label"], r["seed"], r["rounds"], r["inner_steps"]) for r in runs] == [("DiLoCo fp32", s, 1, 1) for s in (0, 1, 2)]
    md = (tmp_path / "fidelity.md").read_text()
    assert "| DiLoCo fp32 ★ | `fp32` | nesterov 0.7/0.9 | mean |" in md and "**NOT measured on 3 seeds**" in md
    stamps = [r["wall_s"] for r in runs]
    assert bench_fidelity.main(argv) == 0  # same configs: nothing runs again
    assert [r["wall_s"] for r in json.loads((tmp_path / "fidelity.json").read_text())["runs"]] == stamps
    (tmp_path / "fidelity.md").unlink()
    assert bench_fidelity.main(["--report-only", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "fidelity.md").read_text() == md  # the md is a pure function of the JSON


def _fidelity_run(label: str, seed: int, loss: float, *, baseline: str = "diloco", rounds: int = 8, batch: int = 8,
                  upload: int = 1000, overlap: bool = False) -> dict:
    config = {"outer": {"name": "nesterov", "lr": 0.7, "momentum": 0.9}, "compression": {"codec": "fp32", "error_feedback": False},
              "rounds": {"overlap_communication": overlap, "eager_updates": True, "eager_estimate": "own"},
              "data": {"batch_size": batch}}
    return {"label": label, "seed": seed, "final_val_loss": loss, "baseline": baseline, "rounds": rounds, "inner_steps": 25,
            "config": config, "codec": "fp32", "aggregator": "mean", "bytes_per_peer_per_round": 4 * upload,
            "upload_bytes_per_peer_per_round": upload, "ratio_vs_ddp": 20.0, "val_loss_per_round": [loss] * rounds}


def test_fidelity_goals_weigh_three_seeds_and_judge_a_row_against_its_twin():
    from types import SimpleNamespace

    import fidelity_report

    runs = [_fidelity_run("DiLoCo fp32", s, 2.0) for s in range(3)]
    runs += [_fidelity_run("DDP", s, 1.9, baseline="ddp") for s in range(3)]
    runs += [_fidelity_run("DDP batch 16", s, 1.8, baseline="ddp", batch=16) for s in range(3)]
    runs += [_fidelity_run("overlap", s, 2.02 + 0.01 * s, overlap=True) for s in range(3)]  # +1.5% vs DiLoCo fp32
    runs += [_fidelity_run("overlap lucky", 0, 2.0, overlap=True)]  # one seed only: a screen, never the verdict
    runs += [_fidelity_run("long", s, 1.95, rounds=48) for s in range(3)]  # not paired with 8-round references
    runs += [_fidelity_run("big batch", s, 1.85, batch=16) for s in range(3)]  # its twin: DDP at batch 16
    row = lambda label, group, twin=None: SimpleNamespace(label=label, group=group, note="", twin=twin)
    rows = [row("DiLoCo fp32", "ref"), row("DDP", "ref"), row("overlap", "overlap", "DiLoCo fp32"),
            row("overlap lucky", "overlap", "DiLoCo fp32"), row("long", "ddp"), row("big batch", "ddp", "DDP batch 16")]
    summary = {s["label"]: s for s in fidelity_report.summarize(runs, rows)}
    assert summary["long"]["gap_ddp"] == (None, [])  # 48 x 25 steps against 8 x 25: no pair
    assert summary["big batch"]["gap_ddp"] == (None, [])  # batch 16 against batch 8: no pair either
    assert summary["big batch"]["gap_twin"][0] == pytest.approx(1.85 / 1.8 - 1)
    lines = "\n".join(fidelity_report.goal_lines(list(summary.values())))
    assert "within 1% of synchronous" in lines and "**NOT reached** — best row with 3 seeds `overlap`: +1.50%" in lines
    assert "best single-seed screen (not settled) `overlap lucky`: +0.00%" in lines
    assert "**reached** — best row with 3 seeds `big batch`: +2.78% vs DDP batch 16" in lines


def test_compressed_exchange_md_is_built_from_its_json_and_judges_the_targets(tmp_path):
    """bench_compressed's report from a synthetic JSON (no swarm): the rows say how they ran, the
    ratio is fp32's total over the row's at the same n, control and data are split, and each
    target is judged on the stored figures."""
    import bench_compressed as bc

    def row(label: str, n: int, codec: str, aggregator: str, f: int, result: str, outer: str, sent: int, received: int,
            control: int) -> dict:
        config = {"exchange": {"mode": "sliced", "replicas": 2, "spot_checks": 1, "result_codec": result},
                  "rounds": {"expected_peers": n, "rounds": 3}, "compression": {"codec": codec, "error_feedback": True},
                  "aggregation": {"name": aggregator, "num_byzantine": f}, "outer": {"name": outer, "lr": 0.7},
                  "inner": {"steps": 2}}
        ledger = [{"peer": f"p{i}", "round": k, "sent": sent, "received": received + 10 * i, "control_sent": control // 4,
                   "control_received": control, "in_sync": True, "updates": n, "payload": 90 + k, "result_bytes": 180 + k}
                  for i in range(n) for k in range(3)]
        sizes = {"numel": 1000, "payload": 100, "result": 200, "result_format": result or "fp32", "slices": 32}
        run = {"rows": ledger, "wall_s": 1.0, "problems": [], "rounds_done": 3}
        return bc.summarize_setup(label, config, sizes, run, skip_rounds=1)

    runs = [row(bc.REFERENCE, 4, "fp32", "median", 0, "", "nesterov", 4_000_000, 4_000_000, 40_000),
            row(bc.REFERENCE, 12, "fp32", "median", 0, "", "nesterov", 5_000_000, 5_000_000, 100_000),
            row(bc.RECIPE, 4, "chunk-topk:4096:64+stat2", "sparse-trimmed-mean", 1, "chunk-topk:4096:64+int8", "fedavg",
                30_000, 40_000, 8_000),
            row(bc.RECIPE, 12, "chunk-topk:4096:64+stat2", "sparse-trimmed-mean", 1, "chunk-topk:4096:64+int8", "fedavg",
                50_000, 70_000, 20_000)]
    recipe = runs[2]
    # P and A are what the kept rounds (1 and 2) measured, not the codec's bounds (100, 200)
    assert (recipe["payload_bytes"], recipe["result_bytes"], recipe["payload_bound"]) == (91.5, 181.5, 100)
    assert recipe["samples"] == 8 and recipe["figures"]["control_total"]["mean"] == 10_000  # 8_000 + 8_000 // 4
    assert recipe["figures"]["data_total"]["mean"] == recipe["figures"]["total"]["mean"] - 10_000
    assert bc.ratios(runs)[(bc.RECIPE, 4)] == pytest.approx(8_000_015 / 70_015)
    data = {"runs": runs, "skipped": [f"{bc.DENSE} at n = 4: the same run config"],
            "recipe": {"name": "sparseloco", "overrides": {"aggregation.name": "sparse-trimmed-mean"}},
            "invocation": {"command": "bench_compressed.py --peers 4 12", "load_before": "1 / 1 / 1", "load_after": "2 / 2 / 2",
                           "machine": {"cpu": "synthetic", "cores": 2}, "wall_s": 60.0}}
    out = tmp_path / "compressed_exchange.md"
    bc.write_markdown(out, data)
    text = out.read_text()
    assert ("| public-swarm recipe | 4 | chunk-topk:4096:64+stat2 | sparse-trimmed-mean (f = 1) | chunk-topk:4096:64+int8 | "
            "fedavg lr 0.7 | sliced (S 32, r 2, k 1) | 2 |") in text
    assert "| fp32 DiLoCo | 12 | fp32 | median | fp32 | nesterov lr 0.7 |" in text
    # 8.0 MB / 70.0 KB at 4 peers = 114x; 10.0 MB / 120.1 KB at 12 = 83x: the worst n decides
    assert ("**public-swarm recipe ≥ 100x fewer bytes per peer per round than fp32 DiLoCo in the same exchange: NOT reached**, "
            "at worst 83.3x — 4 peers: 114.3x (data only 132.5x); 12 peers: 83.3x") in text
    # 120,055 / 70,015 = 1.71x
    assert "**public-swarm recipe at 12 peers ≤ 1.6x what it moves at 4: NOT reached**, 1.71x (70.0 -> 120.1 KB" in text
    assert "`aggregation.name` = `'sparse-trimmed-mean'`" in text and "- skipped: sparseloco, dense aggregate" in text
    assert "nan" not in text.lower() and "<!-- notes -->" in text
    bc.write_markdown(out, json.loads(json.dumps(data)))  # through JSON: the same bytes
    assert out.read_text() == text


def test_storm_rows_started_two_ways_stand_side_by_side_with_the_invocations_behind_them():
    """A storm row forked and one exec'd of the same swarm are two rows (a run replaces only the
    row started its own way); the md lists the invocations that measured a row still in it."""
    import measure_scale
    import scale_report

    old = {"codec": "fp16", "mode": "sliced", "peers": 4}  # before session 28: no "start", exec'd
    forked = dict(old, start="forked")
    assert measure_scale.row_key(old) != measure_scale.row_key(forked)
    assert measure_scale.row_key(dict(old, start="exec")) != measure_scale.row_key(forked)
    a = {"command": "a", "runs": [["fp16", "sliced", 4], ["fp16", "sliced", 16]]}
    b = {"command": "b", "runs": [["fp16", "sliced", 16]]}
    c = {"command": "c", "runs": [["fp16", "sliced", 4, "forked"]]}
    rows = [old, dict(old, peers=16), forked]
    assert [i["command"] for i in scale_report.sources([a, b, c], rows)] == ["a", "b", "c"]
    assert [i["command"] for i in scale_report.sources([a, b, c], rows[1:])] == ["b", "c"]  # a's rows all re-measured
