"""The public-swarm recipe (`--recipe sparseloco`: sparse payloads, a robust sparse rule with a
declared f, a compressed all-gather) in a real swarm on loopback with one attacking peer and one
lying slice owner: every round ends with every honest peer on the coordinator's hash, the liar is
banned with its signed false result as evidence, the attacker's update is aggregated robustly."""

from __future__ import annotations

import pytest

from peer.run.recipes import recipe_overrides
from tests.helpers import read_summary, write_run_config

pytestmark = pytest.mark.integration
BYZANTINE = "tests.byzantine_peer"


def test_the_public_swarm_recipe_holds_against_an_attacker_and_a_lying_owner(tmp_path):
    from peer.cli.launcher import Swarm

    recipe = recipe_overrides("sparseloco")
    assert recipe["aggregation.name"] == "sparse-trimmed-mean" and recipe["exchange.result_codec"]
    rounds = 2
    config = write_run_config(tmp_path / "run.json", rounds={"rounds": rounds, "expected_peers": 4})
    shards = [["--shard", f"{i}/4", "--log-every", "1000"] for i in range(4)]
    with Swarm(tmp_path / "swarm", prewarmed=True) as swarm:
        coordinator = swarm.start_coordinator(["--config", str(config), "--recipe", "sparseloco", "--inner-steps", "2",
                                               "--num-byzantine", "1"])
        honest = [swarm.start_peer(f"peer{i}", shards[i]) for i in range(2)]
        attacker = swarm.start_peer("attacker", ["--attack", 'sign-flip:{"scale": 4.0}', *shards[2]], module=BYZANTINE)
        liar = swarm.start_peer("liar", ["--lie", "lone", *shards[3]], module=BYZANTINE)
        assert swarm.wait(coordinator, 300) == 0, "".join(coordinator.lines)[-3000:]
        for child in honest:
            assert swarm.wait(child, 60) == 0, f"{child.name}:\n" + "".join(child.lines)[-2000:]
        for child in (attacker, liar):  # a banned liar exits 0 or 1 (whether its ban reached it first)
            swarm.wait(child, 60)
        run = read_summary(swarm, "coordinator")
        peers = [read_summary(swarm, f"peer{i}") for i in range(2)]
        attacker_id = read_summary(swarm, "attacker")["peer_id"]  # a banned liar may exit before writing its own

    assert [h["round"] for h in run["history"]] == list(range(rounds))
    for summary in peers:
        assert [h["round"] for h in summary["history"]] == list(range(rounds))
        assert all(h["in_sync"] for h in summary["history"]), summary["history"]
        assert summary["param_hash"] == run["history"][-1]["param_hash"]
        # compressed both ways: a dense fp16 all-gather alone would bring (1 - r/n) x 892 KB = 446 KB
        assert all(h["bytes_received"] < 250_000 and h["bytes_sent"] < 250_000 for h in summary["history"][1:]), summary["history"]
    assert peers[0]["history"][0]["slices"]["liars"] >= 1 or peers[1]["history"][0]["slices"]["liars"] >= 1
    record = {p["peer_id"]: p for p in run["peers"]}
    banned = [p for p in run["peers"] if p["banned_reason"]]
    assert len(banned) == 1 and banned[0]["banned_reason"].startswith("false slice result in round 0")  # the liar, alone
    assert banned[0]["evidence"][0]["kind"] == "false-result" and banned[0]["evidence"][0]["signed_result"]
    assert not record[attacker_id]["banned_reason"]  # an attacker with a valid update is outvoted, not banned
    assert run["history"][0]["updates"] >= 3  # the attacker's update took part in the robust rule
