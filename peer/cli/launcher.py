"""Start a coordinator and peers as real processes on loopback; always clean them up.

Used by `swarmloco demo` and by the integration tests. Each child runs in its own session
(process group) so that stopping it also stops what it started (hivemind's p2pd daemon), and
nothing is left running or bound, also when the caller fails or is interrupted.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

MADDR_RE = re.compile(r"--initial-peers (\S+)")
GRPC_RE = re.compile(r"coordinator gRPC: (\S+)")


@dataclass
class Child:
    name: str
    process: subprocess.Popen
    log_path: Path
    lines: list[str] = field(default_factory=list)

    def alive(self) -> bool:
        return self.process.poll() is None


class Swarm:
    def __init__(self, workdir: str | Path, *, echo: bool = False) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.echo = echo
        self.children: list[Child] = []
        self.initial_peers: list[str] = []
        self.coordinator_endpoint = ""
        self._lock = threading.Lock()

    def _spawn(self, name: str, args: list[str], module: str = "peer.cli.main") -> Child:
        log_path = self.workdir / f"{name}.log"
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        process = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,  # own process group: killpg reaches p2pd too
        )
        child = Child(name, process, log_path)
        with self._lock:
            self.children.append(child)
        threading.Thread(target=self._pump, args=(child,), daemon=True).start()
        return child

    def _pump(self, child: Child) -> None:
        with open(child.log_path, "w") as log:
            for line in child.process.stdout:  # type: ignore[union-attr]
                child.lines.append(line)
                log.write(line)
                log.flush()
                if self.echo and _worth_echoing(line):
                    print(line, end="", flush=True)

    def start_coordinator(self, extra: list[str], timeout_s: float = 90.0) -> Child:
        args = ["coordinator", "--port", "0", "--host", "127.0.0.1", "--host-maddrs", "/ip4/127.0.0.1/tcp/0",
                "--identity-path", str(self.workdir / "coordinator.pem"), "--summary-json", str(self.workdir / "coordinator.json"), *extra]
        child = self._spawn("coordinator", args)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = "".join(child.lines)
            maddrs, grpc_match = MADDR_RE.findall(text), GRPC_RE.search(text)
            if maddrs and grpc_match:
                self.initial_peers, self.coordinator_endpoint = maddrs, grpc_match.group(1)
                return child
            if not child.alive():
                raise RuntimeError(f"coordinator exited early:\n{text[-3000:]}")
            time.sleep(0.1)
        raise TimeoutError(f"coordinator did not print its address within {timeout_s:.0f}s:\n{''.join(child.lines)[-3000:]}")

    def start_peer(self, name: str, extra: list[str], *, via_dht: bool = True, module: str = "peer.cli.main") -> Child:
        """`module`: what `python -m` runs with the `peer` verb's arguments (tests start a
        Byzantine peer from tests/byzantine_peer.py)."""
        where = ["--initial-peers", *self.initial_peers] if via_dht else ["--coordinator", self.coordinator_endpoint]
        args = ["peer", *where, "--host", "127.0.0.1", "--host-maddrs", "/ip4/127.0.0.1/tcp/0",
                "--identity-path", str(self.workdir / f"{name}.pem"), "--summary-json", str(self.workdir / f"{name}.json"),
                "--threads", "1", *extra]
        return self._spawn(name, args, module)

    def kill(self, child: Child, sig: int = signal.SIGKILL) -> None:
        try:
            os.killpg(child.process.pid, sig)
        except ProcessLookupError:
            pass

    def wait(self, child: Child, timeout_s: float) -> int:
        return child.process.wait(timeout=timeout_s)

    def stop_all(self, grace_s: float = 5.0) -> None:
        """SIGTERM every child's group, then SIGKILL what is left; never raises."""
        with self._lock:
            children = list(self.children)
        for child in children:
            if child.alive():
                self.kill(child, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in children:
            try:
                child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for child in children:
            self.kill(child, signal.SIGKILL)  # the whole group: stray p2pd daemons included
            try:
                child.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def __enter__(self) -> "Swarm":
        return self

    def __exit__(self, *exc) -> None:
        self.stop_all()


def _worth_echoing(line: str) -> bool:
    return line.startswith(("coordinator", "peer", "  --initial-peers", "swarmloco")) or "Error" in line or "Traceback" in line
