"""A real coordinator and peers as subprocesses on loopback: DHT discovery, gRPC, signed rounds."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from peer.run import faults
from tests.helpers import Gate, read_summary, wait_line, wait_run_end, wait_status, write_run_config

pytestmark = pytest.mark.integration


@pytest.mark.exec_processes  # each peer with its own hash seed: agreeing bit for bit must not rest on a shared one
@pytest.mark.parametrize("overlap", [False, True], ids=["synchronous", "overlapped"])
def test_three_peers_train_in_lockstep(swarm, tmp_path, overlap):
    """3 peers, 3 rounds: every round has every update, the loss falls, and every peer ends the
    run cleanly on the coordinator's final hash (with overlapped rounds too, where peers finish
    their last round at different times: issue #11's clean run end)."""
    config = write_run_config(tmp_path / "run.json", rounds={"rounds": 3, "expected_peers": 3, "overlap_communication": overlap})
    coordinator = swarm.start_coordinator(["--config", str(config)])
    peers = [swarm.start_peer(f"peer{i}", ["--shard", f"{i}/3"]) for i in range(3)]
    wait_run_end(swarm, coordinator, peers, within_s=300, peers_within_s=120)

    status = read_summary(swarm, "coordinator")
    history = status["history"]
    assert [h["round"] for h in history] == [0, 1, 2]
    assert all(h["updates"] == 3 for h in history), history
    # Validation loss fell.
    assert history[-1]["val_loss"] < status["initial_val_loss"] - 0.05
    for peer in peers:
        finished = wait_line(peer, r"finished: run \S+ ended at round (\d+), final hash (\w+)", 5)
        assert finished.group(2) == history[-1]["param_hash"] and int(finished.group(1)) == 3
        assert "Traceback" not in "".join(peer.lines), "".join(peer.lines)[-3000:]

    summaries = [read_summary(swarm, f"peer{i}") for i in range(3)]
    assert len({tuple(h["next_window_s"] for h in s["history"]) for s in summaries}) == 1  # one manifest for all
    for s in summaries:
        # Every peer ended every round with the coordinator's parameter hash.
        assert [h["in_sync"] for h in s["history"]] == [True, True, True]
        # Overlapped: rounds 0 and 1 each landed during the next round's inner steps (the record
        # says after how many); the last round has no next phase. Synchronous: nothing overlaps.
        landed = [h["landed_after_steps"] for h in s["history"]]
        assert [isinstance(n, int) for n in landed] == ([True, True, False] if overlap else [False] * 3), landed
        assert landed[2] is None, landed
        # Overlapped: the coordinator signs the next phase's window into a manifest once it measured
        # a phase after the start-up (rounds.overlap_window; rounds 0 and 1 have none: H steps).
        windows = [h["next_window_s"] for h in s["history"]]
        assert [w > 0 for w in windows] == ([False, False, True] if overlap else [False] * 3), windows
        assert s["param_hash"] == history[-1]["param_hash"]
        assert s["bytes_sent"] > 0 and s["bytes_received"] > 0

    # Byte counters agree between sender and receiver: what each peer counted as sent to the
    # coordinator is what the coordinator counted as received from that peer, and vice versa.
    by_id = {s["peer_id"]: s for s in summaries}
    for record in status["peers"]:
        peer = by_id[record["peer_id"]]
        sent_to_coordinator = sum(t.get(status["endpoint"], {}).get("bytes_sent", 0) for t in peer["traffic"].values())
        assert sent_to_coordinator > 0
    coordinator_view = status["traffic_by_peer"]
    served_in_all = 0
    for peer_id, peer in by_id.items():
        # Callers name themselves (peer_id); callees are named by the endpoint that was dialled.
        sent = sum(t.get(status["endpoint"], {}).get("bytes_sent", 0) for t in peer["traffic"].values())
        received = sum(t.get(status["endpoint"], {}).get("bytes_received", 0) for t in peer["traffic"].values())
        assert coordinator_view[peer_id]["bytes_received"] == sent
        assert coordinator_view[peer_id]["bytes_sent"] == received
        # The other direction: the coordinator fetched payloads from the peers' own servers (from
        # as few as hold what it wants: slice_plan.cover; a peer it never asked served it 0 bytes).
        endpoint = next(r["endpoint"] for r in status["peers"] if r["peer_id"] == peer_id)
        served = sum(t.get(status["coordinator_id"], {}).get("bytes_sent", 0) for t in peer["traffic"].values())
        assert coordinator_view.get(endpoint, {}).get("bytes_received", 0) == served
        served_in_all += served
    assert served_in_all > 0


def test_client_mode_and_direct_coordinator_and_status(swarm, tmp_path):
    """A peer behind NAT (--client-mode, no server) pushes its update; another reaches the
    coordinator directly without the DHT; `swarmloco status` reports both."""
    config = write_run_config(tmp_path / "run.json", rounds={"rounds": 2, "expected_peers": 2})
    coordinator = swarm.start_coordinator(["--config", str(config)])
    natted = swarm.start_peer("natted", ["--shard", "0/2", "--client-mode"])
    direct = swarm.start_peer("direct", ["--shard", "1/2"], via_dht=False)
    wait_run_end(swarm, coordinator, (natted, direct), within_s=180)
    status = read_summary(swarm, "coordinator")
    assert [h["updates"] for h in status["history"]] == [2, 2]
    natted_summary = read_summary(swarm, "natted")
    assert all(h["in_sync"] for h in natted_summary["history"])
    by_id = {p["peer_id"]: p for p in status["peers"]}
    assert by_id[natted_summary["peer_id"]]["client_mode"] is True
    assert by_id[natted_summary["peer_id"]]["endpoint"] == ""


def test_status_command_reads_a_live_coordinator(swarm, tmp_path, monkeypatch):
    """`swarmloco status` (--json and the table) reads a live coordinator: its peer's own counters,
    as its heartbeats report them. The peer waits at a gate after training round 2 (a fault hook)
    while the test reads, so the run is live and holds still however slow the machine is."""
    config = write_run_config(tmp_path / "run.json", rounds={"rounds": 3, "expected_peers": 1})
    coordinator = swarm.start_coordinator(["--config", str(config)])
    gate = Gate(tmp_path / "gate", "trained", 2)
    with monkeypatch.context() as env:
        env.setenv(faults.ENV, gate.fault)
        peer = swarm.start_peer("solo", ["--shard", "0/1"])
    gate.reached(peer, 180)
    # Heartbeats carry the peer's own counters: wait for one sent after a round ended.
    wait_status(swarm.coordinator_endpoint, lambda s: s["peers"] and s["peers"][0]["last_round"] >= 1 and s["peers"][0]["bytes_sent"] > 0, 60)
    out = subprocess.run([sys.executable, "-m", "peer.cli.main", "status", "--coordinator", swarm.coordinator_endpoint, "--json"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    status = json.loads(out.stdout)
    assert status["round"] == 2
    (record,) = status["peers"]
    assert record["last_round"] >= 1
    for key in ("peer_id", "last_round", "param_hash", "bytes_sent", "bytes_received", "state", "excluded_reason", "banned_reason"):
        assert key in record
    assert record["bytes_sent"] > 0 and record["aggregation"]["weight"] == 1.0  # its update took part in every slice
    table = subprocess.run([sys.executable, "-m", "peer.cli.main", "status", "--coordinator", swarm.coordinator_endpoint],
                           capture_output=True, text=True, timeout=30)
    assert table.returncode == 0 and record["peer_id"][:8] in table.stdout
    assert peer.alive()
    gate.open()
    wait_run_end(swarm, coordinator, [peer], within_s=120)


def test_byzantine_peers_in_a_real_swarm_are_excluded_or_outvoted(swarm, tmp_path):
    """Two real peers attack (tests/byzantine_peer.py): one sends NaN, one a sign-flipped update x4.
    The NaN update never reaches aggregation (the manifest names why, identically for all);
    the median outvotes the flipped one; status shows each peer's share and exclusion."""
    config = write_run_config(
        tmp_path / "run.json",
        rounds={"rounds": 3, "expected_peers": 4},
        aggregation={"name": "median", "num_byzantine": 1},
    )
    coordinator = swarm.start_coordinator(["--config", str(config)])
    honest = [swarm.start_peer(f"honest{i}", ["--shard", f"{i}/4"]) for i in range(2)]
    byzantine = "tests.byzantine_peer"
    nan_peer = swarm.start_peer("nan", ["--shard", "2/4", "--attack", "nan"], module=byzantine)
    flipper = swarm.start_peer("flip", ["--shard", "3/4", "--attack", 'sign-flip:{"scale": 4.0}'], module=byzantine)
    wait_run_end(swarm, coordinator, (*honest, nan_peer, flipper))

    status = read_summary(swarm, "coordinator")
    ids = {name: read_summary(swarm, name)["peer_id"] for name in ("honest0", "honest1", "nan", "flip")}
    for h in status["history"]:
        assert h["excluded"] == {ids["nan"]: "non-finite"}
        assert h["updates"] == 3
    assert status["history"][-1]["val_loss"] < status["initial_val_loss"] - 0.05
    assert status["rejections"].get("non-finite", 0) == 3
    peers = {p["peer_id"]: p for p in status["peers"]}
    assert "non-finite" in peers[ids["nan"]]["excluded_reason"]
    # Sliced exchange (the default): a peer's share is the slices its update took part in; the
    # NaN update was left out of every slice by the owners, the others out of none.
    shares = {name: peers[ids[name]]["aggregation"]["weight"] for name in ids}
    assert shares == {"honest0": 1.0, "honest1": 1.0, "nan": 0.0, "flip": 1.0}, shares
