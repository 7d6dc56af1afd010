"""The window the coordinator signs into an overlapped round's manifest (peer/coordinator/phase_window.py):
H steps at the swarm's median step rate, from the commits it saw, moved round by round so that the
median peer takes H steps, less the time the peers' next phases have already run when it is signed
(their lag); a lying or absent peer does not move it. Each manifest here is signed when its last
commit arrives (now = the latest arrival) unless a test says otherwise."""

from __future__ import annotations

import pytest

from peer.coordinator.phase_window import FIRST_MEASURED_ROUND, GAIN, MIN_WINDOW_S, STEP_FACTOR, PhaseWindow


def test_no_window_until_a_peer_committed_twice_in_a_row_after_the_start_up():
    pacer = PhaseWindow(steps=25)
    assert pacer.next(0, {"a": (10.0, 25), "b": (10.5, 25)}, now=10.5) == 0  # round 0: no phase measured yet
    assert pacer.next(1, {"a": (12.5, 25), "b": (13.0, 25)}, now=13.0) == 0  # beside the first exchange: not measured
    assert pacer.next(3, {"a": (15.0, 25), "b": (15.5, 25)}, now=15.5) == 0  # round 2 missed: no consecutive commits
    assert FIRST_MEASURED_ROUND == 2


def test_the_first_window_is_h_steps_at_the_median_rate():
    pacer = PhaseWindow(steps=25)
    pacer.next(1, {"a": (10.0, 25), "b": (10.0, 25), "c": (10.0, 25)}, now=10.0)
    # phases of 2.5 s, 5 s and 4 s for 25 steps: rates 10, 5 and 6.25 steps/s; the median 6.25 -> 4 s,
    # less the median lag when the manifest leaves at 15.0 (a's next phase has run 2.5 s, b's 0, c's 1)
    assert pacer.next(2, {"a": (12.5, 25), "b": (15.0, 25), "c": (14.0, 25)}, now=15.0) == 3000


def test_the_window_moves_until_the_median_peer_takes_h_steps():
    pacer = PhaseWindow(steps=25)
    pacer.next(1, {"a": (0.0, 25), "b": (0.0, 25), "c": (0.0, 25)}, now=0.0)
    assert pacer.next(2, {"a": (2.5, 25), "b": (2.5, 25), "c": (2.5, 25)}, now=2.5) == 2500  # 10 steps/s
    # Windowed: every phase lasts 2.8 s (the window + the time to the manifest); the median peer took
    # 28 steps at 10 steps/s, 3 too many (0.3 s): the window shrinks by GAIN x 0.3 s.
    assert pacer.next(3, {"a": (5.3, 20), "b": (5.3, 28), "c": (5.3, 40)}, now=5.3) == round(1000 * (2.5 - GAIN * 0.3))
    # Now 25 at the median: the window stays.
    assert pacer.next(4, {"a": (7.95, 18), "b": (7.95, 25), "c": (7.95, 36)}, now=7.95) == round(1000 * (2.5 - GAIN * 0.3))


def test_one_peer_claiming_a_huge_rate_does_not_move_the_median():
    honest = PhaseWindow(steps=25)
    lied = PhaseWindow(steps=25)
    start = {p: (0.0, 25) for p in "abcde"}
    honest.next(1, start, now=0.0)
    lied.next(1, start, now=0.0)
    phases = {p: (5.0, 25) for p in "abcde"}
    assert lied.next(2, {**phases, "e": (5.0, 1000)}, now=5.0) == honest.next(2, phases, now=5.0) == 5000


def test_the_window_changes_by_a_bounded_factor_and_stays_positive():
    pacer = PhaseWindow(steps=25)
    pacer.next(1, {"a": (0.0, 25)}, now=0.0)
    assert pacer.next(2, {"a": (1.0, 25)}, now=1.0) == 1000
    # A phase of one step in 100 s (a stall): the window may grow by STEP_FACTOR at most.
    assert pacer.next(3, {"a": (101.0, 1)}, now=101.0) == pytest.approx(1000 * STEP_FACTOR)
    tiny = PhaseWindow(steps=1)
    tiny.next(1, {"a": (0.0, 1)}, now=0.0)
    assert tiny.next(2, {"a": (0.001, 1000)}, now=0.001) == round(MIN_WINDOW_S * 1000)


def test_a_takeover_goes_on_with_the_continued_manifests_window():
    successor = PhaseWindow(steps=25)
    successor.resume(2500)  # the manifest of the round in flight, signed by the previous active
    assert successor.next(5, {"a": (100.0, 25), "b": (100.0, 25)}, now=100.0) == 2500  # no rate of its own yet: the same
    # Its first measured phases: 30 steps in 2.8 s at the median (10.7 steps/s), 5 too many
    assert successor.next(6, {"a": (102.8, 30), "b": (102.8, 30)}, now=102.8) == round(1000 * (2.5 - GAIN * 5 / (30 / 2.8)))
    fresh = PhaseWindow(steps=25)
    fresh.resume(0)  # a manifest without one (fixed H): nothing to go on with
    assert fresh.next(5, {"a": (100.0, 25)}, now=100.0) == 0


def test_the_first_window_leaves_out_the_phase_already_run_and_the_next_holds_once_commits_line_up():
    pacer = PhaseWindow(steps=25)
    pacer.next(1, {"a": (0.0, 25), "b": (1.0, 25), "c": (2.0, 25)}, now=2.0)
    # Round 2 of H steps at 10 steps/s, but its commits spread over 2 s (a started early): when the
    # manifest leaves, a's next phase has run 2 s, b's 1 s, c's none. The median peer's phase is its
    # lag + the window: 1 s + 1.5 s = 25 steps.
    assert pacer.next(2, {"a": (2.5, 25), "b": (3.5, 25), "c": (4.5, 25)}, now=4.5) == round(1000 * (2.5 - 1.0))
    # Every phase closed 1.5 s after that manifest (6.0): a took 35 steps, b 25, c 15 (10 steps/s each),
    # and the commits line up (no lag). The window takes back the second the lag no longer gives:
    # the median peer's next phase holds 25 steps again.
    assert pacer.next(3, {"a": (6.0, 35), "b": (6.0, 25), "c": (6.0, 15)}, now=6.0) == 2500
    # Without the lag terms the window would have been 2.5 s, the aligned phases' median 35 steps,
    # and the next window 2.0 s: 20-step phases.


def test_a_lag_larger_than_the_phase_leaves_the_smallest_window():
    pacer = PhaseWindow(steps=25)
    pacer.next(1, {"a": (0.0, 25), "b": (0.0, 25), "c": (0.0, 25)}, now=0.0)
    assert pacer.next(2, {"a": (2.5, 25), "b": (2.5, 25), "c": (2.5, 25)}, now=12.5) == round(MIN_WINDOW_S * 1000)
