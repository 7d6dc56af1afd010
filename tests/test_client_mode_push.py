"""Client-mode (NAT'd) peers in the sliced exchange push each slice of their update straight to
that slice's owners: the coordinator carries control only (issue 24)."""

from __future__ import annotations

import pytest

from tests.helpers import read_summary, wait_run_end, write_run_config

pytestmark = pytest.mark.integration


def _method(traffic: dict, method: str, key: str) -> int:
    return sum(by_method.get(method, {}).get(key, 0) for by_method in traffic.values())


def test_half_the_peers_in_client_mode_push_to_owners_and_the_coordinator_relays_nothing(swarm, tmp_path):
    """4 peers, 2 of them --client-mode, one round: every update is in the round and every peer
    ends on the coordinator's hash; the coordinator's transport ledger shows no payload taken in
    (no PushPayload) and none served (no FetchPayload answered); the client-mode peers' slices went
    to the two serving peers (PushSlices), which own every slice."""
    config = write_run_config(tmp_path / "run.json", rounds={"rounds": 1, "expected_peers": 4},
                              exchange={"spot_checks": 0})  # the coordinator's own spot check would fetch inputs
    coordinator = swarm.start_coordinator(["--config", str(config)])
    names = ["serving0", "serving1", "natted0", "natted1"]
    peers = [swarm.start_peer(name, ["--shard", f"{i}/4", *(["--client-mode"] if name.startswith("natted") else [])])
             for i, name in enumerate(names)]
    wait_run_end(swarm, coordinator, peers, within_s=240)

    status = read_summary(swarm, "coordinator")
    assert [h["updates"] for h in status["history"]] == [4], status["history"]
    summaries = {name: read_summary(swarm, name) for name in names}
    for name, summary in summaries.items():
        assert summary["param_hash"] == status["history"][-1]["param_hash"], name
        assert all(h["in_sync"] for h in summary["history"]), (name, summary["history"])

    traffic = status["traffic_by_method"]
    for method in ("served:PushPayload", "served:FetchPayload", "served:PushSlices"):
        assert _method(traffic, method, "bytes_received") == _method(traffic, method, "bytes_sent") == 0, (method, traffic)

    endpoints = {p["peer_id"]: p["endpoint"] for p in status["peers"]}
    serving = {endpoints[summaries[name]["peer_id"]] for name in ("serving0", "serving1")}
    for name in ("natted0", "natted1"):
        summary = summaries[name]
        to_coordinator = sum(t.get(status["endpoint"], {}).get("bytes_sent", 0) for t in summary["traffic"].values())
        to_owners = {ep: sum(t.get(ep, {}).get("bytes_sent", 0) for t in summary["traffic"].values()) for ep in serving}
        # r = 2 owners per slice, 2 servers: each serving peer owns every slice and got all of it
        assert min(to_owners.values()) > 100_000, to_owners
        assert to_coordinator < min(to_owners.values()) / 10, (to_coordinator, to_owners)
