"""Start a coordinator and peers as real processes on loopback; always clean them up.

Used by `swarmloco demo` and by the integration tests. Each child runs in its own session
(process group), so that a signal meant for it (`kill`, SIGTERM then SIGKILL in `stop_all`)
reaches it and nothing else, and nothing is left running or bound, also when the caller fails or
is interrupted: a child stops its DHT process and p2pd itself, and they die with it when it is
killed (they run in a process group of their own, tied to it by parent-death signals:
protocol/lifetime.py). A launcher that is itself killed (SIGKILL, OOM) takes its children with
it the same way (when the Swarm is driven from the main thread, as the demo and pytest do).

`Swarm(..., prewarmed=True)` forks each child from a process that imported torch and hivemind once
(peer/cli/prewarmed.py): ~5.5 CPU-seconds less per peer, and their memory shared; the tests' swarms,
`swarmloco demo` and scripts/measure_scale.py's storm start that way.

`Swarm(..., tls=True)` runs the whole swarm over TLS with a throwaway CA and one certificate for
127.0.0.1 (`make_loopback_tls`), passed to every child with --tls-cert/--tls-key/--tls-ca.

A launcher fails loudly: `Swarm.failures(peers)` names every peer that never joined (it prints
"peer X | joined run ..." once admitted) or exited with an error the swarm did not cause (a kill
through `Swarm.kill` is the caller's), with its last words and its log; `Swarm.check(peers)`
raises SwarmFailed with them. `swarmloco demo` and scripts/measure_scale.py exit non-zero on it.
"""

from __future__ import annotations

import ipaddress
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from peer.cli import prewarmed
from protocol import lifetime

MADDR_RE = re.compile(r"--initial-peers (\S+)")
GRPC_RE = re.compile(r"coordinator gRPC: (\S+)")
PUMP_DRAIN_S = 10.0  # Swarm.wait: at most this long for an exited child's output to be read to EOF
JOINED_RE = re.compile(r"^peer \S+ \| joined run ")  # peer/node/node.py prints it at its first accepted join


@dataclass
class Child:
    name: str
    process: subprocess.Popen | prewarmed.PrewarmedProcess
    log_path: Path
    lines: list[str] = field(default_factory=list)
    role: str = "peer"  # or "coordinator", "standby"
    joined: bool = False  # a peer: it printed its first accepted join
    killed: bool = False  # signalled through Swarm.kill: how it ends is the caller's doing
    pump: threading.Thread | None = None  # copies its output into `lines` and its log until EOF

    def alive(self) -> bool:
        return self.process.poll() is None

    def last_words(self) -> str:
        """Its error line when it printed one (`swarmloco peer: ...`, a Traceback's last line), else its last line."""
        lines = [line.strip() for line in self.lines if line.strip()]
        said = [line for line in lines if line.startswith("swarmloco ") and ":" in line]
        return (said or lines or ["(no output)"])[-1][:400]


class SwarmFailed(RuntimeError):
    """Peers a launcher started never joined, or exited with an error; the message names each."""


@dataclass(frozen=True)
class TlsFiles:
    """PEM files: a CA certificate, and a certificate it signed with its private key."""

    ca: Path
    cert: Path
    key: Path

    def flags(self) -> list[str]:
        return ["--tls-cert", str(self.cert), "--tls-key", str(self.key), "--tls-ca", str(self.ca)]


def make_loopback_tls(folder: str | Path, *, name: str = "swarmloco loopback") -> TlsFiles:
    """A throwaway CA (ca.pem) and a certificate for 127.0.0.1 and localhost signed by it
    (cert.pem, key.pem), valid for a day: for swarms on one machine (demo --tls, tests)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.now(timezone.utc)

    def certificate(subject: str, key, issuer: x509.Name | None, issuer_key, *, ca: bool) -> x509.Certificate:
        subject_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
        builder = (x509.CertificateBuilder().subject_name(subject_name).issuer_name(issuer or subject_name)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - timedelta(hours=1)).not_valid_after(now + timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if ca:
            builder = builder.add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                                          key_encipherment=False, data_encipherment=False, key_agreement=False,
                                                          encipher_only=False, decipher_only=False), critical=True)
        else:
            builder = (builder.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                                          x509.DNSName("localhost")]), critical=False)
                       .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
        return builder.sign(issuer_key, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_cert = certificate(f"{name} CA", ca_key, None, ca_key, ca=True)
    cert = certificate("127.0.0.1", key, ca_cert.subject, ca_key, ca=False)
    files = TlsFiles(folder / "ca.pem", folder / "cert.pem", folder / "key.pem")
    files.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.key.touch(mode=0o600)
    files.key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return files


class Swarm:
    def __init__(self, workdir: str | Path, *, echo: bool = False, tls: bool = False, prewarmed: bool = False) -> None:
        self.workdir = Path(workdir)
        self.prewarmed = prewarmed
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.echo = echo
        self.tls = make_loopback_tls(self.workdir / "tls") if tls else None
        self.children: list[Child] = []
        self.initial_peers: list[str] = []
        self.coordinator_endpoint = ""
        self._lock = threading.Lock()

    def prewarm(self) -> None:
        """Start the fork server now (prewarmed swarms), not at the first child: a benchmark that
        measures the swarm's memory or time from here on leaves the server's own out of it."""
        if self.prewarmed:
            prewarmed.shared_server(self._child_env())

    @staticmethod
    def _child_env() -> dict[str, str]:
        return dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")

    def _spawn(self, name: str, args: list[str], module: str = "peer.cli.main", role: str = "peer") -> Child:
        log_path = self.workdir / f"{name}.log"
        env = self._child_env()
        server = prewarmed.shared_server(env) if self.prewarmed else None
        if server is not None:  # forked from a process that imported torch and hivemind once
            process: subprocess.Popen | prewarmed.PrewarmedProcess = server.spawn(module, args, env)
        else:
            process = subprocess.Popen(
                [sys.executable, "-m", module, *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
                start_new_session=True,  # own process group: a terminal's Ctrl+C to ours is not sent to it
                preexec_fn=lifetime.preexec_for_child(),  # and it dies with us, however we die
            )
        child = Child(name, process, log_path, role=role)
        with self._lock:
            self.children.append(child)
        child.pump = threading.Thread(target=self._pump, args=(child,), daemon=True)
        child.pump.start()
        return child

    def _pump(self, child: Child) -> None:
        with open(child.log_path, "w") as log:
            for line in child.process.stdout:  # type: ignore[union-attr]
                child.lines.append(line)
                if not child.joined and JOINED_RE.match(line):
                    child.joined = True
                log.write(line)
                log.flush()
                if self.echo and _worth_echoing(line):
                    print(line, end="", flush=True)

    def start_coordinator(self, extra: list[str], timeout_s: float = 90.0) -> Child:
        args = ["coordinator", "--port", "0", "--host", "127.0.0.1", "--host-maddrs", "/ip4/127.0.0.1/tcp/0",
                "--identity-path", str(self.workdir / "coordinator.pem"), "--summary-json", str(self.workdir / "coordinator.json"),
                *self._tls_flags(), *extra]
        child = self._spawn("coordinator", args, role="coordinator")
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

    def start_standby(self, name: str, extra: list[str]) -> Child:
        """A standby coordinator (`coordinator --standby`) of the running swarm, with its own identity
        and checkpoint; it serves gRPC only once it takes over."""
        args = ["coordinator", "--standby", "--initial-peers", *self.initial_peers, "--host", "127.0.0.1",
                "--host-maddrs", "/ip4/127.0.0.1/tcp/0", "--identity-path", str(self.workdir / f"{name}.pem"),
                "--checkpoint", str(self.workdir / f"{name}.ckpt"), "--summary-json", str(self.workdir / f"{name}.json"),
                *self._tls_flags(), *extra]
        return self._spawn(name, args, role="standby")

    def _tls_flags(self) -> list[str]:
        return self.tls.flags() if self.tls is not None else []

    def start_peer(self, name: str, extra: list[str], *, via_dht: bool = True, module: str = "peer.cli.main", tls: bool = True) -> Child:
        """`module`: what `python -m` runs with the `peer` verb's arguments (tests start a
        Byzantine peer from tests/byzantine_peer.py). `tls=False`: without the swarm's TLS flags."""
        where = ["--initial-peers", *self.initial_peers] if via_dht else ["--coordinator", self.coordinator_endpoint]
        args = ["peer", *where, "--host", "127.0.0.1", "--host-maddrs", "/ip4/127.0.0.1/tcp/0",
                "--identity-path", str(self.workdir / f"{name}.pem"), "--summary-json", str(self.workdir / f"{name}.json"),
                "--threads", "1", *(self._tls_flags() if tls else []), *extra]
        return self._spawn(name, args, module)

    def kill(self, child: Child, sig: int = signal.SIGKILL) -> None:
        child.killed = child.killed or child.alive()  # a signal to a live child: its exit is ours
        try:
            os.killpg(child.process.pid, sig)
        except ProcessLookupError:
            pass

    def wait(self, child: Child, timeout_s: float) -> int:
        """Its exit status, once it has exited and its last lines are in `child.lines`: the exit is
        seen before the pump has read what the process wrote just before it (a fail point's line
        right before its SIGKILL was missing once, beside a CPU hog). The pump ends at EOF, when
        no process holds the pipe any more (a leftover grandchild could hold it: PUMP_DRAIN_S bounds that)."""
        code = child.process.wait(timeout=timeout_s)
        if child.pump is not None:
            child.pump.join(timeout=PUMP_DRAIN_S)
        return code

    def failures(self, children: list[Child] | None = None) -> list[str]:
        """One line per peer (of `children`, default: every peer started) that never joined, exited
        with an error nobody sent it, or is still running: its name, exit status, last words and log."""
        with self._lock:
            peers = [c for c in (self.children if children is None else children) if c.role == "peer"]
        out = []
        for child in peers:
            code = child.process.poll()
            status = "still running" if code is None else f"exit {code}"
            if not child.joined:
                out.append(f"{child.name} never joined ({status}: {child.last_words()}; log: {child.log_path})")
            elif code is None:
                out.append(f"{child.name} is still running (log: {child.log_path})")
            elif code != 0 and not child.killed:
                out.append(f"{child.name} exited with an error ({status}: {child.last_words()}; log: {child.log_path})")
        return out

    def check(self, children: list[Child] | None = None) -> None:
        """Raise SwarmFailed naming the peers `failures` finds."""
        failed = self.failures(children)
        if failed:
            with self._lock:
                started = sum(1 for c in (self.children if children is None else children) if c.role == "peer")
            raise SwarmFailed(f"{len(failed)} of {started} peers failed:\n  " + "\n  ".join(failed))

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
            self.kill(child, signal.SIGKILL)  # its DHT process and p2pd follow on their parent-death signals
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
