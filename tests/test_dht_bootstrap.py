"""The swarm's way in survives its first node: a node that joined the DHT through another keeps
serving after that node is SIGKILLed, and a fresh node can bootstrap from it (issue #11: the active
coordinator's DHT node is also the swarm's bootstrap address).

Both nodes are started the way the launcher starts coordinators and peers (own session, parent-
death signal), so the test also pins that protocol/lifetime.py ties each DHT to its own process
and not to the node it bootstrapped from."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from protocol import discovery, lifetime
from protocol.identity import Identity
from tests.helpers import ROOT

pytestmark = pytest.mark.integration

NODE = """
import sys
from protocol import discovery
from protocol.identity import Identity
dht = discovery.start_dht(Identity.generate(), initial_peers=sys.argv[1:], host_maddrs=["/ip4/127.0.0.1/tcp/0"], timeout_s=30)
for maddr in discovery.visible_maddrs(dht):
    print("maddr", maddr, flush=True)
print("ready", flush=True)
sys.stdin.read()  # serve until the test closes our stdin or kills us
"""


def _start_node(initial_peers: list[str]) -> tuple[subprocess.Popen, list[str]]:
    process = subprocess.Popen(
        [sys.executable, "-c", NODE, *initial_peers], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True, preexec_fn=lifetime.preexec_for_child(),
    )
    maddrs, lines = [], []
    for line in process.stdout:  # type: ignore[union-attr]
        lines.append(line)
        if line.startswith("maddr "):
            maddrs.append(line.split()[1])
        if line.startswith("ready"):
            return process, maddrs
    raise AssertionError(f"DHT node exited with {process.wait()} before it was ready:\n{''.join(lines)[-3000:]}")


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)  # the node, its DHT process and p2pd
    except ProcessLookupError:
        pass
    process.wait(timeout=10)


def test_a_joined_node_is_a_way_in_after_its_bootstrap_node_is_sigkilled():
    started: list[subprocess.Popen] = []
    fresh = None
    try:
        first, first_maddrs = _start_node([])
        started.append(first)
        joined, joined_maddrs = _start_node(first_maddrs)
        started.append(joined)

        os.kill(first.pid, signal.SIGKILL)  # the node only: its DHT process and p2pd go with it (lifetime.py)
        assert first.wait(timeout=10) == -signal.SIGKILL

        fresh = discovery.start_dht(Identity.generate(), initial_peers=joined_maddrs, host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                                    timeout_s=30)
        assert joined.poll() is None, "the joined node died with the node it bootstrapped from"
        with pytest.raises(discovery.BootstrapUnanswered, match="failed to connect to bootstrap peers"):
            discovery.start_dht(Identity.generate(), initial_peers=first_maddrs, host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                                timeout_s=30)  # control: the killed node's address is dead
    finally:
        if fresh is not None:
            fresh.shutdown()
        for process in started:
            _kill_group(process)
