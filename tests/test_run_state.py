"""The signed run state, the run's coordinator keys, and the one rule between two active coordinators."""

from __future__ import annotations

import time

import pytest

from protocol.discovery import RunRecord, vouched
from protocol.envelope import EnvelopeError
from protocol.identity import Identity
from protocol.keys import CoordinatorKeys, ImpersonationError, check_fingerprint
from protocol.run_state import RunState, newer, open_run_state, sign_run_state


def state(identity: Identity, *, term: int = 0, round_: int = 3) -> RunState:
    return RunState(run_id="r", config_hash="c" * 64, term=term, role="active", round=round_, param_hash="p" * 64,
                    finished=False, active_endpoint="127.0.0.1:1", timestamp=time.time())


def test_run_state_opens_only_for_the_run_keys():
    coordinator, stranger = Identity.generate(), Identity.generate()
    keys = CoordinatorKeys.of([coordinator.peer_id])
    opened = open_run_state(sign_run_state(coordinator, state(coordinator)), keys=keys, run_id="r")
    assert (opened.round, opened.signer, opened.term) == (3, coordinator.peer_id, 0)
    with pytest.raises(ImpersonationError) as refused:
        open_run_state(sign_run_state(stranger, state(stranger)), keys=keys, run_id="r")
    assert stranger.peer_id[:16] in str(refused.value)
    with pytest.raises(EnvelopeError):  # the right key, another run
        open_run_state(sign_run_state(coordinator, state(coordinator)), keys=keys, run_id="other")
    tampered = sign_run_state(coordinator, state(coordinator))
    tampered.body = tampered.body.replace(b'"round":3', b'"round":4')
    with pytest.raises(EnvelopeError):
        open_run_state(tampered, keys=keys, run_id="r")
    # Trust on first use: any signer, but still a valid signature.
    assert open_run_state(sign_run_state(stranger, state(stranger)), keys=None, run_id="r").signer == stranger.peer_id


def test_a_typed_fingerprint_prefix_pins_one_key():
    coordinator = Identity.generate()
    assert CoordinatorKeys.of([check_fingerprint(coordinator.peer_id[:16].upper())]).matches(coordinator.peer_id)
    assert not CoordinatorKeys.of([coordinator.peer_id[:16]]).matches(Identity.generate().peer_id)
    for bad in ("abc", "z" * 20, coordinator.peer_id + "00"):
        with pytest.raises(ValueError):
            check_fingerprint(bad)


def test_the_higher_term_wins_and_in_one_term_the_lower_key():
    a, b = sorted((Identity.generate() for _ in range(2)), key=lambda i: i.peer_id)
    first, second = (open_run_state(sign_run_state(i, state(i, term=1)), keys=None, run_id="r") for i in (a, b))
    assert newer(first, second) and not newer(second, first)  # same term: the lower fingerprint
    later = open_run_state(sign_run_state(b, state(b, term=2)), keys=None, run_id="r")
    assert newer(later, first) and not newer(first, later)


def test_a_stranger_announcing_the_run_is_vouched_for_by_nobody():
    def record(name: str, coordinators: tuple[str, ...], role: str = "active") -> RunRecord:
        return RunRecord("r", f"{name}:1", b"", name, role, 0, coordinators)

    active, standby, stranger = record("a" * 32, ("a" * 32, "b" * 32)), record("b" * 32, ("a" * 32, "b" * 32), "standby"), \
        record("c" * 32, ("a" * 32, "b" * 32, "c" * 32))
    assert vouched([active, standby]) == [active, standby]
    assert vouched([active, standby, stranger]) == [active, standby]  # the stranger lists everyone; nobody lists it
    assert vouched([active, standby, stranger], pinned="c" * 16) == [active, standby, stranger]  # pinned on the stranger: its word
    assert vouched([active, standby, stranger], pinned="a" * 32) == [active, standby]
