"""The coordinator's signed word on the run, and the keys a peer accepts it from.

A run's identity is its coordinator keys (`[control] coordinators` in the run config; the check is
protocol/keys.py). A peer pins the key it first trusts (the DHT-signed run record, or
`--coordinator-key`), checks that the run config it is served is the one that key signed (config
hash inside the signed state), and from then on accepts manifests, states and checkpoints signed by
the run's listed keys only, whatever an endpoint says.

The signed state is the coordinator's claim "round r is open on parameters with this hash": it is
what a peer compares its own θ_{r+1} with after each round, what a downloaded checkpoint must match,
and, with its term and role, how peers tell the active coordinator from a standby after a failover.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from protocol.envelope import EnvelopeError, open_envelope, signed_to_json
from protocol.identity import Identity
from protocol.keys import CoordinatorKeys, ImpersonationError  # noqa: F401  (re-exported: peer/node imports them from here)
from protocol.signing import sign_body
from protocol.wire import swarm_pb2

RUN_STATE_TAG = "swarmloco/run-state/v1"
Role = Literal["active", "standby"]


@dataclass(frozen=True, slots=True)
class RunState:
    run_id: str
    config_hash: str
    term: int  # bumped by every takeover; the highest live term is the active coordinator
    role: Role
    round: int  # the round open on these parameters
    param_hash: str  # sha256 of θ_round
    finished: bool  # the run has done all its rounds: param_hash is the final one
    active_endpoint: str  # HOST:PORT of the active coordinator as the signer knows it ("" unknown)
    timestamp: float
    signer: str = ""  # filled when opened: the signer's peer id

    @property
    def fingerprint(self) -> str:
        return self.signer


def sign_run_state(identity: Identity, state: RunState) -> swarm_pb2.Signed:
    body = asdict(state)
    body.pop("signer")
    return sign_body(identity, RUN_STATE_TAG, body)


def open_run_state(signed: swarm_pb2.Signed, *, keys: CoordinatorKeys | None, run_id: str | None) -> RunState:
    """Verify a signed run state. keys None: trust on first use (the caller says so, loudly)."""
    if keys is not None:
        keys.check(signed, "the run state")
    fields, signer = open_envelope(signed, RUN_STATE_TAG, "run state")
    try:
        state = RunState(
            run_id=str(fields["run_id"]), config_hash=str(fields["config_hash"]), term=int(fields["term"]),
            role=str(fields["role"]), round=int(fields["round"]), param_hash=str(fields["param_hash"]),  # type: ignore[arg-type]
            finished=bool(fields["finished"]), active_endpoint=str(fields["active_endpoint"]),
            timestamp=float(fields["timestamp"]), signer=signer,
        )
    except (KeyError, TypeError, ValueError):
        raise EnvelopeError("malformed", "run state lacks required fields") from None
    if state.role not in ("active", "standby"):
        raise EnvelopeError("malformed", f"run state role {state.role!r}")
    if run_id is not None and state.run_id != run_id:
        raise EnvelopeError("wrong-run", f"run state is for run {state.run_id!r}, not {run_id!r}")
    return state


def newer(a: RunState, b: RunState) -> bool:
    """The one rule every peer follows between two active coordinators: the higher term wins; in
    one term (two actives: evidence of a race), the lower fingerprint."""
    return rank(a.term, a.signer) > rank(b.term, b.signer)


def _neg(fingerprint: str) -> tuple[int, ...]:
    return tuple(-ord(c) for c in fingerprint)


def rank(term: int, signer: str) -> tuple[int, tuple[int, ...]]:
    """The one rule as a sort key: the larger rank holds the run (a higher term, then a lower key)."""
    return term, _neg(signer)


@dataclass(slots=True)
class TermFence:
    """Fencing by term: the highest (term, key) a receiver has seen the run's keys sign or announce,
    and what it refuses because of it. Whatever is signed in a lower term, or in the same term by a
    higher key than the one rule picks (`newer`), comes from a coordinator that was superseded: it
    is stale, however recent it looks. Two keys signing in one term are evidence of a race (both
    took over): the signed messages that show it are kept in `evidence`.

    Feed it every term seen: a run state, a manifest, the probe of a candidate coordinator, a DHT
    run record. Thread-safe (a peer's heartbeat and exchange threads share one)."""

    term: int = -1
    signer: str = ""  # the key that holds `term` by the rule
    evidence: list[dict[str, Any]] = field(default_factory=list)
    _signed: dict[tuple[int, str], swarm_pb2.Signed] = field(default_factory=dict)  # one signed message per (term, key)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def observe(self, term: int, signer: str, signed: swarm_pb2.Signed | None = None) -> bool:
        """Note (term, signer) from something a run key signed; False when it is stale."""
        with self._lock:
            if signed is not None and (term, signer) not in self._signed and len(self._signed) < 64:
                self._signed[(term, signer)] = signed
            if term == self.term and signer != self.signer:
                self._two_actives(term, signer)
            if rank(term, signer) >= rank(self.term, self.signer):
                self.term, self.signer = term, signer
                return True
            return False

    def stale(self, term: int, signer: str) -> bool:
        """Whether (term, signer) was superseded, without noting it."""
        with self._lock:
            return rank(term, signer) < rank(self.term, self.signer)

    def _two_actives(self, term: int, other: str) -> None:
        keys = sorted({self.signer, other})
        if any(e["term"] == term and e["keys"] == keys for e in self.evidence):
            return
        self.evidence.append({"term": term, "keys": keys, "winner": keys[0],
                              "signed": [signed_to_json(self._signed[(term, k)]) for k in keys if (term, k) in self._signed]})


def now() -> float:
    return time.time()
