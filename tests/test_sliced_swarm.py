"""The sliced exchange in real swarms on loopback: lying and colluding slice owners. Byzantine
owners come from tests/byzantine_peer.py (`--lie`). An owner that dies mid-round:
tests/test_fault_tolerance.py (test_a_peer_sigkilled_mid_round_does_not_stall_the_swarm)."""

from __future__ import annotations


import pytest

from protocol.identity import Identity
from tests.helpers import read_summary, wait_run_end, write_run_config

pytestmark = pytest.mark.integration
BYZANTINE = "tests.byzantine_peer"


def _run(swarm, tmp_path, *, peers: list[tuple[str, list[str], str]], rounds: int, **sections) -> dict:
    config = write_run_config(tmp_path / "run.json", rounds={"rounds": rounds, "expected_peers": len(peers)}, **sections)
    coordinator = swarm.start_coordinator(["--config", str(config)])
    children = [swarm.start_peer(name, args, module=module) for name, args, module in peers]
    # An honest peer ends the run cleanly. A banned liar exits 0 or 1 depending on whether its ban
    # (a heartbeat reply) reached it before the run ended: what it did is asserted from the
    # coordinator's ban record instead.
    wait_run_end(swarm, coordinator, [child for child, (_, _, module) in zip(children, peers) if module != BYZANTINE])
    for child in children:
        swarm.wait(child, 60)
    return read_summary(swarm, "coordinator")


def test_a_lying_owner_is_banned_with_evidence_and_changes_no_honest_parameter(tmp_path):
    """Round 0 twice from the same start: once with three honest peers, once with the third one
    signing a false result for every slice it owns. The honest peers and the coordinator end the
    round on the same parameters both times; the liar is banned with its signed result."""
    from peer.cli.launcher import Swarm

    shards = [["--shard", f"{i}/3", "--log-every", "1000"] for i in range(3)]
    with Swarm(tmp_path / "clean", prewarmed=True) as swarm:
        clean = _run(swarm, tmp_path / "clean", rounds=1,
                     peers=[(f"peer{i}", shards[i], "peer.cli.main") for i in range(3)])
    with Swarm(tmp_path / "lying", prewarmed=True) as swarm:
        lying = _run(swarm, tmp_path / "lying", rounds=1,
                     peers=[("peer0", shards[0], "peer.cli.main"), ("peer1", shards[1], "peer.cli.main"),
                            ("liar", ["--lie", "lone", *shards[2]], BYZANTINE)])
        honest = [read_summary(swarm, f"peer{i}") for i in range(2)]
        liar_id = read_summary(swarm, "liar")["peer_id"]
    assert clean["history"][0]["updates"] == lying["history"][0]["updates"] == 3
    assert lying["history"][0]["param_hash"] == clean["history"][0]["param_hash"]
    for summary in honest:
        assert summary["param_hash"] == clean["history"][0]["param_hash"]
        assert summary["history"][0]["in_sync"] and summary["history"][0]["slices"]["liars"] >= 1
    record = next(p for p in lying["peers"] if p["peer_id"] == liar_id)
    assert record["banned_reason"].startswith("false slice result in round 0")
    assert record["evidence"] and record["evidence"][0]["kind"] == "false-result" and record["evidence"][0]["signed_result"]


def test_colluding_owners_are_caught_by_spot_checks(swarm, tmp_path):
    """Two of three peers collude: they sign the same false result for every slice they own
    together (with 3 servers and r = 2, a third of the slices every round). The honest peer's
    non-owned slices are exactly theirs, so its one spot check per round catches them in round 0
    (docs/sliced-exchange.md: expected rounds until caught = 1.0 for m = 3, f = 2)."""
    keys = [tmp_path / f"colluder{i}.pem" for i in range(2)]
    ids = [Identity.load_or_create(k).peer_id for k in keys]
    lie = f"collude:{','.join(ids)}"
    status = _run(swarm, tmp_path, rounds=2, exchange={"slices": 8, "spot_checks": 1},
                  peers=[("honest", ["--shard", "0/3"], "peer.cli.main"),
                         *[(f"colluder{i}", ["--identity-path", str(keys[i]), "--lie", lie, "--shard", f"{i + 1}/3"], BYZANTINE)
                           for i in range(2)]])
    banned = {p["peer_id"]: p for p in status["peers"] if p["banned_reason"]}
    assert set(banned) == set(ids), {p["peer_id"][:8]: p["banned_reason"] for p in status["peers"]}
    for record in banned.values():
        assert "false slice result in round 0" in record["banned_reason"]
        assert record["evidence"][0]["kind"] == "false-result"
    honest = read_summary(swarm, "honest")
    assert honest["history"][0]["slices"]["liars"] >= 1  # its spot check named them
    assert honest["param_hash"] == status["history"][-1]["param_hash"]
    assert status["history"][1]["updates"] == 1  # round 1: the colluders are out
