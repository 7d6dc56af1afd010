"""The scale lab (scripts/scale_lab.py): several real peer nodes per process, each with its own
identity, gRPC server and ledger, dialling the coordinator directly; the swarm ends in sync, the
coordinator's CPU is read per round, and nothing it started is left running.

Also the lab's report: its table, the targets and what grows with n, from a stored JSON."""

from __future__ import annotations

import json
import math
import sys

from tests.helpers import ROOT, process_tree, still_running, tiny_run_config

sys.path.insert(0, str(ROOT / "scripts"))


def test_two_lab_processes_of_two_nodes_end_in_sync_and_leave_nothing_running(tmp_path, monkeypatch):
    import measure_scale
    import scale_lab

    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the lab processes run `python -m scripts.scale_lab`
    cfg = tiny_run_config(run_id="lab", inner={"steps": 2},
                          rounds={"rounds": 2, "expected_peers": 4, "min_peers": 4, "start_timeout_s": 120.0})
    started, trees = [], {}

    def start(swarm, coordinator, peers):
        trees.update(process_tree(coordinator.process.pid))  # with its DHT process and p2pd
        children = scale_lab.lab_peers(2)(swarm, coordinator, peers)
        started.extend(children)
        return children

    run = measure_scale.run_swarm(cfg, peers=4, workdir=tmp_path / "lab", memory_floor_gib=0.5, start_peers=start)

    assert run["problems"] == [] and run["peers_joined"] == 4 and run["rounds_done"] == 2
    assert [c.name for c in started] == ["lab0", "lab1"]  # 4 nodes, 2 per process
    rows = run["rows"]
    assert len(rows) == 8 and all(r["in_sync"] and r["updates"] == 4 for r in rows)
    assert len({r["peer"] for r in rows}) == 4  # four identities
    for name in ("peer0", "peer1", "peer2", "peer3"):  # each node's own ledger: what it served, what it fetched
        by_method = json.loads((tmp_path / "lab" / f"{name}.json").read_text())["traffic_by_method"]["1"]
        # the reduce-scatter's trades go both ways in one stream (opened or served); a gather asks as few owners as it must
        data = [by_method.get(m, {}) for m in ("FetchPayload", "SwapSlices", "served:FetchPayload", "served:SwapSlices")]
        assert sum(t.get("bytes_sent", 0) for t in data) > 0 and sum(t.get("bytes_received", 0) for t in data) > 0
    cpu = run["coordinator_cpu"]
    assert [c["round"] for c in cpu] == [0, 1]
    # Round 0's close is read while the coordinator and its DHT process still run (round 1 needs the
    # peers); the last close may be read after it exited (NaN) or after its DHT process and p2pd did
    # (their CPU leaves the tree's total), so only its own CPU is checked there.
    assert cpu[0]["cpu_s"] > 0 and cpu[0]["tree_cpu_s"] >= cpu[0]["cpu_s"]
    assert all(math.isnan(c["cpu_s"]) or c["cpu_s"] >= 0 for c in cpu)
    assert all(not c.alive() for c in started)
    assert still_running(trees, within_s=10.0) == {}


def test_lab_process_refuses_arguments_without_the_launchers_peer_line(capsys):
    import pytest
    import scale_lab

    with pytest.raises(SystemExit):
        scale_lab.lab_process(["peer", "--coordinator", "127.0.0.1:1", "--node", "peer0", "0/1"])
    assert "--identity-path" in capsys.readouterr().err


def test_groups_spread_the_nodes_evenly():
    import scale_lab

    assert scale_lab.groups(4, 8) == [[0, 1, 2, 3]]
    assert [len(g) for g in scale_lab.groups(48, 8)] == [8] * 6
    assert [len(g) for g in scale_lab.groups(50, 8)] == [8, 7, 7, 7, 7, 7, 7]
    assert sorted(i for g in scale_lab.groups(50, 8) for i in g) == list(range(50))


def _lab_run(n: int, received: float, control: float, cpu_s: float) -> dict:
    """A lab row as measure_scale.summarize stores it, with two counted peer-rounds."""
    row = {"round": 1, "owned": 2, "recomputed": 1, "control_sent": 0, "control_received": control, "to_coordinator_sent": 500_000,
           "to_coordinator_received": 0, "by_method": {"FetchPayload": [1_000, received - control],
                                                                   "GetManifest": [10, control], "served:FetchPayload": [9, 9]}}
    return {"codec": "fp16", "mode": "sliced", "peers": n, "slices": 32, "replicas": 2, "spot_checks": 1, "inner_steps": 2,
            "rounds": 3, "skip_rounds": 1, "numel": 1_000_000, "payload_bytes": 2_000_000, "result_bytes": 2_000_000,
            "received_mean": received, "received_median": received, "sent_mean": received, "control_received_mean": control,
            "control_sent_mean": 0.0, "coordinator_bytes_per_round": 3_000_000.0 * n / 4, "coordinator_cpu_s_per_round": cpu_s,
            "coordinator_tree_cpu_s_per_round": cpu_s, "round_wall_s": 2.0, "peers_joined": n, "rounds_done": 3,
            "memory_taken_gib": 1.0, "load_before": "1 / 1 / 1", "load_after": "2 / 2 / 2", "ok": True, "problems": [],
            "nodes_per_process": 8, "rows": [{**row, "round": 0}, row, row]}


def test_lab_report_states_every_target_with_its_figure(tmp_path):
    import scale_lab_report
    import scale_report

    runs = [_lab_run(4, 4e6, 20e3, 0.5), _lab_run(48, 8e6, 100e3, 3.0)]
    data = {"runs": [], "lab_runs": runs,
            "lab_invocations": [{"command": "scale_lab.py --peers 4 48", "load_before": "1 / 1 / 1", "load_after": "2 / 2 / 2"}]}
    assert scale_lab_report.received_by_rpc(runs[1]) == {"FetchPayload": 8e6 - 100e3, "GetManifest": 100e3}
    # 2 owned slices' 47 inputs of P/32 each; 1 recomputed; the other 29 slices' results A/32
    assert scale_lab_report.fetched_by_purpose(runs[1]) == {"owned inputs": 2 * 47 * 2e6 / 32, "recomputed inputs": 47 * 2e6 / 32,
                                                            "gathered results": 29 * 2e6 / 32}
    assert scale_lab_report.cpu_exponent([(4, 0.5), (48, 3.0)]) < 1
    out = tmp_path / "scale.md"
    scale_report.write_markdown(out, data)
    text = out.read_text()
    assert "received per peer at 48 / at 4 peers ≤ 1.8x: **NOT reached**, 2.00x" in text
    assert "control ≤ 5% of a peer's bytes at every n: **reached** (largest 0.6% at n = 48)" in text
    assert "coordinator's bytes per round ≤ 2 fp32 models: **NOT reached** (largest 9.00 at n = 48)" in text
    assert "CPU per round grows at most linearly in n: **reached** (0.50 s at n = 4, 3.00 s at n = 48" in text
    # round 1's two peer-rounds at n = 48: 2 x (100 KB control + 500 KB served to it) = 1.2 MB = 0.30 fp32 models of 1M params
    assert "spot-check rounds included): **reached** (largest 0.30 at n = 48; within 2 at n = 4, 48)" in text
    assert "| fp16 | 48 | 7,900 | 100 | 5,875 | 2,938 | 1,812 | 1.00 |" in text
    assert "nan" not in text.lower()
