"""A compute-window run in real processes on loopback (shared/DESIGN.md, "Heterogeneous peers"):
three peers, one of which signs 4x the work it did into its headers. Every peer ends on the
coordinator's hash (the owners weighed every slice the same way, from the signed claims and the
manifest's history), and status shows each peer's steps, tokens and weight, the inflated claim
capped at 2x the round's median.

No timing in the assertions: the window closes at once (window_s tiny) and every peer takes
exactly rounds.min_steps steps, so the claims are known in advance. The peers dial the
coordinator's gRPC port directly (no DHT of their own to bootstrap: the test's CPU went from
30 s to 22 s; the join through the DHT is tested elsewhere)."""

from __future__ import annotations

import pytest

from tests.helpers import read_summary, tiny_run_config, wait_run_end, write_run_config

pytestmark = pytest.mark.integration
STEPS, ROUNDS = 3, 2


def test_a_window_run_weighs_by_capped_work_and_every_peer_ends_in_sync(swarm, tmp_path):
    rounds = {"rounds": ROUNDS, "expected_peers": 3, "window_s": 0.001, "min_steps": STEPS, "max_steps": 4 * STEPS}
    config = write_run_config(tmp_path / "run.json", rounds=rounds)
    tokens_per_step = tiny_run_config().data.batch_size * tiny_run_config().model.seq_len
    coordinator = swarm.start_coordinator(["--config", str(config)])
    quiet = ["--log-every", "1000"]
    peers = [swarm.start_peer(f"peer{i}", [*quiet, "--shard", f"{i}/3"], via_dht=False) for i in range(2)]
    peers.append(swarm.start_peer("inflator", ["--claim-work", "4", *quiet, "--shard", "2/3"], via_dht=False, module="tests.byzantine_peer"))
    wait_run_end(swarm, coordinator, peers)
    status = read_summary(swarm, "coordinator")
    final = status["history"][-1]["param_hash"]
    assert [r["updates"] for r in status["history"]] == [3] * ROUNDS
    summaries = {name: read_summary(swarm, name) for name in ("peer0", "peer1", "inflator")}
    for name, summary in summaries.items():
        assert summary["param_hash"] == final, name
        assert all(r["in_sync"] and r["inner_steps"] == STEPS and r["tokens"] == STEPS * tokens_per_step
                   for r in summary["history"]), name
    work = {p["peer_id"]: p["work"] for p in status["peers"]}
    inflator = work[summaries["inflator"]["peer_id"]]
    assert inflator == {"round": ROUNDS - 1, "inner_steps": 4 * STEPS, "tokens": 4 * STEPS * tokens_per_step,
                        "weight": 0.5, "capped_by": "median"}  # 2x the median claim, of 1 + 1 + 2
    for name in ("peer0", "peer1"):
        assert work[summaries[name]["peer_id"]] == {"round": ROUNDS - 1, "inner_steps": STEPS, "tokens": STEPS * tokens_per_step,
                                                    "weight": 0.25, "capped_by": ""}
