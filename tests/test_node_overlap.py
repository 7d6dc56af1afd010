"""The overlapped schedule (peer/node/overlap.py) in process, on a toy peer whose every inner step
adds 1 to each of its 6 parameters and whose exchange lands θ_{r+1} = θ_r + 10 exactly after a
chosen inner step of the next phase: where the average lands, how the progress moves onto it,
what each round's pseudo-gradient is, and what a resync mid-overlap does."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
import torch

from optim import outer
from peer.exchange.outcome import Applied, Landing, Resync
from peer.learn.model import flat_params, load_flat_params
from peer.learn.training import InnerStats
from peer.node.overlap import EagerStart, run_overlapped
from peer.node.round import PeerRound, Update
from protocol.accounting import Traffic


class ToyPeer:
    def __init__(self, *, rounds: int, steps: int, land_after: int, resync_round: int | None = None,
                 window_s: float = 0.0, max_steps: int = 1000, swarm_window_s: float = 0.0, early: bool = False,
                 outcome_mid_rest: bool = False) -> None:
        self.cfg = SimpleNamespace(rounds=SimpleNamespace(rounds=rounds, eager_updates=False, eager_estimate="own",
                                                          window_s=window_s, max_steps=max_steps, min_steps=1),
                                   inner=SimpleNamespace(steps=steps))
        # (round, steps asked, closes as seconds from the call: inf or None kept) per train call
        self.calls: list[tuple[int, int | None, float | None]] = []
        self.manifest_age_s = 2.0  # the exchange's manifest arrived this long before it lands
        self.options = SimpleNamespace(device="cpu", train_priority="normal")
        self.model = torch.nn.Linear(2, 2)
        load_flat_params(self.model, torch.zeros(6))
        self.params = torch.zeros(6)
        self.round, self.finished, self.math = 0, False, None
        self.land_after, self.resync_round = land_after, resync_round
        self.landed = threading.Event()  # the exchange in flight may return
        self.sent: list[tuple[int, list[float]]] = []  # (round, Δ) as committed
        self.records: list[tuple[int, str, int | None]] = []  # (round, outcome, landed_after_steps)
        self._inflight: list = []
        self.swarm_window_s = swarm_window_s  # what every landed manifest carries (RoundManifest.window_ms)
        # early: the exchange tells θ_{r+1} (rnd.landed) when it lands, and returns the round's outcome
        # only once the rest of the phase has trained (a coordinator slow to confirm the round)
        self.early = early
        self.rest_trained = threading.Event()
        self.rest_step = threading.Event()  # the rest of a phase took its first step
        self.outcome_after_rest: list[bool] = []  # per early round: did the rest of the phase train before the outcome
        self.outcome_mid_rest = outcome_mid_rest  # early: the outcome comes one step into the rest of the phase

    def running(self, done: int, max_rounds: int | None) -> bool:
        return not self.finished and (max_rounds is None or done < max_rounds)

    def open_round(self, r: int) -> PeerRound:
        return PeerRound(r=r, base=self.params.clone(), started=time.monotonic(), before=Traffic(0, 0))

    def train(self, r, *, steps=None, stop=None, closes=None):
        self.calls.append((r, steps, closes - time.monotonic() if closes is not None and closes < float("inf") else closes))
        asked, done = steps or self.cfg.inner.steps, 0
        for _ in range(asked):
            load_flat_params(self.model, flat_params(self.model) + 1)
            done += 1
            if steps is not None and stop is not None and self.outcome_mid_rest:  # the rest of a phase, before its outcome
                self.rest_step.set()
                deadline = time.monotonic() + 30
                while stop is not None and done == 1 and not stop() and time.monotonic() < deadline:
                    time.sleep(0.001)  # the outcome arrives exactly here
            if stop is not None:
                if done == self.land_after and steps is None:  # the phase's first call: the exchange lands here
                    self.landed.set()
                    deadline = time.monotonic() + 30
                    while not stop() and time.monotonic() < deadline:  # the exchange returns now: land exactly here
                        time.sleep(0.001)
                if stop():
                    break
        if steps is not None:  # the rest of a phase, after θ_r landed
            self.rest_trained.set()
        return InnerStats(steps=done, mean_loss=0.0, last_loss=0.0, tokens=0, seconds=0.0), 0.0

    def make_update(self, r: int, delta: torch.Tensor, stats=None) -> Update:
        self.sent.append((r, delta.tolist()))
        return Update(signed=None, payload=b"", encode_s=0.0)

    def commit(self, update: Update, r: int, *, resync: bool = True) -> bool:
        return True

    def exchange(self, rnd: PeerRound):
        if rnd.r + 1 < self.cfg.rounds.rounds:  # the last round has no next phase to land in
            assert self.landed.wait(30)
        self.landed.clear()
        if self.early and rnd.r + 1 < self.cfg.rounds.rounds:
            rnd.landed(Landing(params=rnd.base + 10, manifest_at=time.time() - self.manifest_age_s, window_s=self.swarm_window_s))
            self.outcome_after_rest.append((self.rest_step if self.outcome_mid_rest else self.rest_trained).wait(10))
            self.rest_trained.clear()
            self.rest_step.clear()
        if rnd.r == self.resync_round:
            return Resync("parameter hash differs")
        return Applied(params=rnd.base + 10, updates=1, timeline={"manifest": time.time() - self.manifest_age_s},
                       window_s=self.swarm_window_s)

    def finish_round(self, rnd, outcome, *, round_s=None, after=None) -> None:
        match outcome:
            case Applied():
                self.params, self.round = outcome.params.clone(), rnd.r + 1
                self.records.append((rnd.r, "applied", outcome.landed_after_steps))
            case Resync():  # the swarm's state: θ = 100 at round 5
                self.params, self.round = torch.full((6,), 100.0), 5
                load_flat_params(self.model, self.params)
                self.records.append((rnd.r, "resync", None))


def test_the_average_lands_mid_phase_and_the_progress_moves_onto_it():
    peer = ToyPeer(rounds=3, steps=4, land_after=1)
    assert run_overlapped(peer) == 3
    # Every round's Δ is minus exactly H = 4 steps of progress, measured from where the phase
    # stood once θ_r had landed (not from the stale start): 4 x (+1) per parameter.
    assert peer.sent == [(0, [-4.0] * 6), (1, [-4.0] * 6), (2, [-4.0] * 6)]
    assert peer.records == [(0, "applied", 1), (1, "applied", 1), (2, "applied", None)]
    assert peer.params.tolist() == [30.0] * 6 and peer.round == 3
    # θ_3 plus the progress of no further phase: the model ends at θ_2 + 4 steps (its last phase)
    assert flat_params(peer.model).tolist() == [24.0] * 6


def test_the_phase_moves_onto_theta_once_computed_not_once_the_coordinator_confirms():
    """The exchange tells θ_{r+1} when it has computed it; its outcome (the coordinator's word, a
    round trip and the slowest peer's report later) comes after the rest of the phase trained from
    it: the same Δs, θ and record as when both come at once."""
    peer = ToyPeer(rounds=3, steps=4, land_after=1, early=True)
    assert run_overlapped(peer) == 3
    assert peer.outcome_after_rest == [True, True]  # neither round waited for its outcome to go on
    assert peer.sent == [(0, [-4.0] * 6), (1, [-4.0] * 6), (2, [-4.0] * 6)]
    assert peer.records == [(0, "applied", 1), (1, "applied", 1), (2, "applied", None)]
    assert peer.params.tolist() == [30.0] * 6 and peer.round == 3
    assert flat_params(peer.model).tolist() == [24.0] * 6


def test_an_outcome_mid_phase_is_handled_at_once_and_the_phase_goes_on():
    """The outcome comes one step into the rest of the phase: the round is finished there (the
    training thread's work on it beside training, not at the phase's end) and the phase goes on
    from θ: the same Δs, θ and records, and the rest of the phase split in two."""
    peer = ToyPeer(rounds=3, steps=4, land_after=1, early=True, outcome_mid_rest=True)
    assert run_overlapped(peer) == 3
    assert peer.outcome_after_rest == [True, True]
    assert peer.sent == [(0, [-4.0] * 6), (1, [-4.0] * 6), (2, [-4.0] * 6)]
    assert peer.records == [(0, "applied", 1), (1, "applied", 1), (2, "applied", None)]
    assert peer.params.tolist() == [30.0] * 6 and flat_params(peer.model).tolist() == [24.0] * 6
    # phases 1 and 2: the first call (landing after 1 step), then 1 step until the outcome, then the 2 left
    assert [(r, steps) for r, steps, _ in peer.calls] == [(0, None), (1, None), (1, 3), (1, 2), (2, None), (2, 3), (2, 2)]


def test_a_resync_after_an_early_landing_drops_the_phase_trained_on_it():
    peer = ToyPeer(rounds=8, steps=4, land_after=2, resync_round=0, early=True)
    assert run_overlapped(peer, max_rounds=2) == 2
    assert peer.outcome_after_rest[0] is True  # the rest of the phase ran on the θ computed early
    assert peer.records[0] == (0, "resync", None)
    assert peer.sent[0] == (0, [-4.0] * 6) and peer.sent[1] == (5, [-4.0] * 6)  # from θ = 100, anew


@pytest.mark.parametrize("land_after", [1, 3])
def test_where_it_lands_is_recorded(land_after):
    peer = ToyPeer(rounds=2, steps=4, land_after=land_after)
    run_overlapped(peer)
    assert peer.records[0] == (0, "applied", land_after)


def test_a_resync_mid_overlap_drops_the_phase_progress_and_starts_from_the_swarm_state():
    peer = ToyPeer(rounds=8, steps=4, land_after=2, resync_round=0)
    assert run_overlapped(peer, max_rounds=2) == 2
    assert peer.records[0] == (0, "resync", None)
    # The phase that ran beside round 0 had no valid base: round 5 (the resynced one) trains anew
    # from θ = 100 and sends minus its 4 steps.
    assert peer.sent[0] == (0, [-4.0] * 6) and peer.sent[1] == (5, [-4.0] * 6)


def test_a_commit_refused_in_the_background_resyncs_like_any_round():
    """Overlapped, the commit's round trip runs beside the next phase (not between two phases): a
    refusal that needs the swarm's state comes back as the round's Resync, and no exchange runs."""
    peer = ToyPeer(rounds=8, steps=4, land_after=2)
    refused: list[int] = []

    def commit(update, r, *, resync=True):
        assert resync is False  # the main thread resynchronises, in finish_round
        if r == 0:
            refused.append(r)
        return r != 0

    peer.commit = commit
    assert run_overlapped(peer, max_rounds=2) == 2
    assert refused == [0] and peer.records[0] == (0, "resync", None)
    assert peer.sent[0] == (0, [-4.0] * 6) and peer.sent[1] == (5, [-4.0] * 6)


def test_a_window_phase_closes_at_the_swarm_clock_not_its_own_start():
    """rounds.window_s with overlap: a phase's close is window_s after this peer received the
    manifest of the round in flight (the swarm's close of that round), not window_s after the
    phase began: unknown (inf) until the exchange lands, then the rest of the phase runs to it."""
    peer = ToyPeer(rounds=3, steps=4, land_after=1, window_s=5.0, max_steps=9)
    assert run_overlapped(peer) == 3
    first, (r1, none_steps, unknown), (r1b, left, closes_in) = peer.calls[:3]
    assert first == (0, None, None)  # round 0: nothing in flight, the peer's own window
    assert (r1, none_steps, unknown) == (1, None, float("inf"))
    # landed after 1 step: the rest (up to max_steps 9) runs until manifest + 5 s = 3 s after the landing
    assert (r1b, left) == (1, 8) and 1.5 < closes_in <= 3.0
    assert peer.records[0] == (0, "applied", 1)


def test_with_no_window_set_a_phase_closes_on_the_window_the_manifest_carried():
    """rounds.window_s = 0 with the coordinator sizing phases (rounds.overlap_window): the first
    overlapped phase takes H steps (no window known before its landing), the rest of it runs to the
    landed manifest's window (arrival + 5 s); every later phase trains until its landing (inf), then
    to that manifest's close."""
    peer = ToyPeer(rounds=4, steps=4, land_after=1, max_steps=9, swarm_window_s=5.0)
    assert run_overlapped(peer) == 4
    (r0, _, c0), (r1, _, c1), (r1b, left, closes_in), (r2, _, c2), (r2b, left2, closes2) = peer.calls[:5]
    assert (r0, c0) == (0, None) and (r1, c1) == (1, None)  # round 1: nothing landed yet, H steps
    assert (r1b, left) == (1, 8) and 1.5 < closes_in <= 3.0  # landed after 1 of max 9, closes 3 s on
    assert (r2, c2) == (2, float("inf"))  # a window known: trains until the landing
    assert (r2b, left2) == (2, 8) and 1.5 < closes2 <= 3.0


def test_a_manifest_without_a_window_keeps_h_steps():
    peer = ToyPeer(rounds=3, steps=4, land_after=1, max_steps=9, swarm_window_s=0.0)
    run_overlapped(peer)
    assert [c[2] for c in peer.calls] == [None] * 5 and [c[1] for c in peer.calls if c[1]] == [3, 3]


def test_fixed_h_overlap_passes_no_close():
    peer = ToyPeer(rounds=2, steps=4, land_after=1)
    run_overlapped(peer)
    assert [c[2] for c in peer.calls] == [None, None, None] and peer.calls[2][1] == 3


def test_eager_start_disabled_keeps_the_local_parameters():
    start = EagerStart(enabled=False)
    node = SimpleNamespace(math=None, params=torch.ones(2), cfg=None)
    assert start.start(node, torch.ones(2), 0) is None


def test_eager_start_is_an_outer_step_on_a_copy_with_this_peers_delta():
    opt = outer.build("nesterov", lr=0.7, momentum=0.9)
    math = SimpleNamespace(outer_at=lambda r: opt, last_aggregate=None)
    node = SimpleNamespace(math=math, params=torch.tensor([1.0, 2.0]),
                           cfg=SimpleNamespace(rounds=SimpleNamespace(eager_estimate="own")))
    start = EagerStart(enabled=True)
    point = start.start(node, torch.tensor([1.0, 0.0]), 0)
    # fresh Nesterov: buf = g, step = lr (g + m buf) = 0.7 x 1.9 g
    assert point.tolist() == pytest.approx([1.0 - 1.33, 2.0])
    assert opt.momentum_buffer is None or not opt.momentum_buffer.any()  # the real outer state is untouched
    assert start.own_previous.tolist() == [1.0, 0.0]
    start.joined(4)
    assert start.peers == 4
    start.forget()
    assert start.own_previous is None and start.peers == 0
