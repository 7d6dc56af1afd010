"""Deterministic fault injection: a process crashes itself at an exact phase of an exact round.

    SWARMLOCO_FAIL_AT=committed:1 swarmloco peer ...

makes that peer SIGKILL itself the moment its round-1 commitment is accepted: a real crash at a
known point, with nothing timed off a log line. Unset, every fail point is a no-op. The variable
is read once; `check_environment()` at start-up turns a bad value into a ValueError there,
before anything runs.

Phases, in the order a round reaches them:
  peer:        trained, committed, manifest, fetched, aggregated
               (sliced exchange: trained, committed, manifest, reduced, gathered)
  coordinator: manifest-signed
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass

ENV = "SWARMLOCO_FAIL_AT"
PEER_PHASES = ("trained", "committed", "manifest", "fetched", "aggregated", "reduced", "gathered")
COORDINATOR_PHASES = ("manifest-signed",)
PHASES = PEER_PHASES + COORDINATOR_PHASES


@dataclass(frozen=True, slots=True)
class FailAt:
    phase: str
    round: int


def parse_fail_at(text: str) -> FailAt:
    """'committed:1' -> FailAt('committed', 1); anything else is a ValueError that says the form."""
    phase, sep, round_text = text.strip().partition(":")
    if not sep or phase not in PHASES:
        raise ValueError(
            f"{ENV}={text!r}: expected PHASE:ROUND with PHASE one of {', '.join(PHASES)} (e.g. committed:1)"
        )
    try:
        round_ = int(round_text)
    except ValueError:
        raise ValueError(f"{ENV}={text!r}: ROUND must be a whole number, e.g. {phase}:1") from None
    if round_ < 0:
        raise ValueError(f"{ENV}={text!r}: ROUND counts from 0, got {round_}")
    return FailAt(phase, round_)


_UNREAD = object()
_target: FailAt | None | object = _UNREAD


def check_environment() -> FailAt | None:
    """Read and validate SWARMLOCO_FAIL_AT once (later calls return the same answer)."""
    global _target
    if _target is _UNREAD:
        text = os.environ.get(ENV, "")
        _target = parse_fail_at(text) if text.strip() else None
    return _target  # type: ignore[return-value]


def fail_point(phase: str, round_: int) -> None:
    """Crash this process (SIGKILL, no cleanup) if SWARMLOCO_FAIL_AT names this phase and round."""
    if phase not in PHASES:
        raise ValueError(f"fail_point({phase!r}): not a phase; known phases: {', '.join(PHASES)}")
    target = check_environment()
    if target is not None and target.phase == phase and target.round == round_:
        print(f"{ENV}: reached {phase}:{round_}, killing this process (SIGKILL)", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
