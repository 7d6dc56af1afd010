"""benchmarks/heterogeneous.md is a pure function of benchmarks/heterogeneous.json
(scripts/bench_heterogeneous.py --report-only), its rows ran the issue's speeds, and every peer of
every row ended on its coordinator's hash."""

from __future__ import annotations

import json
import sys

from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "scripts"))

import bench_heterogeneous  # noqa: E402
import heterogeneous_report  # noqa: E402


def test_heterogeneous_md_is_generated_from_its_json(tmp_path):
    source = ROOT / "benchmarks/heterogeneous.json"
    out = tmp_path / "heterogeneous.md"
    assert bench_heterogeneous.main(["--report-only", "--json", str(source), "--md", str(out)]) == 0
    committed = (ROOT / "benchmarks/heterogeneous.md").read_text().split("<!-- notes -->")[0]
    assert out.read_text().split("<!-- notes -->")[0] == committed
    rows = json.loads(source.read_text())["rows"]
    assert set(rows) == {"fixed-h", "window", "homogeneous"}
    assert rows["fixed-h"]["speeds"] == rows["window"]["speeds"] == [1.0, 1.0, 0.5, 0.25]
    assert rows["fixed-h"]["window_s"] == 0 < rows["window"]["window_s"]
    assert all(heterogeneous_report.in_sync(row) for row in rows.values())
    # a fixed H counts every update the same; the window counts each peer's work
    assert heterogeneous_report.counted_shares(rows["fixed-h"]) == [0.25] * 4
    window = heterogeneous_report.counted_shares(rows["window"])
    assert window[0] > window[2] > window[3]
