"""Ctrl+C (SIGINT to the process group, as a terminal sends it) and SIGTERM end a coordinator, a
standby and a peer within seconds, with their DHT process and p2pd, in the phases a run has: an
idle coordinator, a peer in the middle of a round, a standby following, a coordinator whose peer
left mid-round. A second Ctrl+C during a shutdown exits at once. A second coordinator whose DHT or
gRPC port is taken is refused at startup and leaves the first one running.

Phases are reached through fault hooks (peer/run/faults.py) and printed lines, never timers."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from peer.cli.status import fetch_status
from protocol.identity import Identity
from protocol.ports import ListenAddress, in_use
from tests.helpers import ROOT, cmdline, free_port, kill_tree, process_tree, still_running, wait_line, write_run_config

pytestmark = [pytest.mark.integration, pytest.mark.exec_processes,  # reads its children's command lines
              pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process trees from /proc (Linux)")]
# The bound. Most of a stop used to be the interpreter's finalization after everything was
# closed (torch's and gRPC's modules: 2-3 s at load 10, > 10 s at load 35-117) and torch_shm_manager
# outliving the process by 2.5 s; a CLI process now ends at once when its main returns
# (peer/cli/interrupts.py, skip_finalization) and hivemind shares memory without that helper
# (protocol/discovery.py). Measured 0.1-0.8 s to a whole tree gone (benchmarks/exits.md); every
# shutdown step is bounded (lease 1 s, gRPC 3 s, DHT 5 s) in case one hangs.
EXIT_WITHIN_S = 10.0
GONE_WITHIN_S = 5.0  # after the process exits: p2pd ends on its parent's death signal, at once


def _stops_cleanly(swarm, child, sig: int = signal.SIGINT) -> None:
    """Send `sig` to `child`'s process group; it exits within EXIT_WITHIN_S with 128 + sig and
    leaves none of its processes (DHT process, p2pd) running."""
    tree = process_tree(child.process.pid)
    commands = [cmdline(pid) for pid in tree]
    # The process itself, its forked DHT process (same command line) and hivemind's p2pd; forked
    # from the prewarmed server, the first two carry the server's command line.
    module = "peer.cli.prewarmed" if swarm.prewarmed else "peer.cli.main"
    assert sum(module in c for c in commands) >= 2 and any("p2pd" in c for c in commands), commands
    try:
        swarm.kill(child, sig)
        try:
            code = swarm.wait(child, EXIT_WITHIN_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{child.name} still running {EXIT_WITHIN_S:.0f} s after {signal.Signals(sig).name}:\n"
                                 + "".join(child.lines)[-3000:]) from None
        assert code == 128 + sig, "".join(child.lines)[-3000:]
        assert "interrupted: stopped cleanly" in "".join(child.lines)
        left = still_running(tree, GONE_WITHIN_S)
        assert not left, f"left running after {child.name} exited: {left}"
    finally:
        kill_tree(tree)


def test_ctrl_c_stops_an_idle_coordinator(swarm, tmp_path):
    config = write_run_config(tmp_path / "run.json", rounds={"rounds": 3, "expected_peers": 2})
    coordinator = swarm.start_coordinator(["--config", str(config)])
    _stops_cleanly(swarm, coordinator)


def test_ctrl_c_stops_a_coordinator_forked_as_the_demo_starts_it(tmp_path):
    """`swarmloco demo` forks its processes from the prewarmed server: Ctrl+C ends one as it ends
    an exec'd one, exit status and all, with its DHT process and p2pd."""
    from peer.cli.launcher import Swarm

    config = write_run_config(tmp_path / "run.json", rounds={"rounds": 3, "expected_peers": 2})
    with Swarm(tmp_path / "forked", prewarmed=True) as swarm:
        _stops_cleanly(swarm, swarm.start_coordinator(["--config", str(config)]))


def test_ctrl_c_stops_a_peer_mid_round_a_following_standby_and_a_coordinator_whose_peer_left(swarm, tmp_path, monkeypatch):
    """One swarm, stopped role by role: the peer while it holds round 1 open (a fault hook parks it
    after training, before it commits), then the standby that follows the run, then the
    coordinator, its round 1 still open and its only peer gone."""
    standby_key = Identity.load_or_create(swarm.workdir / "standby.pem")
    config = write_run_config(tmp_path / "run.json", rounds={"rounds": 50, "expected_peers": 1})
    coordinator = swarm.start_coordinator(["--config", str(config), "--coordinators", standby_key.peer_id])
    standby = swarm.start_standby("standby", ["--port", str(free_port())])
    with monkeypatch.context() as m:
        m.setenv("SWARMLOCO_FAIL_AT", "trained:1:delay=600")
        peer = swarm.start_peer("peer", [])
    wait_line(peer, r"reached trained:1, sleeping", 120)
    wait_line(standby, r"following run \S+'s active coordinator", 60)

    _stops_cleanly(swarm, peer)
    _stops_cleanly(swarm, standby)
    status = fetch_status(swarm.coordinator_endpoint)
    assert status["round"] >= 1 and not status["finished"]  # round 0 closed; the one open now has lost its peer
    _stops_cleanly(swarm, coordinator)


def test_a_second_coordinator_on_a_taken_port_is_refused_and_sigterm_stops_the_first(swarm, tmp_path):
    dht_port, grpc_port = free_port(), free_port()
    config = write_run_config(tmp_path / "run.json", rounds={"rounds": 3, "expected_peers": 2})
    first = swarm.start_coordinator(["--config", str(config), "--port", str(grpc_port),
                                     "--host-maddrs", f"/ip4/127.0.0.1/tcp/{dht_port}"])

    def second(*flags: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "peer.cli.main", "coordinator", "--host", "127.0.0.1", "--config", str(config),
                                 "--identity-path", str(tmp_path / "second.pem"), *flags],
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)

    refused = {"DHT": second("--port", "0", "--host-maddrs", f"/ip4/127.0.0.1/tcp/{dht_port}"),  # both at once: each imports torch
               "gRPC": second("--port", str(grpc_port), "--host-maddrs", "/ip4/127.0.0.1/tcp/0")}
    try:
        errors = {what: process.communicate(timeout=60)[1] for what, process in refused.items()}
    finally:
        for process in refused.values():
            process.kill()
            process.wait()
    for (what, process), port, flag in zip(refused.items(), (dht_port, grpc_port), ("--host-maddrs", "--port")):
        assert process.returncode == 1, errors[what][-3000:]
        assert f"{what} port {port} is already in use by another process" in errors[what] and flag in errors[what]
        assert "Traceback" not in errors[what]

    assert fetch_status(swarm.coordinator_endpoint)["round"] == 0  # the first one is unaffected
    _stops_cleanly(swarm, first, signal.SIGTERM)
    assert not in_use(ListenAddress("127.0.0.1", dht_port)) and not in_use(ListenAddress("127.0.0.1", grpc_port))


SLOW_SHUTDOWN = """
import threading
from peer.cli import interrupts
stopping = threading.Event()
interrupts.install(stopping.set)
print("ready", flush=True)
stopping.wait()
print("stopping", flush=True)
threading.Event().wait()  # a shutdown that would never end
"""


def test_a_second_ctrl_c_during_shutdown_exits_at_once(tmp_path):
    process = subprocess.Popen([sys.executable, "-c", SLOW_SHUTDOWN], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    try:
        assert process.stdout.readline() == "ready\n"
        process.send_signal(signal.SIGINT)
        assert process.stdout.readline() == "stopping\n"  # the first one asked for a shutdown, which hangs
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=EXIT_WITHIN_S) == 130
        assert "SIGINT again: exiting now" in process.stderr.read()
    finally:
        process.kill()
        process.wait()


def test_only_fixed_ip_ports_of_multiaddrs_are_checked():
    from protocol.ports import listen_addresses

    assert listen_addresses(["/ip4/0.0.0.0/tcp/31337", "/ip4/127.0.0.1/tcp/0", "/ip6/::/udp/4001/quic", "/dns/example.org/tcp/80"]) \
        == [ListenAddress("0.0.0.0", 31337), ListenAddress("::", 4001, "udp")]
