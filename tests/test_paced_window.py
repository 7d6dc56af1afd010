"""The test hook SWARMLOCO_STEP_S (peer/run/paced_window.py): a peer of a declared speed in a
compute-window run takes exactly the steps that speed fits in the window (the steps preflight
computes) and is busy until the window closes; a bad value is refused at start saying what to give.
The real-process swarm with a throttled peer is in tests/test_window_swarm.py."""

from __future__ import annotations

import time

import pytest

from peer.learn.model import build_model
from peer.learn.training import InnerTrainer
from peer.node.inner_phase import InnerPhase
from peer.run import paced_window
from peer.run.window_share import window_steps
from protocol.accounting import ByteCounter
from tests.helpers import FixedSampler, tiny_run_config, token_batch


@pytest.fixture
def step_s(monkeypatch):
    """Set this process's SWARMLOCO_STEP_S as if it had been read at start."""
    def set_(value: float | None) -> None:
        monkeypatch.setattr(paced_window, "_step_s", value)
    return set_


@pytest.mark.parametrize("text", ["0", "-0.1", "nan", "inf", "fast"])
def test_a_step_time_that_is_not_a_positive_number_is_refused_saying_what_to_give(text):
    with pytest.raises(ValueError, match=r"SWARMLOCO_STEP_S=.*a number > 0 \(e.g. SWARMLOCO_STEP_S=0.2\), or leave it unset"):
        paced_window.parse_step_s(text)
    assert paced_window.parse_step_s(" ") is None and paced_window.parse_step_s("0.25") == 0.25


def test_the_environment_is_read_once_at_start(monkeypatch):
    monkeypatch.setattr(paced_window, "_step_s", paced_window._UNREAD)
    monkeypatch.setenv(paced_window.ENV, "oops")
    with pytest.raises(ValueError, match="SWARMLOCO_STEP_S='oops'"):
        paced_window.check_environment()
    monkeypatch.setenv(paced_window.ENV, "0.5")
    assert paced_window.check_environment() == 0.5
    monkeypatch.setenv(paced_window.ENV, "0.1")
    assert paced_window.check_environment() == 0.5  # read once


def test_the_window_holds_the_steps_of_the_declared_speed_within_min_and_max(step_s):
    assert [window_steps(window_s=0.8, step_s=s, min_steps=1, max_steps=40) for s in (0.1, 0.4, 0.3, 2.0)] == [8, 2, 3, 1]
    assert window_steps(window_s=0.8, step_s=0.4, min_steps=5, max_steps=40) == 5
    assert window_steps(window_s=0.8, step_s=0.01, min_steps=1, max_steps=40) == 40
    rounds = tiny_run_config(rounds={"window_s": 0.8, "max_steps": 40}).rounds
    step_s(None)
    assert paced_window.paced_steps(rounds) is None  # unset: the window's clock decides
    step_s(0.4)
    assert paced_window.paced_steps(rounds) == 2
    assert paced_window.paced_steps(tiny_run_config().rounds) is None  # no window: inner.steps


def test_a_paced_phase_takes_exactly_its_steps_and_lasts_until_the_window_closes(step_s):
    cfg = tiny_run_config(rounds={"window_s": 0.3, "max_steps": 40})
    trainer = InnerTrainer(build_model(cfg.model, 0), cfg.inner, FixedSampler(*token_batch(4, cfg.model.seq_len)))
    phase = InnerPhase(cfg, ByteCounter("me"), short="me", log_every=1000)
    step_s(0.1)
    started = time.monotonic()
    stats, seconds = phase.run(trainer, 0)
    assert (stats.steps, trainer.step) == (3, 3)
    assert seconds >= 0.3 and time.monotonic() - started >= 0.3  # busy until its window closed
    step_s(0.05)
    stats, seconds = phase.run(trainer, 1)
    assert (stats.steps, trainer.step) == (6, 9) and seconds >= 0.3


def test_a_window_on_the_swarms_clock_closes_window_s_after_the_swarm_began_it(step_s):
    """Synchronous window rounds pass when the swarm's window began (the coordinator applied the
    last round): a phase that starts later ends window_s after that, not after its own start. A
    start more than half a window ago (a stall) or in the future (a stepped clock) is not used."""
    step_s(None)  # the real window clock, not the test hook
    cfg = tiny_run_config(rounds={"window_s": 0.4, "max_steps": 10_000})
    trainer = InnerTrainer(build_model(cfg.model, 0), cfg.inner, FixedSampler(*token_batch(4, cfg.model.seq_len)))
    phase = InnerPhase(cfg, ByteCounter("me"), short="me", log_every=1000)
    began = time.monotonic() - 0.15
    stats, seconds = phase.run(trainer, 0, window_from=began)
    ended = time.monotonic()
    assert phase.window_late_s >= 0.15  # it began 0.15 s (or more) after the swarm's window
    assert ended >= began + 0.4 and seconds + phase.window_late_s >= 0.4 and stats.steps >= 1
    for unusable in (time.monotonic() - 0.25, time.monotonic() + 5.0):  # > window / 2 ago; ahead of us
        started = time.monotonic()
        phase.run(trainer, 1, window_from=unusable)
        assert phase.window_late_s == 0 and time.monotonic() - started >= 0.4  # its own full window
