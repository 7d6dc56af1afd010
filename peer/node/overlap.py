"""Overlapped rounds: the exchange of round r runs in the background while round r+1 trains.

Selected by the run config (`rounds.overlap_communication`, `--overlap`); the synchronous
schedule is PeerNode.one_round. Both use the same node phases (train, make_update, commit,
exchange, finish_round), so only the schedule differs.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Protocol

import torch

from optim import eager as eager_math
from peer.learn.model import flat_params, load_flat_params
from peer.exchange.outcome import Applied, Resync, RoundOutcome
from peer.node import ranks
from peer.node.round import PeerRound, Update
from peer.node.thread_priority import lower_this_thread
from protocol.accounting import Traffic


class RoundPhases(Protocol):
    """What the overlapped schedule needs of a peer: its round phases and the state they move."""

    cfg: Any
    options: Any
    model: torch.nn.Module
    params: torch.Tensor
    round: int
    finished: bool
    math: Any

    def running(self, done: int, max_rounds: int | None) -> bool: ...
    def open_round(self, r: int) -> PeerRound: ...
    def train(self, r: int, *, steps: int | None = None, stop: Callable[[], bool] | None = None,
              closes: float | None = None) -> tuple[Any, float]: ...
    def make_update(self, r: int, delta: torch.Tensor, stats: Any) -> Update: ...
    def commit(self, update: Update, r: int, *, resync: bool = True) -> bool: ...
    def exchange(self, rnd: PeerRound) -> RoundOutcome: ...
    def finish_round(self, rnd: PeerRound, outcome: RoundOutcome, *, round_s: float | None = None,
                     after: Traffic | None = None) -> None: ...


def run_overlapped(node: RoundPhases, max_rounds: int | None = None) -> int:
    """Rounds with the exchange of round r running in the background while round r+1 trains.

    The inner steps of round r+1 start before θ_{r+1} is known, from a point P: with
    rounds.eager_updates (the default) the eager outer step of optim/eager.py (this peer's own
    Δ_r standing in for its share of the average in flight), otherwise its own local parameters
    at the end of round r. As soon as θ_{r+1} is known (after the inner step during which the
    exchange computed it, or at the phase's end if it takes longer), the local progress is moved
    onto it: θ_local = θ_{r+1} + (θ_local − P), and the phase's remaining steps run from there;
    Δ_{r+1} = −(progress made in round r+1). The round record's landed_after_steps says when.
    "Known" is when this peer computed θ_{r+1} (the exchange tells through the round's landing,
    peer/node/round.py), not when the coordinator confirmed the round (one more round trip, and
    the wait for the slowest peer's gathered report): the rest of the phase runs from it until
    the round's outcome comes, which is handled then (one that is not Applied, or a θ the
    coordinator did not sign, resynchronises as any round does) before the phase goes on.

    With a compute window (rounds.window_s > 0) the phase is sized by the swarm's clock, not the
    peer's: it closes window_s after this peer received round r's signed manifest (rest_of_phase),
    which every peer receives when the last commit of round r arrives. A peer that committed
    early trains longer (its work is weighted by what it claims), so the next commits line up
    instead of a fixed H keeping every peer's head start round after round. With no window set
    (rounds.window_s = 0) and rounds.overlap_window (the default), the window is the one the
    coordinator signed into the landed round's manifest (peer/coordinator/phase_window.py: H steps
    at the swarm's median rate); until one comes (the first rounds), phases take H steps.
    """
    done = 0
    pending: tuple[Future, PeerRound] | None = None  # the exchange in flight and its round
    anchor = node.params.clone()  # where the current inner phase started, (d,)
    eager = EagerStart(node.cfg.rounds.eager_updates)
    window = node.cfg.rounds.window_s  # 0: fixed H; otherwise a phase ends at the swarm's close
    # With no window set, the one the last landed manifest carried (rounds.overlap_window; 0: none,
    # H steps). A peer of several ranks does not cut its phases: it takes H steps whatever the swarm's.
    swarm_window = 0.0
    follows_swarm = ranks.world_size() == 1
    device = node.options.device
    lowered = False  # the training thread's priority (peer/node/thread_priority.py)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="swarmloco-exchange") as background:
        while node.running(done, max_rounds):
            rnd = node.open_round(node.round + (1 if pending is not None else 0))  # the round this phase's update is for
            r = rnd.r
            # The phase stops early once θ_r is known (this peer computed it, or the round's outcome
            # came), and the rest of it runs from θ_r + progress instead of from the estimated start.
            # In a window run its close is not known before the exchange lands (inf: until then).
            if pending is not None:
                in_flight, landing = pending[0], pending[1].landing  # this loop gives every round a landing
                stop = lambda: in_flight.done() or landing.done()  # noqa: E731
            stats, compute = node.train(r, stop=None if pending is None else stop,
                                        closes=math.inf if (window or swarm_window) and pending is not None else None)
            progress = flat_params(node.model).cpu() - anchor  # (d,)
            if pending is not None:
                (future, previous), pending = pending, None
                landed_after = stats.steps
                # θ_r computed, the coordinator's word on it not in yet: the rest of the phase runs from
                # it until the outcome comes, and the round is finished then (beside training, not at the
                # phase's end, where every peer's next exchange starts); then the phase goes on.
                early = landing.result() if not future.done() and landing.done() else None
                if early is not None:
                    swarm_window = early.window_s if follows_swarm else 0.0
                    stats, compute, anchor, progress = rest_of_phase(
                        node, r, early.params, anchor, progress, stats, compute, window=window or swarm_window,
                        manifest_at=early.manifest_at, started=rnd.started, stop=future.done)
                t_join = time.monotonic()
                outcome = future.result()
                if isinstance(outcome, Applied):
                    eager.joined(outcome.updates)
                    swarm_window = outcome.window_s if follows_swarm else 0.0
                    # Idle time is only what the join costs; the exchange itself ran beside training.
                    outcome.exchange_s = outcome.wait_s + outcome.fetch_s + outcome.aggregate_s
                    outcome.wait_s, outcome.landed_after_steps = time.monotonic() - t_join, landed_after
                # The round's own share of time and traffic: from its phase's start to this one's.
                node.finish_round(previous, outcome, round_s=rnd.started - previous.started, after=rnd.before)
                done += 1
                if node.round != r or node.finished or (max_rounds is not None and done >= max_rounds):
                    # Resynchronised or finished: this phase's progress has no valid base.
                    anchor = node.params.clone()
                    eager.forget()
                    continue
                # What is left of the phase, from θ_r as the round's outcome holds it (the same θ as an
                # early landing's, or the one a resync to this round brought: the progress moves onto it).
                stats, compute, anchor, progress = rest_of_phase(
                    node, r, node.params, anchor, progress, stats, compute, window=window or swarm_window,
                    manifest_at=outcome.timeline.get("manifest") if isinstance(outcome, Applied) else None, started=rnd.started)
            rnd.base, rnd.stats, rnd.compute_s = node.params.clone(), stats, compute
            local = node.params + progress  # θ_r + this phase's progress
            load_flat_params(node.model, local.to(device))
            delta = -progress  # Δ_r, (d,)
            # Before the background task starts: its exchange steps node.math's outer state. The
            # eager start reads only the outer's global state, which encoding Δ_r does not touch
            # (a DeMo transmit moves its local momentum, which its step never reads).
            start = eager.start(node, delta, r) if r + 1 < node.cfg.rounds.rounds else None
            if start is not None:
                load_flat_params(node.model, start.to(device))
            anchor = local if start is None else start
            # Encoding and signing the update, the commit's round trip and the exchange run in the
            # background, not between two inner phases (a refusal comes back as the round's Resync;
            # the phase's progress is then dropped, as for any resync).
            rnd.landing = Future()
            pending = (background.submit(commit_then_exchange, node, rnd, delta), rnd)
            if not lowered:  # once, now that the exchange's thread exists (it keeps its priority)
                lower_this_thread(node.options.train_priority)
                lowered = True
            if r + 1 >= node.cfg.rounds.rounds:
                break  # the last round: nothing left to overlap with
        if pending is not None:
            future, previous = pending
            node.finish_round(previous, future.result())
            done += 1
    return done


def rest_of_phase(node: RoundPhases, r: int, theta: torch.Tensor, anchor: torch.Tensor, progress: torch.Tensor, stats: Any,
                  compute: float, *, window: float, manifest_at: float | None, started: float,
                  stop: Callable[[], bool] | None = None) -> tuple[Any, float, torch.Tensor, torch.Tensor]:
    """θ_r (d,) landed mid-phase: move the phase's progress onto it (θ_local = θ_r + progress) and run
    what is left of the phase (until `stop`, if given, says otherwise): its H steps, or in a window
    run until the window closes, `window` seconds after this peer received the manifest of the round
    that landed (`manifest_at`, time.time(); without it, after the phase's own start). (stats,
    compute, anchor, progress) of the phase so far; unchanged when nothing is left."""
    left = (node.cfg.rounds.max_steps if window else node.cfg.inner.steps) - stats.steps
    closes = (started if manifest_at is None else on_monotonic_clock(manifest_at)) + window if window else None
    closed = closes is not None and time.monotonic() >= closes and stats.steps >= node.cfg.rounds.min_steps
    if left <= 0 or closed:
        return stats, compute, anchor, progress
    anchor = theta.clone()
    load_flat_params(node.model, (anchor + progress).to(node.options.device))
    more, more_compute = node.train(r, steps=left, stop=stop, closes=closes)
    return stats.then(more), compute + more_compute, anchor, flat_params(node.model).cpu() - anchor


def outcome_mark(outcome: RoundOutcome, mark: str) -> float | None:
    """When an applied round's exchange passed `mark` (its wall-clock timeline), on this process's
    time.monotonic() clock; None for another outcome or a round without that mark."""
    at = outcome.timeline.get(mark) if isinstance(outcome, Applied) else None
    return None if at is None else on_monotonic_clock(at)


def on_monotonic_clock(at: float) -> float:
    """A wall-clock time (time.time()) on this process's time.monotonic() clock."""
    return time.monotonic() - (time.time() - at)


def commit_then_exchange(node: RoundPhases, rnd: PeerRound, delta: torch.Tensor) -> RoundOutcome:
    """The background part of an overlapped round: encode and sign its update Δ (d,) with the
    phase's work (rnd.stats), commit it, then exchange it."""
    rnd.update = node.make_update(rnd.r, delta, rnd.stats)
    if not node.commit(rnd.update, rnd.r, resync=False):
        return Resync(f"round {rnd.r}: our update was refused")
    return node.exchange(rnd)


class EagerStart:
    """Where an overlapped inner phase starts (optim/eager.py): what the peer remembers between
    rounds is its own last Δ and how many updates the last average had."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.own_previous: torch.Tensor | None = None  # (d,) this peer's Δ in the last average
        self.peers = 0  # updates in the last average (0: none known yet)

    def joined(self, updates: int) -> None:
        self.peers = updates

    def forget(self) -> None:
        """After a resync the last Δ no longer belongs to the average that will be known."""
        self.own_previous, self.peers = None, 0

    def start(self, node: RoundPhases, own: torch.Tensor, round_: int) -> torch.Tensor | None:
        """The next phase's starting point given round `round_`'s own Δ (d,): the eager outer step
        from θ_r (node.params); None when disabled (the phase goes on from the local parameters)."""
        if not self.enabled:
            return None
        last = node.math.last_aggregate if self.peers else None
        start = eager_math.next_start(node.math.outer_at(round_), node.params, own, eager=True, mode=node.cfg.rounds.eager_estimate,
                                      last_average=last,
                                      own_previous=self.own_previous, peers=self.peers)
        self.own_previous = own
        return start
