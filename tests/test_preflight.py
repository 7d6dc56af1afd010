"""`swarmloco preflight` against a live coordinator on loopback, its service's bounds, and the
arithmetic of its recommendation. The run through tbf-shaped network namespaces is
scripts/preflight_netns.py (benchmarks/preflight.md): too slow for the suite."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import grpc
import pytest

from peer.run.preflight_plan import TARGET, Link, Swarm, recommend
from peer.run.preflight_probe import check_dial_back
from peer.run.window_share import describe, window_share
from protocol.channels import create_channel
from protocol.wire import swarm_pb2, swarm_pb2_grpc
from tests.helpers import ROOT, free_port, write_run_config


def swarm_of(**kw) -> Swarm:
    return Swarm(codec="fp16", inner_steps=25, peers=8, payload_bytes={"fp16": 2_000_000, "fp32": 4_000_000, "int8": 1_000_000,
                                                                        "int4": 500_000}, numel=1_000_000, **kw)


def test_recommendation_follows_the_link_and_shows_its_arithmetic():
    fast = Link(rtt_s=0.02, upload_bytes_per_s=100e6 / 8, download_bytes_per_s=100e6 / 8, dial_back=True, dial_address="h:1")
    slow = Link(rtt_s=0.02, upload_bytes_per_s=10e6 / 8, download_bytes_per_s=10e6 / 8, dial_back=False, dial_address="h:1",
                dial_error="refused")
    at_fast, at_slow = recommend(fast, swarm_of(), step_s=0.1), recommend(slow, swarm_of(), step_s=0.1)
    for plan, link in ((at_fast, fast), (at_slow, slow)):
        for row in plan["rows"]:  # H >= comm / (5% x step), comm = sent/up + received/down + 6 RTT
            comm = row["sent_bytes"] / link.upload_bytes_per_s + row["received_bytes"] / link.download_bytes_per_s + 6 * link.rtt_s
            assert row["comm_s"] == pytest.approx(comm, rel=1e-3) and row["h_min"] == pytest.approx(comm / (TARGET * 0.1))
        assert plan["choice"]["inner_steps"] >= min(r["h_min"] for r in plan["rows"] if r["codec"] == plan["choice"]["codec"])
        assert any(f"/ ({TARGET:g} x 0.1 s) = " in line for line in plan["arithmetic"])
    assert at_fast["choice"] != at_slow["choice"]
    assert at_slow["choice"]["inner_steps"] > at_fast["choice"]["inner_steps"] or at_slow["choice"]["codec"] != "fp16"
    assert not at_fast["client_mode"]["recommended"] and at_slow["client_mode"]["recommended"]
    roomy = recommend(fast, swarm_of(), step_s=10.0)  # slow compute: the run's own codec and H already fit
    assert roomy["choice"]["codec"] == "fp16" and roomy["choice"]["inner_steps"] == 25


def test_the_window_hint_says_what_share_of_the_round_a_slow_machine_fills():
    # 0.4 s a step in a 10 s window: 25 steps of 512 tokens, against three peers' 100, 100, 50 steps;
    # f = 1: the heaviest row may hold 30%, so the two 51,200s are cut together to 28,800 each
    # (28,800 = 0.3 x (2 x 28,800 + 25,600 + 12,800))
    slow = window_share(window_s=10.0, step_s=0.4, min_steps=1, max_steps=1000, tokens_per_step=512,
                        others_tokens=[51_200, 51_200, 25_600], num_byzantine=1)
    assert (slow.steps, slow.tokens, slow.capped_by) == (25, 12_800, "") and slow.share == pytest.approx(12_800 / 96_000)
    # a machine 10x faster than the median is counted at 2x the median claim
    fast = window_share(window_s=10.0, step_s=0.01, min_steps=1, max_steps=1000, tokens_per_step=512,
                        others_tokens=[51_200, 51_200, 25_600], num_byzantine=0)
    assert fast.steps == 1000 and fast.capped_by == "median" and fast.share == pytest.approx(2 * 51_200 / (2 * 51_200 + 128_000))
    assert fast.uncapped_share == pytest.approx(512_000 / (512_000 + 128_000))
    # min_steps that outlast the window: the round would wait for it, and it says so
    late = window_share(window_s=2.0, step_s=1.0, min_steps=5, max_steps=1000, tokens_per_step=512, others_tokens=[],
                        num_byzantine=0)
    assert (late.steps, late.phase_s, late.share) == (5, 5.0, None)
    assert any("longer than the window" in line for line in describe(late, 2.0, 5))
    with pytest.raises(ValueError, match="must be > 0"):
        window_share(window_s=0.0, step_s=1.0, min_steps=1, max_steps=10, tokens_per_step=1, others_tokens=[], num_byzantine=0)


@pytest.mark.integration
def test_preflight_against_a_live_coordinator(swarm, tmp_path):
    config = write_run_config(tmp_path / "run.json", rounds={"rounds": 3, "expected_peers": 1, "window_s": 5.0})
    swarm.start_coordinator(["--config", str(config)])
    out = tmp_path / "preflight.json"
    result = subprocess.run([sys.executable, "-m", "peer.cli.main", "preflight", "--initial-peers", *swarm.initial_peers,
                             "--host", "127.0.0.1", "--port", str(free_port()), "--threads", "1",
                             "--seconds", "0.5", "--json", str(out)], capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["coordinator"] == swarm.coordinator_endpoint and r["numel"] > 50_000
    assert 0 < r["rtt_s"] < 0.5
    for direction in ("download", "upload"):
        assert r[direction]["bytes"] >= 256 << 10 and r[direction]["bytes_per_s"] > 1e6  # loopback: far above 1 MB/s
    assert r["dial_back"]["reachable"] and r["dial_back"]["address"].startswith("127.0.0.1:")
    assert not r["recommendation"]["client_mode"]["recommended"]
    assert 0 < r["step_s"] < 5 and r["recommendation"]["rows"][0]["codec"] == "fp16"
    assert "recommendation:" in result.stdout and "no --client-mode" in result.stdout
    steps = min(1000, max(1, math.ceil(5.0 / r["step_s"] - 1e-9)))  # a window run: the steps the window fits, no peer's work yet
    assert r["window"]["steps"] == steps and r["window"]["share"] is None
    assert f"in the 5 s window this machine would take {steps} inner steps" in result.stdout

    channel = create_channel(swarm.coordinator_endpoint)
    try:
        stub = swarm_pb2_grpc.PreflightStub(channel)
        # Nothing listens on 127.0.0.2 -> the coordinator, dialling our address as it sees it (127.0.0.1), is refused.
        port = free_port()
        dial = check_dial_back(stub, "127.0.0.2", port)
        assert not dial["reachable"] and dial["address"] == f"127.0.0.1:{port}" and "Refused" in dial["error"]
        with pytest.raises(grpc.RpcError) as bad:
            stub.DialBack(swarm_pb2.DialBackRequest(port=70000), timeout=10)
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        got = sum(len(c.data) for c in stub.ProbeDownload(swarm_pb2.ProbeDownloadRequest(size=1 << 40, chunk_bytes=1 << 30), timeout=60))
        assert got == 64 << 20  # capped, whatever was asked
    finally:
        channel.close()

