"""Deterministic fault injection (peer/run/faults.py): SWARMLOCO_FAIL_AT=PHASE:ROUND[:ACTION[:REPEAT]]
(or faults.inject in-process) makes a process SIGKILL itself, raise InjectedFault, sleep, or wait
at a gate until a file exists, at exactly that point, so crash and slow-path tests need no
log-timed kill and no timer. Real peers killed this way in a swarm, and held at a gate while late
joiners start: tests/test_fault_tolerance.py (test_a_peer_sigkilled_mid_round_does_not_stall_the_swarm)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import grpc
import pytest

from peer.run import faults
from peer.run.faults import Action, FailAt
from protocol.rpc_errors import RpcAbort, guarded


@pytest.fixture(autouse=True)
def no_environment_faults(monkeypatch):
    """In-process tests see no SWARMLOCO_FAIL_AT of the shell that runs them."""
    monkeypatch.setattr(faults, "_target", ())


def test_fail_at_parses_phase_and_round():
    assert faults.parse_fail_at("committed:1") == FailAt("committed", 1)  # a kill, as before actions
    assert faults.parse_fail_at(" manifest-signed:0 ") == FailAt("manifest-signed", 0, Action.KILL)
    assert set(faults.PEER_PHASES) >= {"trained", "committed", "manifest", "fetched", "aggregated"}


@pytest.mark.parametrize(
    "text, fault",
    [
        ("committed:1:kill", FailAt("committed", 1, Action.KILL)),
        ("fetched:2:error", FailAt("fetched", 2, Action.ERROR)),
        ("manifest-signed:0:unavailable", FailAt("manifest-signed", 0, Action.UNAVAILABLE)),
        ("manifest:3:delay=0.25", FailAt("manifest", 3, Action.DELAY, 0.25)),
        ("manifest:3:delay=0", FailAt("manifest", 3, Action.DELAY, 0.0)),
        ("fetched:*:delay=1.5:every", FailAt("fetched", None, Action.DELAY, 1.5, every=True)),
        (" gathered : 4 : error : once ", FailAt("gathered", 4, Action.ERROR)),
        ("trained:2:wait=/tmp/gate", FailAt("trained", 2, Action.WAIT, path="/tmp/gate")),
        ("round-recorded:*:wait= /tmp/a gate :every", FailAt("round-recorded", None, Action.WAIT, every=True, path="/tmp/a gate")),
    ],
)
def test_fail_at_parses_actions_and_repeats(text, fault):
    assert faults.parse_fail_at(text) == fault
    assert faults.parse_fail_at(str(fault)) == fault  # str() is the canonical spelling


@pytest.mark.parametrize(
    "text, says",
    [
        ("committed", "expected PHASE:ROUND"),
        ("commited:1", "PHASE one of trained, committed"),  # a typo is refused, not ignored
        ("commited:1", "ACTION one of kill, error, unavailable, delay=SECONDS"),  # the message lists the actions too
        ("committed:one", "ROUND must be a whole number"),
        ("committed:", "ROUND must be a whole number"),
        ("committed:-1", "ROUND counts from 0"),
        (":1", "expected PHASE:ROUND"),
        ("committed:1:explode", "ACTION 'explode' is not one of kill, error, unavailable, delay=SECONDS"),
        ("committed:1:Error", "ACTION 'Error' is not one of"),
        ("committed:1:error=2", "ACTION 'error=2' is not one of"),
        ("committed:1:delay", "delay=SECONDS needs SECONDS from 0 to 3600"),
        ("committed:1:delay=soon", "delay=SECONDS needs SECONDS"),
        ("committed:1:delay=-1", "delay=SECONDS needs SECONDS"),
        ("committed:1:delay=nan", "delay=SECONDS needs SECONDS"),
        ("committed:1:delay=inf", "delay=SECONDS needs SECONDS"),
        ("committed:1:delay=5000", "delay=SECONDS needs SECONDS from 0 to 3600"),
        ("committed:1:error:twice", "REPEAT 'twice' is not one of once, every"),
        ("committed:1:error:every:more", "expected PHASE:ROUND"),
        ("commited:1", "stop, wait=PATH"),
        ("committed:1:wait", "wait=PATH needs the PATH of the file that opens the gate"),
        ("committed:1:wait=", "wait=PATH needs the PATH of the file that opens the gate"),
        ("committed:1:wait=/tmp/a:b", "wait=PATH may hold no ':'"),
        ("committed:1:wait=/tmp/a:every:b", "wait=PATH may hold no ':'"),
    ],
)
def test_bad_fail_at_is_a_clear_value_error(text, says):
    with pytest.raises(ValueError, match=says) as info:
        faults.parse_fail_at(text)
    assert faults.ENV in str(info.value)


def test_a_spec_lists_faults_and_names_each_point_once():
    assert faults.parse_spec("") == faults.parse_spec("  ") == ()
    assert faults.parse_spec("committed:1,fetched:*:delay=0.5:every") == (
        FailAt("committed", 1), FailAt("fetched", None, Action.DELAY, 0.5, every=True))
    assert faults.parse_spec("fetched:*:delay=1,fetched:2:error") == (  # * and one round may both be named
        FailAt("fetched", None, Action.DELAY, 1.0), FailAt("fetched", 2, Action.ERROR))
    with pytest.raises(ValueError, match="committed:1 is named twice"):
        faults.parse_spec("committed:1,committed:1:error")
    with pytest.raises(ValueError, match=r"SWARMLOCO_FAIL_AT='committed:1,fetched:x': fault 'fetched:x': ROUND must"):
        faults.parse_spec("committed:1,fetched:x")
    with pytest.raises(ValueError, match="expected PHASE:ROUND"):
        faults.parse_spec("committed:1,")  # an empty fault is not silently skipped
    with pytest.raises(ValueError, match="fault 'b': expected PHASE:ROUND"):
        faults.parse_spec("trained:0:wait=/tmp/a,b")  # a ',' in PATH starts another fault: refused, not half-read


def test_environment_is_read_once_and_unset_is_a_no_op(monkeypatch):
    monkeypatch.setattr(faults, "_target", faults._UNREAD)
    monkeypatch.delenv(faults.ENV, raising=False)
    assert faults.check_environment() == ()
    monkeypatch.setenv(faults.ENV, "trained:0")
    assert faults.check_environment() == ()  # read once: a later change is not seen
    faults.fail_point("trained", 0)  # no target: returns
    with pytest.raises(ValueError, match="not a phase"):
        faults.fail_point("trainde", 0)


def test_an_environment_error_fault_raises_at_its_point_once(monkeypatch):
    monkeypatch.setattr(faults, "_target", faults._UNREAD)
    monkeypatch.setenv(faults.ENV, "fetched:1:error,manifest:*:delay=0:every")
    assert faults.check_environment() == (FailAt("fetched", 1, Action.ERROR), FailAt("manifest", None, Action.DELAY, every=True))
    faults.fail_point("fetched", 0)
    faults.fail_point("aggregated", 1)
    with pytest.raises(faults.InjectedFault, match=r"injected fault \(error\) at fetched:1") as info:
        faults.fail_point("fetched", 1)
    assert (info.value.phase, info.value.round) == ("fetched", 1)
    assert isinstance(info.value, RuntimeError) and not isinstance(info.value, (ValueError, OSError))
    faults.fail_point("fetched", 1)  # once (the default): reaching it again goes on
    for r in range(3):
        faults.fail_point("manifest", r)


def test_a_bad_environment_value_is_refused_by_check_environment(monkeypatch):
    monkeypatch.setattr(faults, "_target", faults._UNREAD)
    monkeypatch.setenv(faults.ENV, "fetched:1:sigsegv")
    with pytest.raises(ValueError, match="ACTION 'sigsegv' is not one of kill, error, unavailable, delay=SECONDS"):
        faults.check_environment()


def test_inject_raises_at_exactly_its_phase_and_round():
    with faults.inject("aggregated", 2, "error") as fault:
        for phase in faults.PHASES:
            for r in range(4):
                if (phase, r) != ("aggregated", 2):
                    faults.fail_point(phase, r)
        assert fault.hits == 0
        with pytest.raises(faults.InjectedFault) as info:
            faults.fail_point("aggregated", 2)
        assert (info.value.phase, info.value.round) == ("aggregated", 2)
        assert fault.hits == 1
        faults.fail_point("aggregated", 2)  # once
        assert fault.hits == 1
    faults.fail_point("aggregated", 2)  # disarmed when the block ends


def test_inject_every_round_and_every_time():
    with faults.inject("committed", None, "error", every=True) as fault:
        for r in (0, 0, 5):
            with pytest.raises(faults.InjectedFault):
                faults.fail_point("committed", r)
        faults.fail_point("trained", 0)
    assert fault.hits == 3
    with faults.inject("committed", None, "error") as once_a_round:  # once: the first time in each round
        for r in (0, 1):
            with pytest.raises(faults.InjectedFault):
                faults.fail_point("committed", r)
            faults.fail_point("committed", r)
    assert once_a_round.hits == 2


def test_inject_delay_sleeps_at_least_the_asked_time_then_goes_on():
    with faults.inject("manifest", 1, "delay=0.2") as fault:
        faults.fail_point("manifest", 0)  # not its round: goes on (its time is not asserted)
        assert fault.hits == 0
        t0 = time.monotonic()
        faults.fail_point("manifest", 1)
        slept = time.monotonic() - t0
    assert slept >= 0.2 and fault.hits == 1  # a lower bound only: a loaded machine may sleep longer


def test_faults_at_one_point_act_in_order_delay_then_error():
    with faults.inject("gathered", 3, "delay=0.1") as delay, faults.inject("gathered", 3, "error") as error, \
            faults.inject("gathered", 3, "delay=0") as after:
        t0 = time.monotonic()
        with pytest.raises(faults.InjectedFault):
            faults.fail_point("gathered", 3)
        assert time.monotonic() - t0 >= 0.1
        assert (delay.hits, error.hits, after.hits) == (1, 1, 0)  # the error ended the list
        faults.fail_point("gathered", 3)  # the one after it is still armed, once
        assert after.hits == 1


def test_a_gate_holds_the_thread_at_its_point_until_its_file_exists(tmp_path):
    gate = tmp_path / "gate"
    went_on = threading.Event()

    def worker() -> None:
        faults.fail_point("trained", 0)  # not its round: goes on at once
        faults.fail_point("trained", 2)
        went_on.set()

    with faults.inject("trained", 2, f"wait={gate}") as fault:
        t = threading.Thread(target=worker)
        t.start()
        deadline = time.monotonic() + 30
        while fault.hits == 0 and time.monotonic() < deadline:  # it reached the gate (counted before it waits)
            time.sleep(0.01)
        assert fault.hits == 1 and t.is_alive() and not went_on.is_set()
        gate.touch()
        t.join(30)
        assert went_on.is_set()
        faults.fail_point("trained", 2)  # once: and the file is there anyway
    assert fault.hits == 1


def test_a_gate_nobody_opens_is_a_gate_timeout_that_names_its_file(tmp_path, monkeypatch):
    monkeypatch.setattr(faults, "MAX_WAIT_S", 0.2)
    gate = tmp_path / "never"
    with faults.inject("committed", 1, f"wait={gate}"), pytest.raises(faults.GateTimeout) as info:
        faults.fail_point("committed", 1)
    assert isinstance(info.value, faults.InjectedFault) and (info.value.phase, info.value.round) == ("committed", 1)
    assert f"the gate at committed:1 waited 0.2 s for {gate}, which never appeared: create that file" in str(info.value)


def test_a_gate_then_an_error_at_one_point_act_in_order(tmp_path):
    gate = tmp_path / "open"
    gate.touch()
    with faults.inject("fetched", 0, f"wait={gate}") as wait, faults.inject("fetched", 0, "error") as error:
        with pytest.raises(faults.InjectedFault):
            faults.fail_point("fetched", 0)
    assert (wait.hits, error.hits) == (1, 1)  # the gate goes on, like a delay: the next fault acts


def test_inject_validates_like_the_variable():
    with pytest.raises(ValueError, match="not a phase; known phases: trained"):
        faults.inject("traind", 0).__enter__()
    with pytest.raises(ValueError, match="ROUND is a whole number from 0"):
        faults.inject("trained", -1).__enter__()
    with pytest.raises(ValueError, match="ACTION 'crash' is not one of kill, error, unavailable, delay=SECONDS"):
        faults.inject("trained", 0, "crash").__enter__()
    with pytest.raises(ValueError, match="delay=SECONDS needs SECONDS"):
        faults.inject("trained", 0, "delay=-2").__enter__()
    with pytest.raises(ValueError, match="wait=PATH may hold no ',' or ':'"):
        faults.inject("trained", 0, "wait=/tmp/a:b").__enter__()
    assert faults._injected == []  # nothing was left armed


def test_a_once_fault_acts_in_exactly_one_of_many_threads():
    raised: list[int] = []
    start = threading.Barrier(8)

    def reach(i: int) -> None:
        start.wait()
        try:
            faults.fail_point("reduced", 7)
        except faults.InjectedFault:
            raised.append(i)

    with faults.inject("reduced", 7, "error") as fault:
        threads = [threading.Thread(target=reach, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert len(raised) == 1 and fault.hits == 1


def test_inject_works_from_another_thread_than_the_one_that_armed_it():
    seen: list[BaseException] = []

    def worker() -> None:
        try:
            faults.fail_point("fetched", 0)
        except faults.InjectedFault as exc:
            seen.append(exc)

    with faults.inject("fetched", 0, "error"):
        t = threading.Thread(target=worker)
        t.start()
        t.join(30)
    assert len(seen) == 1


class _Aborted(Exception):
    pass


class _Context:
    """Enough of a grpc.ServicerContext for `guarded`."""

    def __init__(self) -> None:
        self.code: grpc.StatusCode | None = None
        self.details = ""

    def invocation_metadata(self):
        return ()

    def peer(self) -> str:
        return "ipv4:127.0.0.1:5000"

    def set_trailing_metadata(self, metadata) -> None:
        self.trailing = metadata

    def abort(self, code, details):
        self.code, self.details = code, details
        raise _Aborted(details)


class _Servicer:
    class _Limits:
        def allow(self, peer, host, cost=1.0) -> bool:
            return True

    def __init__(self) -> None:
        self.rejected: list[str] = []

    @guarded(lambda self: self._Limits(), lambda self, reason: self.rejected.append(reason))
    def Close(self, request, context):
        faults.fail_point("manifest-signed", request)
        return "closed"


@pytest.mark.parametrize("action, code", [("error", grpc.StatusCode.INTERNAL), ("unavailable", grpc.StatusCode.UNAVAILABLE)])
def test_an_injected_fault_under_a_guarded_handler_is_a_clean_status(action, code):
    servicer = _Servicer()
    assert servicer.Close(0, _Context()) == "closed"
    with faults.inject("manifest-signed", 1, action):
        assert servicer.Close(0, _Context()) == "closed"  # another round
        context = _Context()
        with pytest.raises(_Aborted):
            servicer.Close(1, context)
    assert context.code == code and "injected fault" in context.details
    assert servicer.rejected == (["internal-error"] if action == "error" else [])


def test_unavailable_is_an_injected_fault_and_an_rpc_abort():
    with faults.inject("committed", 0, "unavailable"), pytest.raises(faults.InjectedUnavailable) as info:
        faults.fail_point("committed", 0)
    exc = info.value
    assert isinstance(exc, faults.InjectedFault) and isinstance(exc, RpcAbort)
    assert exc.code == grpc.StatusCode.UNAVAILABLE and exc.refusal == 0


def _reach(spec: str, phase: str = "trained", round_: int = 0) -> subprocess.CompletedProcess:
    """A bare process that reaches one fail point with SWARMLOCO_FAIL_AT=spec."""
    code = f"from peer.run import faults; faults.check_environment(); faults.fail_point({phase!r}, {round_}); print('went on')"
    env = dict(os.environ, **{faults.ENV: spec})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)


def test_the_variable_kills_raises_delays_or_gates_a_real_process(tmp_path):
    killed = _reach("trained:0")
    assert killed.returncode == -signal.SIGKILL and "reached trained:0, killing" in killed.stderr
    assert "went on" not in killed.stdout
    raised = _reach("trained:0:error")
    assert raised.returncode == 1 and "InjectedFault: injected fault (error) at trained:0" in raised.stderr
    delayed = _reach("trained:0:delay=0.1")
    assert delayed.returncode == 0 and "went on" in delayed.stdout and "sleeping 0.1 s" in delayed.stderr
    other = _reach("trained:1:error")
    assert other.returncode == 0 and "went on" in other.stdout
    gate = tmp_path / "gate"
    waiting = subprocess.Popen([sys.executable, "-c", "from peer.run import faults; faults.check_environment(); "
                                "faults.fail_point('trained', 0); print('went on')"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ, **{faults.ENV: f"trained:0:wait={gate}"}))
    try:
        assert waiting.stderr.readline() == f"{faults.ENV}: reached trained:0, waiting for {gate} (at most 600 s)\n"
        assert waiting.poll() is None  # held there
        gate.touch()
        out, err = waiting.communicate(timeout=60)
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.wait()
    assert waiting.returncode == 0 and out == "went on\n" and f"{gate} exists: going on from trained:0" in err


def test_a_bad_value_stops_the_peer_at_start_up():
    """Refused before the peer connects anywhere (port 1 would only time out), with exit code 2."""
    env = dict(os.environ, **{faults.ENV: "committed:soon"})
    out = subprocess.run(
        [sys.executable, "-m", "peer.cli.main", "peer", "--coordinator", "127.0.0.1:1", "--connect-timeout", "30"],
        capture_output=True, text=True, timeout=60, env=env,
    )
    assert out.returncode == 2, out.stderr
    assert "SWARMLOCO_FAIL_AT='committed:soon': ROUND must be a whole number" in out.stderr


