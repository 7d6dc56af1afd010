"""A compute-window run in real processes on loopback (shared/DESIGN.md, "Heterogeneous peers"):
three peers, one of which signs 4x the work it did into its headers. Every peer ends on the
coordinator's hash (the owners weighed every slice the same way, from the signed claims and the
manifest's history), and status shows each peer's steps, tokens and weight, the inflated claim
capped at 2x the round's median. Then the issue's swarm: a throttled peer beside full-speed ones
and the inflator; the throttled peer's smaller work counts in every round, at its weight.

No timing in the assertions: in the first test the window closes at once (window_s tiny) and every
peer takes exactly rounds.min_steps steps, so the claims are known in advance; in the second every
peer runs under SWARMLOCO_STEP_S (peer/run/paced_window.py), a machine of a declared speed that
fits an exact number of steps in the window and waits for the window's close. The peers dial the
coordinator's gRPC port directly (no DHT of their own to bootstrap: the test's CPU went from
30 s to 22 s; the join through the DHT is tested elsewhere)."""

from __future__ import annotations

import pytest

from peer.run.paced_window import ENV as STEP_S_ENV
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


WINDOW_S, FAST_STEP_S, SLOW_STEP_S = 0.8, 0.1, 0.4  # the window holds 8 steps at full speed, 2 at a quarter
FAST, SLOW = 8, 2


def test_a_throttled_peers_work_counts_every_round_and_an_inflated_claim_is_capped(swarm, tmp_path, monkeypatch):
    """Four peers, a 0.8 s window: two at full speed (8 steps a window), one throttled to a quarter
    (2 steps), one at full speed claiming 4x (32). Every round closes on all four commitments, the
    throttled peer's update among them, weighed 2 of 8 + 8 + 2 + 16 (the inflated 32 cut to 2x the
    median claim, 8); every peer ends on the coordinator's hash."""
    rounds = {"rounds": 3, "expected_peers": 4, "window_s": WINDOW_S, "min_steps": 1, "max_steps": 40}
    config = write_run_config(tmp_path / "run.json", rounds=rounds)
    tokens_per_step = tiny_run_config().data.batch_size * tiny_run_config().model.seq_len
    coordinator = swarm.start_coordinator(["--config", str(config)])
    quiet = ["--log-every", "1000"]

    def start(name: str, shard: int, step_s: float, *extra: str, module: str = "peer.cli.main"):
        with monkeypatch.context() as m:
            m.setenv(STEP_S_ENV, str(step_s))
            return swarm.start_peer(name, [*extra, *quiet, "--shard", f"{shard}/4"], via_dht=False, module=module)

    peers = [start("fast0", 0, FAST_STEP_S), start("fast1", 1, FAST_STEP_S), start("throttled", 2, SLOW_STEP_S),
             start("inflator", 3, FAST_STEP_S, "--claim-work", "4", module="tests.byzantine_peer")]
    wait_run_end(swarm, coordinator, peers)
    status = read_summary(swarm, "coordinator")
    final = status["history"][-1]["param_hash"]
    # Every round closed on the four updates (none waited out a deadline, none was excluded).
    assert [(r["updates"], r["excluded"], r["close_reason"]) for r in status["history"]] == \
        [(4, {}, "every live peer gathered")] * 3
    summaries = {p.name: read_summary(swarm, p.name) for p in peers}
    for name, summary in summaries.items():
        steps = SLOW if name == "throttled" else FAST
        assert summary["param_hash"] == final, name
        assert [(r["inner_steps"], r["tokens"], r["in_sync"]) for r in summary["history"]] == \
            [(steps, steps * tokens_per_step, True)] * 3, name
        # Busy until the swarm's window closed: from round 1 on it began when the coordinator applied
        # the last round (every peer heard it at once), before this peer had taken up θ_{r+1}.
        assert all(r["compute_s"] + r["window_late_s"] >= WINDOW_S for r in summary["history"]), name
        assert summary["history"][0]["window_late_s"] == 0 and all(r["window_late_s"] >= 0 for r in summary["history"]), name
    work = {p["peer_id"]: p["work"] for p in status["peers"]}
    total = FAST + FAST + SLOW + 2 * FAST  # the inflator's 4 x 8 = 32 counts 2x the median claim (8)
    expected = {"fast0": (FAST, FAST, ""), "fast1": (FAST, FAST, ""), "throttled": (SLOW, SLOW, ""),
                "inflator": (4 * FAST, 2 * FAST, "median")}
    for name, (claimed, counted, capped_by) in expected.items():
        assert work[summaries[name]["peer_id"]] == {"round": 2, "inner_steps": claimed, "tokens": claimed * tokens_per_step,
                                                    "weight": round(counted / total, 6), "capped_by": capped_by}, name


def test_an_overlapped_window_run_ends_every_peer_in_sync_with_the_steps_it_claimed(swarm, tmp_path):
    """rounds.window_s with overlap_communication (the swarm-aligned window, peer/node/overlap.py):
    each phase after the first closes window_s after the manifest of the round in flight. With a
    window that is closed at once, a phase runs until the exchange in flight lands (any number of
    steps) and then to min_steps: the step counts vary with timing, so the test checks what does
    not: every round closes with every peer, every peer on the coordinator's hash, each header's
    claim the steps that peer recorded, at least min_steps and at most max_steps."""
    rounds = {"rounds": 3, "expected_peers": 2, "window_s": 0.001, "min_steps": STEPS, "max_steps": 4 * STEPS,
              "overlap_communication": True}
    config = write_run_config(tmp_path / "run.json", rounds=rounds)
    tokens_per_step = tiny_run_config().data.batch_size * tiny_run_config().model.seq_len
    coordinator = swarm.start_coordinator(["--config", str(config)])
    peers = [swarm.start_peer(f"peer{i}", ["--log-every", "1000", "--shard", f"{i}/2"], via_dht=False) for i in range(2)]
    wait_run_end(swarm, coordinator, peers)
    status = read_summary(swarm, "coordinator")
    final = status["history"][-1]["param_hash"]
    assert [r["updates"] for r in status["history"]] == [2] * 3
    for name in ("peer0", "peer1"):
        summary = read_summary(swarm, name)
        assert summary["param_hash"] == final, name
        assert [r["round"] for r in summary["history"]] == [0, 1, 2], name
        for r in summary["history"]:
            assert r["in_sync"] and STEPS <= r["inner_steps"] <= 4 * STEPS and r["tokens"] == r["inner_steps"] * tokens_per_step, (name, r)
        claimed = {p["peer_id"]: p["work"] for p in status["peers"]}[summary["peer_id"]]
        assert claimed["inner_steps"] == summary["history"][-1]["inner_steps"], name
