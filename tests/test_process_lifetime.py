"""Every process the project forks dies with its parent, whatever kills the parent: a SIGKILLed
coordinator and a SIGKILLed DHT-joined peer leave no DHT process and no p2pd daemon behind, and
their DHT and gRPC ports can be bound again; a SIGKILLed launcher takes its swarm with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from peer.cli.launcher import Swarm
from peer.cli.status import fetch_status
from protocol.ports import ListenAddress, in_use
from tests.helpers import ROOT, cmdline, free_port, kill_tree, process_tree, still_running, write_run_config

pytestmark = pytest.mark.integration
GONE_WITHIN_S = 20.0  # the parent-death signal acts at once; the watchdog within a second


def _bindable(port: int) -> bool:
    """Can a listener bind 127.0.0.1:port (without SO_REUSEPORT, which p2pd uses to share it)?"""
    return not in_use(ListenAddress("127.0.0.1", port))


def _wait_until_gone(processes: dict[int, int], ports: list[int]) -> tuple[dict[int, str], list[int]]:
    alive = still_running(processes, GONE_WITHIN_S)
    deadline = time.monotonic() + GONE_WITHIN_S
    while (held := [port for port in ports if not _bindable(port)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive, held


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process trees from /proc (Linux)")
def test_sigkilled_coordinator_and_peer_leave_no_process_and_free_their_ports(tmp_path):
    ports = {name: free_port() for name in ("coordinator DHT", "coordinator gRPC", "peer DHT", "peer gRPC")}
    # Two expected peers and one started: the round never closes while the test looks.
    config = write_run_config(tmp_path / "run.json", rounds={"rounds": 5, "expected_peers": 2})
    trees: dict[int, int] = {}
    with Swarm(tmp_path / "swarm") as swarm:  # on failure, stops every child's process group (orphans too)
        try:
            coordinator = swarm.start_coordinator(["--config", str(config), "--port", str(ports["coordinator gRPC"]),
                                                   "--host-maddrs", f"/ip4/127.0.0.1/tcp/{ports['coordinator DHT']}"])
            peer = swarm.start_peer("peer", ["--port", str(ports["peer gRPC"]),
                                             "--host-maddrs", f"/ip4/127.0.0.1/tcp/{ports['peer DHT']}"])
            deadline = time.monotonic() + 120
            while not fetch_status(swarm.coordinator_endpoint)["peers"]:  # the peer joined: its DHT is up
                assert peer.alive() and time.monotonic() < deadline, "".join(peer.lines)[-3000:]
                time.sleep(0.2)
            for child in (coordinator, peer):
                tree = process_tree(child.process.pid)
                commands = [cmdline(pid) for pid in tree]
                # The process itself, its forked DHT process (same command line) and hivemind's p2pd.
                assert sum("peer.cli.main" in c for c in commands) >= 2 and any("p2pd" in c for c in commands), commands
                trees.update(tree)
            assert not any(_bindable(port) for port in ports.values())

            os.kill(coordinator.process.pid, signal.SIGKILL)  # the process only, not its group: nothing cleans up
            os.kill(peer.process.pid, signal.SIGKILL)
            alive, held = _wait_until_gone(trees, list(ports.values()))
            assert not alive, f"left running {GONE_WITHIN_S:.0f} s after SIGKILL: {alive}"
            assert not held, f"ports still bound: {[name for name, port in ports.items() if port in held]}"
        finally:
            kill_tree(trees)


LAUNCHER = """
import sys, threading
from peer.cli.launcher import Swarm
swarm = Swarm(sys.argv[1])
coordinator = swarm.start_coordinator(["--config", sys.argv[2]])
print("coordinator pid", coordinator.process.pid, flush=True)
threading.Event().wait()  # until killed
"""


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process trees from /proc (Linux)")
def test_a_sigkilled_launcher_takes_its_swarm_with_it(tmp_path):
    """`swarmloco demo` (or a test) killed outright: the coordinator it started, in its own
    session, dies too, and with it its DHT process and p2pd."""
    config = write_run_config(tmp_path / "run.json", rounds={"rounds": 5, "expected_peers": 2})
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(tmp_path / "swarm"), str(config)], cwd=ROOT,
                                stdout=subprocess.PIPE, text=True)
    trees: dict[int, int] = {}
    try:
        line = launcher.stdout.readline()  # printed once the coordinator printed its addresses
        assert line.startswith("coordinator pid"), line
        trees = process_tree(launcher.pid)
        assert any("p2pd" in cmdline(pid) for pid in trees), [cmdline(pid) for pid in trees]
        launcher.kill()
        launcher.wait(timeout=10)
        alive, _ = _wait_until_gone(trees, [])
        assert not alive, f"left running {GONE_WITHIN_S:.0f} s after the launcher's SIGKILL: {alive}"
    finally:
        launcher.kill()
        kill_tree(trees)
