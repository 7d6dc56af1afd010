"""A live local swarm scraped through /metrics: the coordinator's numbers agree with its status
JSON, each peer's with its own history; the run log records the run and plot_run draws it.

The peers wait at a gate (peer/run/faults.py `wait=PATH`) after training round HELD_ROUND, so
the swarm holds still, with every process up, while the test scrapes it and watches `status`."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from peer.cli.status import fetch_status
from peer.run import faults
from tests.helpers import ROOT, Gate, read_summary, wait_line, wait_run_end, wait_status, write_run_config

pytestmark = pytest.mark.integration
ROUNDS = 4
HELD_ROUND = 2  # rounds 0 and 1 closed, round 2 open while the test looks


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of one scrape, parsed by prometheus_client's parser."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for family in text_string_to_metric_families(text) for s in family.samples}


def consistent_view(metrics_url: str, endpoint: str) -> tuple[dict, dict, dict]:
    """A scrape bracketed by two status views that agree (nothing but the coordinator's own
    traffic, which the status calls themselves add to, changed while it was taken)."""
    for _ in range(100):
        before = fetch_status(endpoint)
        metrics = scrape(metrics_url)
        after = fetch_status(endpoint)
        keys = ("round", "history", "rejections")
        if all(before[k] == after[k] for k in keys) and \
                [(p["bytes_sent"], p["state"], p["last_round_bytes"]) for p in before["peers"]] == \
                [(p["bytes_sent"], p["state"], p["last_round_bytes"]) for p in after["peers"]]:
            return metrics, before, after
        time.sleep(0.05)
    raise AssertionError("the status never held still for one scrape")


WATCH = """
import signal, sys
from peer.cli.main import main
signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job (CI) inherits SIGINT ignored
code = main(["status", "--coordinator", sys.argv[1], "--watch", "0.3"])
print("exit", code, "loaded", sorted(m for m in ("torch", "hivemind") if m in sys.modules))
"""
FRAMES = 3  # ^C once `status --watch` has drawn this many
FRAME_END = b"^C to stop\n"  # the last line of every frame


def read_until(process: subprocess.Popen, count: int, marker: bytes, timeout_s: float) -> bytes:
    """What `process` wrote to stdout until `marker` appeared `count` times (or it closed stdout);
    an AssertionError when it did not within `timeout_s`."""
    out, deadline = b"", time.monotonic() + timeout_s
    while out.count(marker) < count:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"{count} x {marker!r} not printed within {timeout_s:.0f} s:\n{out[-2000:]!r}")
        if select.select([process.stdout], [], [], remaining)[0]:
            chunk = os.read(process.stdout.fileno(), 65536)
            if not chunk:
                break  # it exited: the caller's assertions say what went wrong
            out += chunk
    return out


def watch_status_in_place(endpoint: str) -> None:
    """`status --watch` redraws the table in place (clear-screen frames) until ^C, without torch:
    ^C (SIGINT) as soon as it has drawn FRAMES frames."""
    process = subprocess.Popen([sys.executable, "-u", "-c", WATCH, endpoint], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    try:
        drawn = read_until(process, FRAMES, FRAME_END, 60)
        process.send_signal(signal.SIGINT)
        rest, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    stdout, stderr = (drawn + rest).decode(), err.decode()
    frames = stdout.split("\x1b[H\x1b[2J")[1:]
    assert stdout.splitlines()[-1] == "exit 0 loaded []", stdout[-1000:] + stderr[-2000:]
    assert len(frames) >= FRAMES and all(f.startswith("run swarmloco-demo | ") for f in frames), stdout[:2000]
    rounds = [int(re.search(r"round (\d+)/", f).group(1)) for f in frames]
    assert rounds == sorted(rounds)


def test_metrics_agree_with_status_and_the_run_log_plots(swarm, tmp_path, monkeypatch):
    config = write_run_config(tmp_path / "run.json", rounds={"rounds": ROUNDS, "expected_peers": 2})
    log = tmp_path / "run.jsonl"
    coordinator = swarm.start_coordinator(["--config", str(config), "--metrics-port", "0", "--run-log", str(log)])
    gate = Gate(tmp_path / "gate", "trained", HELD_ROUND)
    with monkeypatch.context() as env:
        env.setenv(faults.ENV, gate.fault)
        peers = [swarm.start_peer(f"p{i}", ["--shard", f"{i}/2", "--metrics-port", "0"]) for i in range(2)]
    metrics_url = wait_line(coordinator, r"coordinator metrics: (http://\S+)", 90).group(1)
    peer_urls = [wait_line(p, r"metrics: (http://\S+)", 90).group(1) for p in peers]
    for p in peers:
        gate.reached(p, 180)
    # Both peers' heartbeats after round 1 (sent as it ended) carry that round's bytes.
    wait_status(swarm.coordinator_endpoint, lambda s: s["round"] == HELD_ROUND and len(s["peers"]) == 2
                and all(p["last_round_bytes"] for p in s["peers"]), 60)
    watch_status_in_place(swarm.coordinator_endpoint)
    for url in peer_urls:
        pm = scrape(url)
        assert pm[("swarmloco_rounds_completed_total", ())] >= 1
        assert pm[("swarmloco_sent_bytes_total", ())] > 0 and pm[("swarmloco_received_bytes_total", ())] > 0
        assert sum(v for (name, _), v in pm.items() if name == "swarmloco_phase") == 1.0  # exactly one phase
        step_s = pm[("swarmloco_inner_step_seconds", ())]
        tokens = 8 * 4 * 64  # tiny config: H x batch x seq_len
        assert step_s > 0 and pm[("swarmloco_tokens_per_second", ())] == pytest.approx(tokens / (8 * step_s), rel=1e-6)
        assert pm[("swarmloco_last_round_phase_seconds", (("phase", "compute"),))] == pytest.approx(8 * step_s)

    m, before, s = consistent_view(metrics_url, swarm.coordinator_endpoint)
    assert m[("swarmloco_round", ())] == s["round"] >= 2
    assert m[("swarmloco_rounds_planned", ())] == ROUNDS
    assert m[("swarmloco_val_loss", ())] == pytest.approx(s["history"][-1]["val_loss"])
    assert m[("swarmloco_round_duration_seconds_count", ())] == len(s["history"])
    assert m[("swarmloco_round_duration_seconds_sum", ())] == pytest.approx(sum(h["seconds"] for h in s["history"]))
    closed = {labels: v for (name, labels), v in m.items() if name == "swarmloco_rounds_closed_total"}
    assert sum(closed.values()) == len(s["history"])
    for direction in ("sent", "received"):
        sample = m[(f"swarmloco_coordinator_{direction}_bytes_total", ())]
        assert 0 < before["coordinator_traffic"][f"bytes_{direction}"] <= sample <= s["coordinator_traffic"][f"bytes_{direction}"]
    for p in s["peers"]:
        peer = p["peer_id"][:16]
        assert m[("swarmloco_peer_sent_bytes_total", (("peer", peer),))] == p["bytes_sent"] > 0
        assert m[("swarmloco_peer_received_bytes_total", (("peer", peer),))] == p["bytes_received"] > 0
        assert m[("swarmloco_peer_last_round", (("peer", peer),))] == p["last_round"]
        assert m[("swarmloco_peer_state", (("peer", peer), ("state", p["state"])))] == 1.0
        assert m[("swarmloco_peer_round_bytes", (("direction", "sent"), ("peer", peer)))] == p["last_round_bytes"]["sent"]
        assert m[("swarmloco_peer_utilization_ratio", (("peer", peer),))] == pytest.approx(p["utilization"])
        assert m[("swarmloco_peer_aggregation_weight", (("peer", peer),))] == p["aggregation"]["weight"]
    live = sum(v for (name, labels), v in m.items() if name == "swarmloco_peers")
    assert live == len(s["peers"]) == 2

    gate.open()
    wait_run_end(swarm, coordinator, peers, within_s=180)
    summary = read_summary(swarm, "coordinator")
    events = [json.loads(line) for line in log.read_text().splitlines()]
    kinds = [e["event"] for e in events]
    # "finished" follows every round; only a peer's report of its own last round (a heartbeat the
    # peer sends after the coordinator recorded that round) may come after it.
    assert kinds[0] == "start" and kinds.count("finished") == 1 and kinds.count("join") == 2
    assert all(e["event"] == "peer_round" and e["round"] == ROUNDS - 1 for e in events[kinds.index("finished") + 1:]), kinds
    rounds = [e for e in events if e["event"] == "round"]
    assert [e["round"] for e in rounds] == list(range(ROUNDS))
    assert [e["val_loss"] for e in rounds] == [h["val_loss"] for h in summary["history"]]
    assert all(e["updates"] == 2 and e["coordinator_bytes_sent"] >= 0 for e in rounds)
    assert sum(e["coordinator_bytes_sent"] for e in rounds) > 0
    peer_rounds = [e for e in events if e["event"] == "peer_round"]
    assert {e["peer_id"] for e in peer_rounds} == {p["peer_id"] for p in summary["peers"]}
    assert all(e["bytes_sent"] > 0 for e in peer_rounds)

    out = tmp_path / "plots"
    result = subprocess.run([sys.executable, str(ROOT / "scripts/plot_run.py"), str(log), "--out", str(out)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    for name in ("loss_vs_round.png", "loss_vs_bytes.png", "peer_bytes.png", "utilization.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (out / name).stat().st_size > 5000


def _status(coordinator_id: str, history: list, peers: list) -> dict:
    return {"run_id": "r", "coordinator_id": coordinator_id, "endpoint": "h:1", "round": len(history), "codec": "fp16", "aggregator": "median",
            "outer": "nesterov", "initial_val_loss": 5.0, "finished": False, "history": history, "peers": peers,
            "coordinator_traffic": {"bytes_sent": 100 * len(history), "bytes_received": 0}}


def test_run_log_names_takeovers_bans_and_rounds(tmp_path):
    """The watcher's diffing on its own: a second coordinator with a higher term writing the same
    log is a takeover; a new ban is logged once with its evidence; a closed round once."""
    from peer.coordinator.metrics import close_reason_label
    from peer.coordinator.run_log import RunWatcher

    log = tmp_path / "run.jsonl"
    first = RunWatcher(lambda: _status("a" * 32, [], []), log)
    first.poll()
    first.close()
    peer = {"peer_id": "p" * 32, "endpoint": "h:2", "client_mode": False, "state": "committed", "banned_reason": "", "evidence": [],
            "seconds_since_seen": 0.1, "bytes_sent": 10, "bytes_received": 20, "utilization": 0.5, "loss": 3.0, "last_round_bytes": {}}
    round0 = {"round": 0, "val_loss": 4.0, "updates": 1, "excluded": {}, "seconds": 1.0, "close_reason": "deadline 30s passed; missing 1 peer(s)",
              "param_hash": "x"}
    current = {"view": _status("b" * 32, [], [peer])}
    second = RunWatcher(lambda: current["view"], log, term=lambda: 1)
    second.poll()
    current["view"] = _status("b" * 32, [round0], [{**peer, "state": "banned", "banned_reason": "equivocation in round 0",
                                                     "evidence": [{"kind": "equivocation", "round": 0}]}])
    second.poll()
    second.poll()  # nothing new: nothing logged
    second.close()
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["event"] for e in events] == ["start", "takeover", "join", "ban", "round"]
    assert events[1]["previous_coordinator_id"] == "a" * 32 and events[1]["term"] == 1
    assert events[3]["evidence"] == [{"kind": "equivocation", "round": 0}]
    assert events[4]["coordinator_bytes_sent"] == 100 and close_reason_label(events[4]["close_reason"]) == "deadline"
