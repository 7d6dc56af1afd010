"""Linux network namespaces joined by a bridge, with shaped links: the testbed of
scripts/wan_emulation.py and scripts/preflight_netns.py.

    swl<pid>-hub: bridge br0 -- veth h<i>  <->  eth0 in swl<pid>-n<i>: 10.77.0.<i+1>/24

Bandwidth: a `tbf` qdisc on every node's eth0 (its uplink) and on its hub-side veth (its
downlink), burst 32 KiB (> the MTU), so each node has a symmetric link of the rate. Latency: `tc
netem` where the kernel has it, else `delay_mode = "proxy"` (the caller puts scripts/delay_proxy.py in
front of each gRPC port, on the node's proxy address). Everything it creates is deleted by
`close()`; the host's own network namespace is never touched.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUBNET = "10.77.0"
# How the nodes' processes share this machine's cores (Linux schedules by group before by thread;
# with sched_autogroup_enabled, each session is a group):
#   per-node  each node its own session, so its own group: every busy node gets an equal share of
#             the cores, and a node's thread priorities act only inside its share (as on a machine
#             of 1/N of these cores);
#   shared    every node in the caller's session: all threads compete by their own priorities, so a
#             node's exchange at normal priority runs before any node's lowered training thread (as
#             on a volunteer's own machine, where the exchange competes only with its own training).
CPU_GROUPS = ("per-node", "shared")
BURST = "32kb"


class NetnsError(RuntimeError):
    pass


def run_ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if check and result.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


class Testbed:
    """The namespaces, bridge, veths and qdiscs of one emulation; `close()` deletes all of it."""

    def __init__(self, nodes: int, *, rate_mbit: float, rtt_ms: float, cpu_groups: str = "per-node") -> None:
        if cpu_groups not in CPU_GROUPS:
            raise ValueError(f"cpu_groups {cpu_groups!r}: use one of {', '.join(CPU_GROUPS)}")
        self.cpu_groups = cpu_groups
        self.prefix = f"swl{os.getpid()}"
        self.hub = f"{self.prefix}-hub"
        self.names = [f"{self.prefix}-n{i}" for i in range(nodes)]
        self.rate_mbit, self.rtt_ms = rate_mbit, rtt_ms
        self.created: list[str] = []
        self.processes: list[subprocess.Popen] = []
        self.delay_mode = "none"

    def ip_of(self, i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    def proxy_ip_of(self, i: int) -> str:
        return f"{SUBNET}.{i + 101}"

    def up(self) -> None:
        for ns in [self.hub, *self.names]:
            run_ip("netns", "add", ns)
            self.created.append(ns)
            run_ip("-n", ns, "link", "set", "lo", "up")
        run_ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        run_ip("-n", self.hub, "link", "set", "br0", "up")
        netem = self.rtt_ms > 0 and netem_available(self.names[0])
        self.delay_mode = "netem" if netem else ("proxy" if self.rtt_ms > 0 else "none")
        for i, ns in enumerate(self.names):
            veth = f"h{i}"
            run_ip("-n", self.hub, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            run_ip("-n", self.hub, "link", "set", veth, "master", "br0")
            run_ip("-n", self.hub, "link", "set", veth, "up")
            run_ip("-n", ns, "addr", "add", f"{self.ip_of(i)}/24", "dev", "eth0")
            if self.delay_mode == "proxy":
                run_ip("-n", ns, "addr", "add", f"{self.proxy_ip_of(i)}/24", "dev", "eth0")
            run_ip("-n", ns, "link", "set", "eth0", "up")
            if self.rate_mbit > 0:
                for where, dev in ((ns, "eth0"), (self.hub, veth)):  # uplink, downlink
                    tbf = ["tbf", "rate", f"{self.rate_mbit}mbit", "burst", BURST, "latency", "200ms"]
                    if netem:  # netem for delay (half the RTT per direction), tbf below it for rate
                        self._tc(where, "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem", "delay", f"{self.rtt_ms / 2}ms")
                        self._tc(where, "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", *tbf)
                    else:
                        self._tc(where, "qdisc", "add", "dev", dev, "root", *tbf)

    def _tc(self, ns: str, *args: str) -> None:
        result = subprocess.run(["ip", "netns", "exec", ns, "tc", *args], capture_output=True, text=True, timeout=20)
        if result.returncode != 0:
            raise NetnsError(f"tc {' '.join(args)} in {ns}: {result.stderr.strip()}")

    def spawn(self, i: int, argv: list[str], log_path: Path) -> subprocess.Popen:
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
        log = open(log_path, "w")
        process = subprocess.Popen(["ip", "netns", "exec", self.names[i], *argv], stdout=log, stderr=subprocess.STDOUT,
                                   env=env, cwd=ROOT,
                                   # a process group of its own either way: close() kills the whole group
                                   **({"start_new_session": True} if self.cpu_groups == "per-node" else {"process_group": 0}))
        self.processes.append(process)
        return process

    def close(self) -> None:
        """Kill every process this testbed started (their whole groups), then delete the namespaces."""
        for process in self.processes:
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 5
        for process in self.processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.processes.clear()
        for ns in reversed(self.created):
            run_ip("netns", "del", ns, check=False)
        self.created.clear()


def netem_available(ns: str) -> bool:
    probe = subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
                           capture_output=True, text=True, timeout=20)
    if probe.returncode == 0:
        subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", "lo", "root"], capture_output=True, timeout=20)
    return probe.returncode == 0


def namespaces_permitted() -> str:
    """'' when this process may create network namespaces and tbf qdiscs, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root (run with sudo)"
    name = f"swl{os.getpid()}-probe"
    try:
        run_ip("netns", "add", name)
    except (NetnsError, OSError, subprocess.SubprocessError) as exc:
        return f"cannot create a network namespace here: {exc}"
    try:
        tbf = subprocess.run(["ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", "100mbit",
                              "burst", BURST, "latency", "50ms"], capture_output=True, text=True, timeout=20)
        if tbf.returncode != 0:
            return f"tc tbf is not available: {tbf.stderr.strip()}"
        return ""
    finally:
        run_ip("netns", "del", name, check=False)


_SINK = """
import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", 31999)); s.listen(1)
c, _ = s.accept(); n, t0 = 0, None
while (d := c.recv(1 << 16)):
    t0 = t0 or time.monotonic(); n += len(d)
print(n * 8 / (time.monotonic() - t0) / 1e6)
"""
_SOURCE = """
import socket, sys, time
for _ in range(100):
    try:
        c = socket.create_connection((sys.argv[1], 31999)); break
    except OSError:
        time.sleep(0.05)
c.sendall(b"x" * (16 << 20)); c.close()
"""


def measure_link_mbit(bed: Testbed, src: int, dst: int) -> float:
    """Raw TCP throughput from node src to node dst (16 MiB): checks that the shaping holds."""
    sink = subprocess.Popen(["ip", "netns", "exec", bed.names[dst], sys.executable, "-c", _SINK], stdout=subprocess.PIPE, text=True)
    try:
        subprocess.run(["ip", "netns", "exec", bed.names[src], sys.executable, "-c", _SOURCE, bed.ip_of(dst)], timeout=60, check=True)
        out, _ = sink.communicate(timeout=60)
        return float(out.strip())
    finally:
        if sink.poll() is None:
            sink.kill()


class HostLink:
    """One network namespace tied to the host's own namespace by a veth pair, for a swarm that runs
    on the host with a single node inside (scripts/chaos.py's partitioned peer):

        host: <prefix>-h  HOST_IP/24   <->   eth0 in <prefix>-ns: NODE_IP/24

    The host's processes listen on HOST_IP (reachable locally and from the namespace); `cut()`
    takes the namespace's end down (its node loses the swarm, the host keeps HOST_IP) and
    `heal()` brings it back. `close()` deletes the veth and the namespace."""

    HOST_IP, NODE_IP = "10.78.0.1", "10.78.0.2"

    def __init__(self, prefix: str | None = None) -> None:
        self.prefix = prefix or f"swl{os.getpid()}"
        self.ns, self.veth = f"{self.prefix}-ns", f"{self.prefix}-h"
        self.created = False

    def up(self) -> None:
        run_ip("netns", "add", self.ns)
        self.created = True
        run_ip("link", "add", self.veth, "type", "veth", "peer", "name", "eth0", "netns", self.ns)
        run_ip("addr", "add", f"{self.HOST_IP}/24", "dev", self.veth)
        run_ip("link", "set", self.veth, "up")
        run_ip("-n", self.ns, "addr", "add", f"{self.NODE_IP}/24", "dev", "eth0")
        run_ip("-n", self.ns, "link", "set", "eth0", "up")
        run_ip("-n", self.ns, "link", "set", "lo", "up")

    def cut(self) -> None:
        run_ip("-n", self.ns, "link", "set", "eth0", "down")

    def heal(self) -> None:
        run_ip("-n", self.ns, "link", "set", "eth0", "up")

    def close(self) -> None:
        if self.created:
            run_ip("link", "del", self.veth, check=False)
            run_ip("netns", "del", self.ns, check=False)
            self.created = False


CLONE_NEWNET = 0x40000000


def enter_namespace(name: str) -> None:
    """Move this (still single-threaded) process into the network namespace `name` (setns(2));
    what it starts afterwards lives there too."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise NetnsError(f"setns into {name}: {os.strerror(ctypes.get_errno())} (needs root)")
    finally:
        os.close(fd)
