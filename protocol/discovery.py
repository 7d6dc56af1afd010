"""Discovery through a hivemind DHT: who runs the swarm, and where its peers listen.

Records (all signed with the writer's Ed25519 key, checked by every DHT node through hivemind's
record-validator hook):
  key "swarmloco:runs"                 subkey = coordinator peer_id -> {run_id, endpoint, public_key}
  key "swarmloco:<run_id>:peers"       subkey = peer_id             -> {endpoint, public_key, client_mode, version}
A record's subkey must equal the peer_id of the key that signed it, so nobody can write (or
overwrite) a record in another's name. The signature covers key, subkey, value and expiry.

Start the DHT before any gRPC server or channel in a process: hivemind runs it in a forked
child, and gRPC is not fork-safe.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Sequence

# hivemind shares one small tensor per process with its DHT process (its futures' state). Its default
# strategy, "file_system", starts torch_shm_manager, which outlived a stopped coordinator or peer by
# 2.5 s (load 10; it exits once it notices its clients are gone); file descriptors need no helper
# process. Set before hivemind is imported (it reads this once).
os.environ.setdefault("HIVEMIND_MEMORY_SHARING_STRATEGY", "file_descriptor")
from hivemind.dht import DHT  # noqa: E402
from hivemind.dht.validation import DHTRecord, RecordValidatorBase  # noqa: E402
from hivemind.utils import MSGPackSerializer, get_dht_time  # noqa: E402

from protocol.identity import PUBLIC_KEY_BYTES, SIGNATURE_BYTES, Identity, peer_id_of, verify_signature

RUNS_KEY = "swarmloco:runs"
RECORD_TTL_S = 60.0
RPC_WAIT_S = 5.0  # hivemind's wait for one DHT RPC (its wait_timeout), unless start_dht is given another
SHUTDOWN_GRACE_S = 3.0  # `stop_dht`: the DHT process's own shutdown gets this long, then it is killed
log = logging.getLogger("swarmloco.discovery")
_MAGIC = b"\x00SLC-ED25519\x00"
_SUFFIX = len(_MAGIC) + PUBLIC_KEY_BYTES + SIGNATURE_BYTES


def peers_key(run_id: str) -> str:
    return f"swarmloco:{run_id}:peers"


class DiscoveryError(ConnectionError):
    """The DHT could not be joined or holds nothing usable; the message says what to check."""


class BootstrapUnanswered(DiscoveryError):
    """No initial peer answered this DHT node's bootstrap ping, or its p2pd did not start in time:
    on a loaded machine or while the swarm is still starting, a later attempt may get through."""


class RunNotFound(DiscoveryError):
    """The DHT holds no active coordinator record for the run (yet, or not at this moment: an
    active coordinator's record lapses between two renewals when its machine is overloaded)."""


def _transient_bootstrap(exc: BaseException) -> bool:
    """What hivemind raises when a later try may go through, matched on the message (both are
    plain exception types): its DHTNode's bootstrap pings went unanswered (hivemind/dht/node.py),
    p2pd did not start in time, or p2pd could not connect to the bootstrap peers (not up yet, or
    too busy to answer: hivemind/p2p/p2p_daemon.py passes p2pd's last line on)."""
    from hivemind.p2p import P2PDaemonError

    text = str(exc)
    if isinstance(exc, P2PDaemonError):
        return text.startswith("Daemon failed to start in") or "failed to connect to bootstrap peers" in text
    return isinstance(exc, RuntimeError) and text.startswith("DHTNode bootstrap failed")


def _signed_part(record: DHTRecord, value: bytes) -> bytes:
    return MSGPackSerializer.dumps((record.key, record.subkey, value, record.expiration_time))


class Ed25519RecordValidator(RecordValidatorBase):
    """Signs our own records and refuses any record not signed by its subkey's owner.

    Holds the raw private key bytes (picklable: hivemind ships validators to its DHT process).
    """

    def __init__(self, private_bytes: bytes) -> None:
        self._private_bytes = private_bytes
        self._identity: Identity | None = None

    def _me(self) -> Identity:
        if self._identity is None:
            from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

            self._identity = Identity(Ed25519PrivateKey.from_private_bytes(self._private_bytes))
        return self._identity

    def __getstate__(self) -> dict[str, Any]:
        return {"_private_bytes": self._private_bytes, "_identity": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._private_bytes = state["_private_bytes"]
        self._identity = None

    def sign_value(self, record: DHTRecord) -> bytes:
        me = self._me()
        signature = me.sign(_signed_part(record, record.value))
        return record.value + _MAGIC + me.public_key + signature

    def strip_value(self, record: DHTRecord) -> bytes:
        return record.value[:-_SUFFIX] if len(record.value) >= _SUFFIX else record.value

    def validate(self, record: DHTRecord) -> bool:
        value = record.value
        if len(value) < _SUFFIX or value[-_SUFFIX : -_SUFFIX + len(_MAGIC)] != _MAGIC:
            return False
        public_key = value[-_SUFFIX + len(_MAGIC) : -SIGNATURE_BYTES]
        signature = value[-SIGNATURE_BYTES:]
        try:
            subkey = MSGPackSerializer.loads(record.subkey) if record.subkey else None
        except Exception:
            return False
        if subkey != peer_id_of(public_key):
            return False
        return verify_signature(public_key, signature, _signed_part(record, value[:-_SUFFIX]))

    @property
    def priority(self) -> int:
        return 10  # validate signatures before anything deserializes the value

    def merge_with(self, other: RecordValidatorBase) -> bool:
        return isinstance(other, Ed25519RecordValidator)


def start_dht(
    identity: Identity,
    *,
    initial_peers: Sequence[str] = (),
    host_maddrs: Sequence[str] = ("/ip4/0.0.0.0/tcp/0",),
    announce_maddrs: Sequence[str] = (),
    client_mode: bool = False,
    timeout_s: float = 15.0,
    rpc_wait_s: float = RPC_WAIT_S,
) -> DHT:
    """Start a hivemind DHT node; raise DiscoveryError with advice when initial peers don't answer.

    `rpc_wait_s`: once the node has joined, how long one of its DHT RPCs may go unanswered before the
    node it went to counts as lost (hivemind's wait_timeout: the bootstrap pings keep RPC_WAIT_S, a
    loaded machine's first connections are slow). A call that meets an unreachable node (a peer whose
    link went down, a frozen process) waits this long, once per step of the call (the traversal, the store).

    The node's process and its p2pd daemon end when this process ends, also on SIGKILL; stop them
    with `stop_dht`. A fixed port in `host_maddrs` that another process listens on is refused here,
    before anything starts (protocol/ports.py: p2pd itself would share it)."""
    from cryptography.hazmat.primitives import serialization

    from protocol import lifetime, ports

    ports.check_dht_ports(host_maddrs)

    private_bytes = identity.private_key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    for maddr in initial_peers:
        if not maddr.startswith("/") or "/p2p/" not in maddr:
            raise DiscoveryError(
                f"--initial-peers {maddr!r} is not a full multiaddr like /ip4/1.2.3.4/tcp/31337/p2p/12D3Koo…; "
                "copy the line the coordinator printed"
            )
    dht: DHT | None = None
    try:
        dht = DHT(
            initial_peers=list(initial_peers),
            host_maddrs=list(host_maddrs),
            announce_maddrs=list(announce_maddrs) or None,
            client_mode=client_mode,
            record_validators=[Ed25519RecordValidator(private_bytes)],
            start=False,
            startup_timeout=timeout_s,
            wait_timeout=RPC_WAIT_S,
            num_workers=4,
            shutdown_timeout=SHUTDOWN_GRACE_S,
        )
        # The DHT process and its p2pd die with this process, however it ends (protocol/lifetime.py).
        lifetime.bind_forked_process(dht)
        dht.run_in_background(await_ready=True)
        if rpc_wait_s != RPC_WAIT_S:
            dht.run_coroutine(functools.partial(_set_rpc_wait, rpc_wait_s))
        return dht
    except Exception as exc:  # hivemind raises a variety of errors for unreachable peers
        advice = bootstrap_advice(initial_peers)
        if _transient_bootstrap(exc):
            if dht is not None:
                stop_dht(dht)  # its process ended with the error; whatever is left of it goes now
            raise BootstrapUnanswered(f"no initial peer answered ({', '.join(initial_peers) or 'none given'}): "
                                      f"{str(exc).rstrip('. ')}" + (f"; {advice}" if advice else "")) from None
        raise DiscoveryError(f"cannot start the DHT or reach {', '.join(initial_peers) or 'any peer'}: {str(exc).rstrip('. ')}"
                             + (f"; {advice}" if advice else "")) from None


async def _set_rpc_wait(seconds: float, _dht, node) -> None:
    node.protocol.wait_timeout = seconds  # runs in the DHT process (DHT.run_coroutine)


async def _rpc_wait(_dht, node) -> float:
    return float(node.protocol.wait_timeout)


def rpc_wait_s(dht: DHT) -> float:
    """How long the node's DHT RPCs wait for an answer now (start_dht's rpc_wait_s)."""
    return dht.run_coroutine(_rpc_wait)


def bootstrap_advice(initial_peers: Sequence[str]) -> str:
    """What helps when no --initial-peers address answers: the node being up and its port open to
    this machine. Not --client-mode: that is for a machine nobody can dial, which must still reach these."""
    if not initial_peers:
        return ""
    from protocol import ports

    where = ", ".join(f"{a.host} {a.transport} port {a.port}" for a in ports.listen_addresses(initial_peers)) or "its DHT port"
    return (f"is the coordinator running (or the node you named), and can this machine reach {where}: no firewall in "
            "between, the port forwarded if it is behind NAT? Copy the --initial-peers line it printed, and list several nodes "
            "if you can. (--client-mode does not help here: it is for a machine others cannot dial, and still needs these "
            "addresses reachable.)")


def stop_dht(dht: DHT) -> None:
    """Stop the DHT process and its p2pd within about SHUTDOWN_GRACE_S + 2 s, whatever state they are in.

    hivemind's `shutdown()` asks the process to stop and, after its grace period, terminates it
    (SIGTERM: protocol/lifetime.py gives the DHT process that signal's default action back). A
    process that still lives then is killed: nothing here waits without a bound, and
    multiprocessing's exit handler, which joins the process without one, finds it gone. p2pd ends
    with its DHT process (its parent-death signal, else the DHT process's watchdog)."""
    if dht.pid is None:  # never started
        return
    dht.shutdown()
    dht.join(1.0)
    if dht.is_alive():
        log.warning("the DHT process %d did not stop; killing it", dht.pid)
        dht.kill()
        dht.join(1.0)


def dht_time() -> float:
    """The DHT's clock, which records' expirations are on (the writer's wall clock)."""
    return get_dht_time()


def visible_maddrs(dht: DHT) -> list[str]:
    return [str(m) for m in dht.get_visible_maddrs()]


def _store(dht: DHT, key: str, identity: Identity, value: dict[str, Any], ttl_s: float, *, first_replica: bool = False) -> bool:
    # first_replica: return once one replica stored it (hivemind's await_all_replicas=False), not after
    # every replica answered or timed out (an unreachable one costs hivemind's wait_timeout).
    extra = {"await_all_replicas": False, "await_all_tasks": False} if first_replica else {}
    return bool(
        dht.store(key, json.dumps(value, sort_keys=True).encode(), get_dht_time() + ttl_s, subkey=identity.peer_id, **extra)
    )


def announce_run(
    dht: DHT, identity: Identity, *, run_id: str, endpoint: str, role: str = "active", term: int = 0,
    coordinators: Sequence[str] = (), ttl_s: float = RECORD_TTL_S, first_replica: bool = False,
) -> bool:
    """A coordinator's run record. The active one's doubles as its lease (peer/coordinator/lease.py):
    it is written with a TTL of the lease, which it names (`lease_s`: standbys derive their own
    deadlines from it), and renewed every third of it, so it lapses soon after the coordinator stops."""
    value = {"run_id": run_id, "endpoint": endpoint, "public_key": identity.public_key.hex(), "role": role, "term": term,
             "coordinators": sorted(coordinators), "lease_s": round(float(ttl_s), 3)}
    return _store(dht, RUNS_KEY, identity, value, ttl_s, first_replica=first_replica)


def announce_peer(
    dht: DHT, identity: Identity, *, run_id: str, endpoint: str, client_mode: bool, version: str, ttl_s: float = RECORD_TTL_S
) -> bool:
    value = {"endpoint": endpoint, "public_key": identity.public_key.hex(), "client_mode": client_mode, "version": version}
    return _store(dht, peers_key(run_id), identity, value, ttl_s)


@dataclass(frozen=True, slots=True)
class RunRecord:
    run_id: str
    endpoint: str
    public_key: bytes
    coordinator_id: str
    role: str = "active"  # or "standby": follows the active one, takes over when its lease lapses
    term: int = 0
    coordinators: tuple[str, ...] = ()  # the fingerprints this coordinator's run config lists
    lease_s: float = 0.0  # the record's TTL as its writer set it (an active one's: its lease)
    expires_at: float = 0.0  # when it lapses, in DHT time (dht_time(); 0: not known)


def _entries(dht: DHT, key: str) -> dict[str, tuple[dict[str, Any], float]]:
    """subkey -> (its value, its expiration in DHT time: time.time() of the writer's clock)."""
    found = dht.get(key, latest=True)
    if found is None or not isinstance(found.value, dict):
        return {}
    out = {}
    for subkey, item in found.value.items():
        try:
            out[str(subkey)] = (json.loads(item.value), float(item.expiration_time))
        except (TypeError, ValueError):
            continue
    return out


def run_records(dht: DHT, run_id: str | None = None) -> list[RunRecord]:
    """Every live, well-formed coordinator record (of `run_id`, or of every run)."""
    records = []
    for coordinator_id, (value, expires_at) in _entries(dht, RUNS_KEY).items():
        try:
            record = RunRecord(str(value["run_id"]), str(value["endpoint"]), bytes.fromhex(value["public_key"]), coordinator_id,
                               str(value.get("role", "active")), int(value.get("term", 0)),
                               tuple(str(c) for c in value.get("coordinators", ())), float(value.get("lease_s", 0.0)), expires_at)
        except (KeyError, ValueError, TypeError):
            continue
        if peer_id_of(record.public_key) == coordinator_id and (run_id is None or record.run_id == run_id):
            records.append(record)
    return records


def vouched(records: list[RunRecord], pinned: str | None = None) -> list[RunRecord]:
    """The records of one run whose keys every other record lists as a coordinator of the run (or,
    with `pinned`, the records the pinned key's record lists). A stranger who announces the same
    run id under its own key is listed by nobody, so it never becomes the key a peer pins."""
    if pinned is not None:
        anchor = [r for r in records if r.coordinator_id.startswith(pinned)]
        if not anchor:
            return []
        listed = set(anchor[0].coordinators) | {anchor[0].coordinator_id}
        return [r for r in records if r.coordinator_id in listed]
    return [r for r in records if all(r.coordinator_id in (set(o.coordinators) | {o.coordinator_id}) for o in records)]


def find_run(dht: DHT, run_id: str | None = None, *, timeout_s: float = 15.0, pinned: str | None = None) -> RunRecord:
    """Find the active coordinator of `run_id` (or of the only run on this DHT): among the records
    its coordinators vouch for, the live active one with the highest term (ties: lowest key)."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = run_records(dht, run_id)
        names = sorted({r.run_id for r in records})
        if len(names) > 1:
            raise DiscoveryError(f"this DHT hosts several runs ({', '.join(names)}); choose one with --run-id")
        trusted = vouched(records, pinned)
        active = sorted((r for r in trusted if r.role == "active"), key=lambda r: (-r.term, r.coordinator_id))
        if active:
            return active[0]
        done = [r for r in trusted if r.role == "finished"]
        if done:
            raise DiscoveryError(f"run {done[0].run_id!r} has finished (its coordinator {done[0].coordinator_id[:16]} said so); "
                                 "`swarmloco runs` lists the runs you can join")
        if records and not trusted and pinned is None:
            raise DiscoveryError(
                f"run {names[0]!r} is announced by coordinator keys that do not vouch for each other "
                f"({', '.join(r.coordinator_id[:16] for r in records)}): pass --coordinator-key with the fingerprint "
                "of the coordinator you trust")
        if time.monotonic() >= deadline:
            which = f"run {run_id!r}" if run_id else "any run"
            if records and not trusted:  # pinned: its record may have lapsed for a moment; retryable
                raise RunNotFound(
                    f"the DHT has no record of the pinned coordinator {pinned} for {which} (records of "
                    f"{', '.join(r.coordinator_id[:16] for r in records)} only); is that coordinator up? check "
                    "--coordinator-key")
            raise RunNotFound(f"the DHT has no active coordinator record for {which}; is the coordinator up? check --initial-peers")
        time.sleep(0.5)


def list_peers(dht: DHT, run_id: str) -> dict[str, dict[str, Any]]:
    """peer_id -> {endpoint, public_key, client_mode, version} of peers announced in the DHT."""
    out = {}
    for peer_id, (value, _) in _entries(dht, peers_key(run_id)).items():
        try:
            if peer_id_of(bytes.fromhex(value["public_key"])) == peer_id:
                out[peer_id] = value
        except (KeyError, ValueError, TypeError):
            continue
    return out
