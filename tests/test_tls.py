"""TLS on every channel: a real coordinator and peers over TLS with a CA made for the test, and
clients that lack the CA or trust another one refused with an error that says what to pass."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from peer.cli.launcher import Swarm, make_loopback_tls
from peer.cli.main import main
from tests.helpers import ROOT, read_summary, write_run_config

pytestmark = pytest.mark.integration


def _status(endpoint: str, *tls_flags: str) -> subprocess.CompletedProcess:
    """`swarmloco status` in its own process: TLS is a process-wide setting."""
    return subprocess.run([sys.executable, "-m", "peer.cli.main", "status", "--coordinator", endpoint, "--json",
                           "--connect-timeout", "10", *tls_flags], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_a_swarm_runs_over_tls_and_clients_without_its_ca_are_refused(tmp_path):
    config = write_run_config(tmp_path / "run.json", rounds={"rounds": 2, "expected_peers": 2})
    other_ca = make_loopback_tls(tmp_path / "other", name="another").ca
    with Swarm(tmp_path / "swarm", tls=True, prewarmed=True) as swarm:
        assert swarm.tls is not None
        coordinator = swarm.start_coordinator(["--config", str(config)])
        endpoint = swarm.coordinator_endpoint
        # A peer without the CA dials the coordinator directly and stops with what to pass.
        stranger = swarm.start_peer("stranger", ["--client-mode", "--connect-timeout", "20"], via_dht=False, tls=False)
        # The probes run while the coordinator waits for its two expected peers (started after
        # them): a swarm that had finished its 2 rounds meanwhile would no longer answer them.
        trusted = _status(endpoint, "--tls-ca", str(swarm.tls.ca))
        assert trusted.returncode == 0, trusted.stderr
        assert json.loads(trusted.stdout)["rounds"] == 2
        plaintext = _status(endpoint)
        assert plaintext.returncode == 1
        assert f"{endpoint} serves TLS" in plaintext.stderr and "pass --tls-ca" in plaintext.stderr, plaintext.stderr
        untrusted = _status(endpoint, "--tls-ca", str(other_ca))
        assert untrusted.returncode == 1
        assert "TLS certificate is not trusted by the CA in --tls-ca" in untrusted.stderr, untrusted.stderr
        # The swarm: two serving peers found through the DHT; in the sliced exchange they trade
        # each other's slices, so peer-to-peer channels run over TLS too.
        peers = [swarm.start_peer(f"peer{i}", ["--shard", f"{i}/2"]) for i in range(2)]

        assert swarm.wait(stranger, 60) == 1
        assert f"{endpoint} serves TLS" in "".join(stranger.lines) and "pass --tls-ca" in "".join(stranger.lines)

        assert swarm.wait(coordinator, 240) == 0, "".join(coordinator.lines)[-3000:]
        for peer in peers:
            assert swarm.wait(peer, 60) == 0, "".join(peer.lines)[-2000:]
        status = read_summary(swarm, "coordinator")
        summaries = [read_summary(swarm, f"peer{i}") for i in range(2)]
    assert [h["updates"] for h in status["history"]] == [2, 2]
    assert len(status["peers"]) == 2  # the stranger never joined
    assert all(h["excluded"] == {} for h in status["history"]), status["history"]  # nobody unreachable over TLS
    endpoints = {p["peer_id"]: p["endpoint"] for p in status["peers"]}
    for summary, other in zip(summaries, reversed(summaries)):
        assert [h["in_sync"] for h in summary["history"]] == [True, True]
        assert summary["param_hash"] == status["history"][-1]["param_hash"]
        # The peers traded slices (one SwapSlices stream, opened by one of the two): peer-to-peer channels ran
        # over TLS. The opener counts the other by its endpoint, the other counts the opener by its peer_id.
        from_other = sum(t.get(key, {}).get("bytes_received", 0) for t in summary["traffic"].values()
                         for key in (endpoints[other["peer_id"]], other["peer_id"]))
        assert from_other > 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["coordinator", "--tls-key", "{key}"], "--tls-key needs --tls-cert"),
        (["coordinator", "--tls-cert", "{cert}"], "--tls-cert needs --tls-key"),
        (["coordinator", "--tls-cert", "{cert}", "--tls-key", "{other_key}"], "are not a PEM certificate and its private key"),
        (["coordinator", "--tls-ca", "{ca}"], "pass --tls-cert and --tls-key"),
        (["peer", "--coordinator", "127.0.0.1:1", "--tls-ca", "{ca}"], "must run with --client-mode"),
        (["status", "--coordinator", "127.0.0.1:1", "--tls-ca", "{missing}"], "--tls-ca {missing}: no such file"),
        (["status", "--coordinator", "127.0.0.1:1", "--tls-ca", "{key}"], "is not a PEM CA certificate"),
    ],
    ids=["key-without-cert", "cert-without-key", "mismatched-pair", "coordinator-without-cert", "serving-peer-without-cert",
         "missing-file", "key-as-ca"],
)
def test_bad_tls_flags_fail_at_start_with_what_to_pass(tmp_path, capsys, argv, message):
    files, other = make_loopback_tls(tmp_path / "a"), make_loopback_tls(tmp_path / "b")
    names = {"cert": files.cert, "key": files.key, "ca": files.ca, "other_key": other.key, "missing": tmp_path / "missing.pem"}
    assert main([arg.format(**names) for arg in argv]) == 2  # before anything starts: no DHT, no server
    assert message.format(**names) in capsys.readouterr().err
