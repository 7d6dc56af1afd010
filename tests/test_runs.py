"""`swarmloco runs` lists what the DHT announces, as the coordinator itself reports it, and
`swarmloco peer --run RUN_ID` joins the run picked from that list."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.helpers import ROOT, read_summary, write_run_config
from peer.cli.runs import table

pytestmark = pytest.mark.integration


def swarmloco(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "peer.cli.main", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_runs_lists_the_announced_run_and_peer_joins_it_by_id(swarm, tmp_path):
    config = write_run_config(tmp_path / "run.json", run_id="runs-test", rounds={"rounds": 2, "expected_peers": 1})
    coordinator = swarm.start_coordinator(["--config", str(config)])
    params = int(re.search(r"\| ([\d,]+) params \|", "".join(coordinator.lines)).group(1).replace(",", ""))

    listed = swarmloco("runs", "--initial-peers", *swarm.initial_peers, "--json")
    assert listed.returncode == 0, listed.stderr[-3000:]
    (run,) = json.loads(listed.stdout)
    status = json.loads(swarmloco("status", "--coordinator", swarm.coordinator_endpoint, "--json").stdout)
    assert run["run_id"] == "runs-test" and run["endpoint"] == swarm.coordinator_endpoint
    assert run["coordinator_fingerprint"] == status["coordinator_id"]
    assert run["params"] == params and run["codec"] == status["codec"] == "fp16"
    assert run["round"] == status["round"] and run["rounds"] == 2 and run["peers"] == 0 and not run["finished"]
    text = table([run])
    assert "runs-test" in text and f"{params:,}" in text and run["coordinator_fingerprint"] in text and "--run RUN_ID" in text

    wrong = swarmloco("peer", "--initial-peers", *swarm.initial_peers, "--run", "no-such-run", "--connect-timeout", "3")
    assert wrong.returncode == 1 and "no-such-run" in wrong.stderr and "Traceback" not in wrong.stderr
    joined = swarm.start_peer("volunteer", ["--run", "runs-test", "--shard", "0/1"])
    assert swarm.wait(coordinator, 180) == 0 and swarm.wait(joined, 60) == 0, "".join(joined.lines)[-2000:]
    summary = read_summary(swarm, "coordinator")
    assert [h["updates"] for h in summary["history"]] == [1, 1]
