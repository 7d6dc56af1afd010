"""The end of a run on loopback: with overlapped rounds, peers that finish their last round at
different times all end cleanly on the coordinator's final hash (issue #11's clean run end)."""

from __future__ import annotations

import pytest

from tests.helpers import read_summary, wait_line, write_run_config

pytestmark = pytest.mark.integration


def test_overlapped_peers_all_finish_on_the_final_hash(swarm, tmp_path):
    """3 peers, overlapped exchange, 3 rounds: every peer exits 0, prints "finished: run ...
    final hash H" with H the coordinator's last history hash, and no peer printed a traceback."""
    config = write_run_config(tmp_path / "run.json", rounds={"rounds": 3, "expected_peers": 3, "overlap_communication": True})
    coordinator = swarm.start_coordinator(["--config", str(config)])
    peers = [swarm.start_peer(f"peer{i}", ["--shard", f"{i}/3"]) for i in range(3)]

    assert swarm.wait(coordinator, 300) == 0, "".join(coordinator.lines)[-3000:]
    history = read_summary(swarm, "coordinator")["history"]
    assert [h["round"] for h in history] == [0, 1, 2]
    final = history[-1]["param_hash"]
    for peer in peers:
        assert swarm.wait(peer, 120) == 0, "".join(peer.lines)[-3000:]
        finished = wait_line(peer, r"finished: run \S+ ended at round (\d+), final hash (\w+)", 5)
        assert finished.group(2) == final and int(finished.group(1)) == 3
        text = "".join(peer.lines)
        assert "Traceback" not in text, text[-3000:]
