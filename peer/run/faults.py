"""Deterministic fault injection: a process fails at an exact phase of an exact round.

    SWARMLOCO_FAIL_AT=committed:1 swarmloco peer ...

makes that peer SIGKILL itself the moment its round-1 commitment is accepted: a real crash at a
known point, with nothing timed off a log line. Unset, every fail point is a no-op. The variable
is read once; `check_environment()` at start-up turns a bad value into a ValueError there,
before anything runs. The grammar:

    SWARMLOCO_FAIL_AT = FAULT [ "," FAULT ... ]
    FAULT  = PHASE ":" ROUND [ ":" ACTION [ ":" REPEAT ] ]
    ROUND  = a whole number from 0, or "*" (every round)
    ACTION = kill          SIGKILL this process, no cleanup (the default)
           | error         raise InjectedFault (a RuntimeError) at that point
           | unavailable   raise InjectedUnavailable: an InjectedFault that is also an RpcAbort
                           with UNAVAILABLE, so a `guarded` handler answers UNAVAILABLE (a plain
                           `error` there answers INTERNAL)
           | delay=SECONDS sleep that long (0 to 3600, fractions allowed) at that point, then go on
           | stop          SIGSTOP this process: it freezes there until someone sends SIGCONT (a
                           frozen coordinator: tests/test_failover.py's split brain)
           | wait=PATH     a gate: the thread at that point waits until the file PATH exists (at
                           most MAX_WAIT_S, 600 s, then GateTimeout, an InjectedFault), then goes on;
                           PATH holds no ':' or ','. The process's other threads run meanwhile
                           (heartbeats, a peer's server), so a test can hold every peer of a swarm
                           at one point of one round until something it waits for has happened
                           (tests/test_fault_tolerance.py's late joiner), then create PATH
    REPEAT = once          act the first time the point is reached in a matching round (the default)
           | every         act every time it is reached

e.g. `fetched:2:error`, `manifest-signed:*:delay=0.5:every`, `committed:1,aggregated:3:error`,
`trained:2:wait=/tmp/gate`.
The same PHASE:ROUND may not be named twice. Where several faults match one point they act in
the order listed (a delay, then the next one); a kill or an error ends the list.

In-process tests need no environment: `with inject("fetched", 1, "error") as fault:` arms the
same kind of fault for the `with` block, from any thread (`fault.hits` counts how often it acted).

Where an error goes is the call site's business: in the peer's exchange (manifest, fetched,
aggregated, reduced, gathered) it becomes a resync; under a `guarded` RPC handler a status.
A delay or a gate at manifest-signed holds the coordinator's state lock (every RPC waits with
it); round-recorded and the peer phases hold no lock.

Phases, in the order a round reaches them:
  peer:        trained, committed, manifest, fetched, aggregated
               (sliced exchange: trained, committed, manifest, reduced, gathered)
  coordinator: manifest-signed, manifest-followed (a standby's heartbeat says it holds that round's
               signed manifest: it can continue the round), round-recorded (the round's result is
               in the coordinator's history)
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Iterator

import grpc

from protocol.rpc_errors import RpcAbort

ENV = "SWARMLOCO_FAIL_AT"
PEER_PHASES = ("trained", "committed", "manifest", "fetched", "aggregated", "reduced", "gathered")
COORDINATOR_PHASES = ("manifest-signed", "manifest-followed", "round-recorded")
PHASES = PEER_PHASES + COORDINATOR_PHASES
ANY_ROUND = None  # FailAt.round for "*"
MAX_DELAY_S = 3600.0
MAX_WAIT_S = 600.0  # a gate nobody opens (its test failed first) ends in a GateTimeout, not a hang
WAIT_POLL_S = 0.05  # how often a gate looks for its file


class Action(StrEnum):
    KILL = "kill"
    ERROR = "error"
    UNAVAILABLE = "unavailable"
    DELAY = "delay"
    STOP = "stop"
    WAIT = "wait"


ACTIONS = ("kill", "error", "unavailable", "delay=SECONDS", "stop", "wait=PATH")
GOES_ON = (Action.DELAY, Action.STOP, Action.WAIT)  # the process goes on after these: the next fault acts too
REPEATS = ("once", "every")


@dataclass(frozen=True, slots=True)
class FailAt:
    """One fault: `action` at `phase` of `round` (None: every round). `seconds` only for DELAY,
    `path` only for WAIT."""

    phase: str
    round: int | None
    action: Action = Action.KILL
    seconds: float = 0.0
    every: bool = False
    path: str = ""

    def __str__(self) -> str:
        action = {Action.DELAY: f"delay={self.seconds:g}", Action.WAIT: f"wait={self.path}"}.get(self.action, str(self.action))
        return f"{self.phase}:{'*' if self.round is None else self.round}:{action}:{'every' if self.every else 'once'}"


class InjectedFault(RuntimeError):
    """Raised by a fail point whose fault's action is `error` (or `unavailable`)."""

    def __init__(self, phase: str, round_: int, action: str = "error") -> None:
        super().__init__(f"injected fault ({action}) at {phase}:{round_} ({ENV} or faults.inject)")
        self.phase = phase
        self.round = round_


class InjectedUnavailable(InjectedFault, RpcAbort):
    """An injected fault that a `guarded` handler turns into UNAVAILABLE instead of INTERNAL."""

    def __init__(self, phase: str, round_: int) -> None:
        InjectedFault.__init__(self, phase, round_, "unavailable")
        self.code = grpc.StatusCode.UNAVAILABLE
        self.message = str(self)
        self.refusal = 0  # swarm_pb2.REFUSAL_UNSPECIFIED: a transport-like failure, not a refusal


class GateTimeout(InjectedFault):
    """A `wait=PATH` gate whose file did not appear within MAX_WAIT_S."""

    def __init__(self, phase: str, round_: int, path: str, waited_s: float) -> None:
        RuntimeError.__init__(self, f"{ENV}: the gate at {phase}:{round_} waited {waited_s:g} s for {path}, which never appeared: "
                                    f"create that file to let the process go on (or arm the gate only where something opens it)")
        self.phase = phase
        self.round = round_
        self.path = path


_FORM = "expected PHASE:ROUND[:ACTION[:REPEAT]]"


def _grammar() -> str:
    return (f"PHASE one of {', '.join(PHASES)}; ROUND a whole number from 0 or *; "
            f"ACTION one of {', '.join(ACTIONS)} (default kill); REPEAT one of {', '.join(REPEATS)} (default once)")


def _where(text: str, whole: str | None) -> str:
    return f"{ENV}={text!r}" if whole is None or whole.strip() == text.strip() else f"{ENV}={whole!r}: fault {text!r}"


def parse_action(text: str) -> tuple[Action, float, str]:
    """'kill' | 'error' | 'unavailable' | 'delay=SECONDS' | 'stop' | 'wait=PATH' -> (Action,
    seconds, path); else ValueError."""
    name, eq, value = text.strip().partition("=")
    if name == "wait":
        path = value.strip()
        if not path:
            raise ValueError(f"ACTION {text!r}: wait=PATH needs the PATH of the file that opens the gate, e.g. wait=/tmp/gate")
        if "," in path or ":" in path:
            raise ValueError(f"ACTION {text!r}: wait=PATH may hold no ',' or ':' (they separate faults and fields)")
        return Action.WAIT, 0.0, path
    if name == "delay":
        try:
            seconds = float(value) if eq else math.nan
        except ValueError:
            seconds = math.nan
        if not (0.0 <= seconds <= MAX_DELAY_S):  # also refuses nan, inf
            raise ValueError(f"ACTION {text!r}: delay=SECONDS needs SECONDS from 0 to {MAX_DELAY_S:g}, e.g. delay=0.5")
        return Action.DELAY, seconds, ""
    if eq or name not in (Action.KILL, Action.ERROR, Action.UNAVAILABLE, Action.STOP):
        raise ValueError(f"ACTION {text!r} is not one of {', '.join(ACTIONS)}")
    return Action(name), 0.0, ""


def parse_fail_at(text: str, *, _whole: str | None = None) -> FailAt:
    """'committed:1' -> FailAt('committed', 1) (a kill); 'fetched:*:delay=0.5:every' ->
    FailAt('fetched', None, Action.DELAY, 0.5, every=True). Anything else is a ValueError
    that names the value and the grammar."""
    where = _where(text, _whole)
    parts = [part.strip() for part in text.split(":")]
    phase = parts[0]
    if len(parts) >= 4 and parts[2].startswith("wait=") and (len(parts) > 4 or parts[3] not in REPEATS):
        raise ValueError(f"{where}: wait=PATH may hold no ':' (it separates PHASE, ROUND, ACTION and REPEAT)")
    if len(parts) < 2 or not phase or len(parts) > 4:
        raise ValueError(f"{where}: {_FORM}, {_grammar()} (e.g. committed:1, fetched:2:error)")
    if phase not in PHASES:
        raise ValueError(f"{where}: {phase!r} is not a phase: {_FORM} with {_grammar()}")
    round_text = parts[1]
    if round_text == "*":
        round_: int | None = ANY_ROUND
    else:
        try:
            round_ = int(round_text)
        except ValueError:
            raise ValueError(f"{where}: ROUND must be a whole number or *, e.g. {phase}:1") from None
        if round_ < 0:
            raise ValueError(f"{where}: ROUND counts from 0, got {round_}")
    action, seconds, path = Action.KILL, 0.0, ""
    if len(parts) >= 3:
        try:
            action, seconds, path = parse_action(parts[2])
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    every = False
    if len(parts) == 4:
        repeat = parts[3]
        if repeat not in REPEATS:
            raise ValueError(f"{where}: REPEAT {repeat!r} is not one of {', '.join(REPEATS)}")
        every = repeat == "every"
    return FailAt(phase, round_, action, seconds, every, path)


def parse_spec(text: str) -> tuple[FailAt, ...]:
    """The whole SWARMLOCO_FAIL_AT value: comma-separated faults, () when blank. ValueError for a
    bad fault or a PHASE:ROUND named twice."""
    if not text.strip():
        return ()
    items = text.split(",")
    faults = tuple(parse_fail_at(item, _whole=text if len(items) > 1 else None) for item in items)
    seen: set[tuple[str, int | None]] = set()
    for fault in faults:
        key = (fault.phase, fault.round)
        if key in seen:
            point = f"{fault.phase}:{'*' if fault.round is None else fault.round}"
            raise ValueError(f"{ENV}={text!r}: {point} is named twice; give each PHASE:ROUND one ACTION")
        seen.add(key)
    return faults


@dataclass(eq=False)
class Injection:
    """An armed fault: `hits` counts the times it acted (read it after the point was reached)."""

    fault: FailAt
    hits: int = 0
    _acted: set[int] = field(default_factory=set)  # rounds it acted in (for once)

    def _claim(self, phase: str, round_: int) -> bool:
        """Under _lock: whether this fault acts now at (phase, round_); counts it if so."""
        f = self.fault
        if f.phase != phase or (f.round is not None and f.round != round_):
            return False
        if not f.every:
            if round_ in self._acted:
                return False
            self._acted.add(round_)
        self.hits += 1
        return True


_lock = threading.Lock()
_UNREAD = object()
_target: tuple[Injection, ...] | object = _UNREAD  # the environment's faults, read once
_injected: list[Injection] = []  # inject()'s, in the order armed


def _environment() -> tuple[Injection, ...]:
    global _target
    if _target is not _UNREAD:
        return _target  # type: ignore[return-value]
    with _lock:
        if _target is _UNREAD:
            _target = tuple(Injection(f) for f in parse_spec(os.environ.get(ENV, "")))
        return _target  # type: ignore[return-value]


def check_environment() -> tuple[FailAt, ...]:
    """Read and validate SWARMLOCO_FAIL_AT once (later calls return the same answer, () when unset);
    a bad value is a ValueError naming the valid phases and actions."""
    return tuple(i.fault for i in _environment())


@contextlib.contextmanager
def inject(phase: str, round_: int | None, action: str = "error", *, every: bool = False) -> Iterator[Injection]:
    """Arm a fault for the `with` block without the environment: `action` as in SWARMLOCO_FAIL_AT
    ('kill', 'error', 'unavailable', 'delay=SECONDS', 'stop', 'wait=PATH'), `round_` None for every
    round. Checked like the variable (ValueError); yields the Injection. Safe from any thread;
    blocks may nest."""
    if phase not in PHASES:
        raise ValueError(f"inject({phase!r}): not a phase; known phases: {', '.join(PHASES)}")
    if round_ is not None and (not isinstance(round_, int) or round_ < 0):
        raise ValueError(f"inject({phase!r}, {round_!r}): ROUND is a whole number from 0, or None for every round")
    kind, seconds, path = parse_action(action)
    injection = Injection(FailAt(phase, round_, kind, seconds, every, path))
    with _lock:
        _injected.append(injection)
    try:
        yield injection
    finally:
        with _lock:
            _injected.remove(injection)


def fail_point(phase: str, round_: int) -> None:
    """Act on every armed fault (inject()'s first, then SWARMLOCO_FAIL_AT's) that names this phase
    and round: SIGKILL, raise InjectedFault, sleep, SIGSTOP, or wait for a gate's file. A no-op
    when none does."""
    if phase not in PHASES:
        raise ValueError(f"fail_point({phase!r}): not a phase; known phases: {', '.join(PHASES)}")
    armed = _environment()
    if not armed and not _injected:
        return
    due: list[FailAt] = []
    with _lock:
        for injection in (*_injected, *armed):
            if injection._claim(phase, round_):
                due.append(injection.fault)
                if injection.fault.action not in GOES_ON:
                    break  # a kill or an error ends the list: the faults after it have not acted
    for fault in due:
        if fault.action is Action.KILL:
            print(f"{ENV}: reached {phase}:{round_}, killing this process (SIGKILL)", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        elif fault.action is Action.STOP:
            print(f"{ENV}: reached {phase}:{round_}, stopping this process (SIGSTOP; SIGCONT resumes it)", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGSTOP)
        elif fault.action is Action.DELAY:
            print(f"{ENV}: reached {phase}:{round_}, sleeping {fault.seconds:g} s", file=sys.stderr, flush=True)
            time.sleep(fault.seconds)
        elif fault.action is Action.WAIT:
            _wait_for_gate(fault.path, phase, round_)
        elif fault.action is Action.UNAVAILABLE:
            print(f"{ENV}: reached {phase}:{round_}, raising InjectedUnavailable", file=sys.stderr, flush=True)
            raise InjectedUnavailable(phase, round_)
        else:
            print(f"{ENV}: reached {phase}:{round_}, raising InjectedFault", file=sys.stderr, flush=True)
            raise InjectedFault(phase, round_)


def _wait_for_gate(path: str, phase: str, round_: int) -> None:
    """Block this thread until the file `path` exists; GateTimeout after MAX_WAIT_S."""
    print(f"{ENV}: reached {phase}:{round_}, waiting for {path} (at most {MAX_WAIT_S:g} s)", file=sys.stderr, flush=True)
    deadline = time.monotonic() + MAX_WAIT_S
    while not os.path.exists(path):
        if time.monotonic() >= deadline:
            raise GateTimeout(phase, round_, path, MAX_WAIT_S)
        time.sleep(WAIT_POLL_S)
    print(f"{ENV}: {path} exists: going on from {phase}:{round_}", file=sys.stderr, flush=True)
