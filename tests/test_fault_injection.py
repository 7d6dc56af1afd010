"""Deterministic fault injection (peer/run/faults.py): SWARMLOCO_FAIL_AT=PHASE:ROUND crashes a
process with SIGKILL at exactly that point, so crash tests need no log-timed kill."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from peer.run import faults
from tests.conftest import write_run_config


def test_fail_at_parses_phase_and_round():
    assert faults.parse_fail_at("committed:1") == faults.FailAt("committed", 1)
    assert faults.parse_fail_at(" manifest-signed:0 ") == faults.FailAt("manifest-signed", 0)
    assert set(faults.PEER_PHASES) >= {"trained", "committed", "manifest", "fetched", "aggregated"}


@pytest.mark.parametrize(
    "text, says",
    [
        ("committed", "expected PHASE:ROUND"),
        ("commited:1", "PHASE one of trained, committed"),  # a typo is refused, not ignored
        ("committed:one", "ROUND must be a whole number"),
        ("committed:", "ROUND must be a whole number"),
        ("committed:-1", "ROUND counts from 0"),
        (":1", "expected PHASE:ROUND"),
    ],
)
def test_bad_fail_at_is_a_clear_value_error(text, says):
    with pytest.raises(ValueError, match=says) as info:
        faults.parse_fail_at(text)
    assert faults.ENV in str(info.value)


def test_environment_is_read_once_and_unset_is_a_no_op(monkeypatch):
    monkeypatch.setattr(faults, "_target", faults._UNREAD)
    monkeypatch.delenv(faults.ENV, raising=False)
    assert faults.check_environment() is None
    monkeypatch.setenv(faults.ENV, "trained:0")
    assert faults.check_environment() is None  # read once: a later change is not seen
    faults.fail_point("trained", 0)  # no target: returns
    with pytest.raises(ValueError, match="not a phase"):
        faults.fail_point("trainde", 0)


def test_a_bad_value_stops_the_peer_at_start_up():
    """Refused before the peer connects anywhere (port 1 would only time out), with exit code 2."""
    env = dict(os.environ, **{faults.ENV: "committed:soon"})
    out = subprocess.run(
        [sys.executable, "-m", "peer.cli.main", "peer", "--coordinator", "127.0.0.1:1", "--connect-timeout", "30"],
        capture_output=True, text=True, timeout=60, env=env,
    )
    assert out.returncode == 2, out.stderr
    assert "SWARMLOCO_FAIL_AT='committed:soon': ROUND must be a whole number" in out.stderr


@pytest.mark.integration
def test_peer_dies_with_sigkill_right_after_its_round_1_commitment(swarm, tmp_path, monkeypatch):
    """A client-mode peer (its payload is pushed and verified before the commit is accepted)
    with SWARMLOCO_FAIL_AT=committed:1: killed by SIGKILL after its round-1 commitment is
    accepted, so round 1 aggregates its update and round 2 closes without it."""
    config = write_run_config(tmp_path / "run.json", rounds={"rounds": 3, "expected_peers": 2})
    coordinator = swarm.start_coordinator(["--config", str(config)])
    survivor = swarm.start_peer("survivor", ["--shard", "0/2"], via_dht=False)
    with monkeypatch.context() as env:  # only this child sees the variable
        env.setenv(faults.ENV, "committed:1")
        doomed = swarm.start_peer("doomed", ["--shard", "1/2", "--client-mode"], via_dht=False)

    assert swarm.wait(doomed, 180) == -signal.SIGKILL, "".join(doomed.lines)[-2000:]
    log = "".join(doomed.lines)
    assert "SWARMLOCO_FAIL_AT: reached committed:1" in log
    assert "round 1/3 done" in log and "round 2/3 done" not in log  # round 0 finished, round 1 did not
    assert swarm.wait(coordinator, 180) == 0, "".join(coordinator.lines)[-2000:]
    assert swarm.wait(survivor, 60) == 0, "".join(survivor.lines)[-2000:]

    status = json.loads((swarm.workdir / "coordinator.json").read_text())
    assert [h["updates"] for h in status["history"]] == [2, 2, 1]  # its round-1 update counted
    assert all(h["excluded"] == {} for h in status["history"])
    survivor_id = json.loads((swarm.workdir / "survivor.json").read_text())["peer_id"]
    (dead,) = [p for p in status["peers"] if p["peer_id"] != survivor_id]
    assert dead["last_round"] == 1 and dead["client_mode"] is True
    assert not (swarm.workdir / "doomed.json").exists()  # it never reached its summary
