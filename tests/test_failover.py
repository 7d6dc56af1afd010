"""The control plane with real processes on loopback: a standby coordinator takes over from a
SIGKILLed active one, a returning coordinator does not split the run, and an endpoint that signs
with another key than the run's is refused however the peer found it."""

from __future__ import annotations

import re
import signal

import pytest

from peer.cli.launcher import MADDR_RE, Swarm
from protocol.identity import Identity
from tests.helpers import free_port, read_summary, wait_line, write_run_config

pytestmark = pytest.mark.integration


def test_standby_takes_over_from_a_sigkilled_coordinator_and_the_old_one_comes_back_as_standby(swarm, tmp_path, monkeypatch):
    """The active coordinator SIGKILLs itself right after signing round 2's manifest (a fail point)
    and is not restarted while the standby takes over with term 1; peers move to it without a
    restart and every peer ends on its final hash. The old coordinator then comes back (same key,
    same flags, through the survivors' DHT addresses) while the run goes on: it must follow as a
    standby, not split the run, and leave when the run ends."""
    standby_key = Identity.load_or_create(swarm.workdir / "standby.pem")  # made first, so the run can list it
    config = write_run_config(tmp_path / "run.json", rounds={"rounds": 12, "expected_peers": 4}, control={"lease_s": 2.0})
    with monkeypatch.context() as m:
        m.setenv("SWARMLOCO_FAIL_AT", "manifest-signed:2")
        active = swarm.start_coordinator(["--config", str(config), "--coordinators", standby_key.peer_id])
    old_key = wait_line(active, r"coordinator fingerprint: (\w+)", 30).group(1)
    standby = swarm.start_standby("standby", ["--port", str(free_port())])
    wait_line(standby, r"following run \S+'s active coordinator", 60)
    # The peers hold back round 2's commitments for 10 s once round 1 has closed: the standby,
    # polling every 0.5 s, holds round 2's checkpoint long before the active signs round 2's
    # manifest and dies, so it takes over at round 2, not at round 1.
    with monkeypatch.context() as m:
        m.setenv("SWARMLOCO_FAIL_AT", "trained:2:delay=10")
        peers = [swarm.start_peer(f"peer{i}", ["--shard", f"{i}/4"]) for i in range(4)]

    assert swarm.wait(active, 240) == -signal.SIGKILL
    took_over = wait_line(standby, r"took over run \S+ with term (\d+) at round (\d+)", 60)
    assert (int(took_over.group(1)), int(took_over.group(2))) == (1, 2)  # term 1, from the start of round 2 it held
    # Back at once, while the swarm (whose DHT nodes are its way in) is sure to be running.
    maddrs = sorted({m for child in (standby, *peers) for m in MADDR_RE.findall("".join(child.lines))})
    back = swarm._spawn("returned", ["coordinator", "--initial-peers", *maddrs, "--host", "127.0.0.1",
                                     "--host-maddrs", "/ip4/127.0.0.1/tcp/0", "--port", "0",
                                     "--identity-path", str(swarm.workdir / "coordinator.pem"), "--config", str(config),
                                     "--coordinators", standby_key.peer_id])
    wait_line(standby, r"round 3/12 closed", 120)  # the swarm closes rounds under the new coordinator

    assert swarm.wait(standby, 300) == 0, "".join(standby.lines)[-3000:]
    for peer in peers:
        assert swarm.wait(peer, 90) == 0, "".join(peer.lines)[-3000:]

    status = read_summary(swarm, "standby")
    history = status["history"]
    assert [h["round"] for h in history] == list(range(12))
    final = history[-1]["param_hash"]
    for i in range(4):
        assert read_summary(swarm, f"peer{i}")["param_hash"] == final
        wait_line(peers[i], rf"finished: run \S+ ended at round 12, final hash {final}", 5)
    # The run is not split: no peer ever moved to the returned coordinator (peers follow the
    # highest term). It normally follows as a standby and leaves with the run; under heavy load its
    # DHT lookup has missed the live record, and then it runs as a term-0 coordinator nobody follows.
    back_text = "".join(back.lines)
    assert "took over" not in back_text
    endpoint = re.search(r"coordinator gRPC: (\S+)", back_text)
    if endpoint is not None:
        assert not any(endpoint.group(1) in "".join(peer.lines) for peer in peers)
    else:
        assert swarm.wait(back, 120) == 0, "".join(back.lines)[-3000:]
        assert "standby for run" in "".join(back.lines)
    assert old_key != standby_key.peer_id


def test_an_endpoint_signing_with_another_key_is_refused(swarm, tmp_path):
    """An impostor serves the same run config under its own key at another address (a DNS answer,
    a proxy, a stale --coordinator). A peer that found the run in the DHT, and a peer given
    --coordinator-key, refuse it; the same peer pinned on the impostor's own key is accepted
    (control: the refusal is the key, nothing else)."""
    config = write_run_config(tmp_path / "run.json", rounds={"rounds": 1, "min_peers": 1})
    real = swarm.start_coordinator(["--config", str(config)])
    real_key = wait_line(real, r"coordinator fingerprint: (\w+)", 30).group(1)
    impostor_swarm = Swarm(tmp_path / "impostor")
    try:
        impostor = impostor_swarm.start_coordinator(["--config", str(config)])
        impostor_key = wait_line(impostor, r"coordinator fingerprint: (\w+)", 30).group(1)
        assert impostor_key != real_key

        dht_peer = swarm.start_peer("via-dht", ["--coordinator", impostor_swarm.coordinator_endpoint])  # + --initial-peers
        pinned_peer = swarm.start_peer("pinned", ["--coordinator-key", real_key], via_dht=False)
        pinned_peer_args = pinned_peer  # dials the real coordinator: the control below dials the impostor
        wrong = swarm._spawn("pinned-to-real", ["peer", "--coordinator", impostor_swarm.coordinator_endpoint, "--coordinator-key",
                                                real_key, "--identity-path", str(swarm.workdir / "p3.pem"), "--host", "127.0.0.1"])
        control = swarm._spawn("pinned-to-impostor", ["peer", "--coordinator", impostor_swarm.coordinator_endpoint,
                                                      "--coordinator-key", impostor_key, "--identity-path", str(swarm.workdir / "p4.pem"),
                                                      "--host", "127.0.0.1", "--threads", "1"])
        for refused in (dht_peer, wrong):
            assert swarm.wait(refused, 90) == 1, "".join(refused.lines)[-2000:]
            text = "".join(refused.lines)
            assert "is not the run's coordinator" in text and impostor_key[:16] in text, text[-2000:]
        assert swarm.wait(control, 120) == 0, "".join(control.lines)[-2000:]
        assert swarm.wait(pinned_peer_args, 120) == 0, "".join(pinned_peer_args.lines)[-2000:]
    finally:
        impostor_swarm.stop_all()
