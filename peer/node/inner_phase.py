"""A peer's inner phase: H AdamW steps on its shard (or, in a compute-window run, as many as fit in
rounds.window_s), with the progress the swarm sees (steps, loss, seconds computing, utilization)
and one progress line every --log-every steps.

The inner learning rate follows the steps this peer took (InnerTrainer.lr_at(trainer.step): the
warm-up counts steps, not rounds), so a slow peer warms up over its own steps, not the swarm's rounds."""

from __future__ import annotations

import time
from typing import Any, Callable

from peer.run.config import RunConfig
from peer.run.faults import fail_point
from peer.run.paced_window import paced_steps, wait_for_close
from peer.run.progress import step_line
from protocol.accounting import ByteCounter


class InnerPhase:
    def __init__(self, cfg: RunConfig, counter: ByteCounter, *, short: str, log_every: int,
                 on_progress: Callable[[], None] = lambda: None) -> None:
        self.cfg = cfg
        self.counter = counter
        self.short = short
        self.log_every = log_every
        self.on_progress = on_progress  # after every step and phase: the node republishes its snapshot
        self.step = 0  # the trainer's step count after the last step
        self.last_loss: float | None = None
        self.compute_s = 0.0  # seconds in inner steps, all phases
        self.training_started: float | None = None  # the first step: utilization excludes start-up
        self.phase_first_step = 0  # the trainer's step count when this round's phase began
        self.window_late_s = 0.0  # the last phase began this long after its window (window_from)

    def run(self, trainer: Any, r: int, *, steps: int | None = None, stop: Callable[[], bool] | None = None,
            closes: float | None = None, window_from: float | None = None) -> tuple[Any, float]:
        """H inner steps of round r (or the `steps` left of a phase that was cut): (stats, seconds).

        Overlapped rounds split a phase in two: `stop` ends the first call early (after the step
        during which the exchange in flight finished; stats.steps says how many ran), and the
        second call runs the `steps` left. Only a call that ran all it was asked ends the phase.

        A compute window (rounds.window_s > 0, or a `closes` given): the phase runs until `closes`
        (time.monotonic(); default: window_s seconds after it began), at least rounds.min_steps and
        at most rounds.max_steps steps. Overlapped rounds pass `closes`: inf for a first call whose
        close the exchange in flight will tell, then the swarm's close for the `steps` left (with
        window_s = 0, the window the coordinator signed into the manifest: rounds.overlap_window). Synchronous
        rounds pass `window_from`: when the swarm's window began (time.monotonic(), in the past,
        within half a window), so the phase closes window_s after it, not after this peer's own
        start. Under the
        test hook SWARMLOCO_STEP_S a phase on its own window takes the steps a machine of that
        speed fits (peer/run/paced_window.py)."""
        cfg = self.cfg
        if self.training_started is None:
            self.training_started = time.monotonic()
        self.counter.round = r
        window = cfg.rounds.window_s if steps is None or closes is not None else 0.0
        # A window closes this phase: the run's (rounds.window_s), or the swarm's that an overlapped
        # phase is given (`closes`: the manifest's window, RoundManifest.window_ms)
        windowed = bool(window) or closes is not None
        asked = (cfg.rounds.max_steps if windowed else cfg.inner.steps) if steps is None else steps
        if steps is None:
            self.phase_first_step = trainer.step
        first_step, call_first_step = self.phase_first_step, trainer.step
        t0 = time.monotonic()
        # The window's start: the swarm's, unless that is more than half a window ago (a stall, a long
        # checkpoint: the phase would shrink to min_steps) or in the future (a stepped clock); then ours.
        start = window_from if window_from is not None and t0 - window / 2 <= window_from <= t0 else t0
        self.window_late_s = t0 - start
        # SWARMLOCO_STEP_S (tests): a machine of a known speed, on a phase's own window
        paced = paced_steps(cfg.rounds) if window and closes is None else None
        if paced is not None:
            asked = paced
        elif windowed:
            closes = start + window if closes is None else closes
            stop = window_stop(trainer, closes=closes, min_steps=cfg.rounds.min_steps, also=stop, first=first_step)

        def on_step(step: int, loss: float) -> None:
            self.step, self.last_loss = step, loss
            self.on_progress()
            local_step = step - first_step
            if local_step % self.log_every == 0 or local_step == cfg.inner.steps:
                tokens_per_s = (step - call_first_step) * cfg.data.batch_size * cfg.model.seq_len / max(time.monotonic() - t0, 1e-9)
                print(step_line(self.short, r, cfg.rounds.rounds, local_step, cfg.inner.steps, loss, tokens_per_s,
                                self.counter.total(), mfu=trainer.mfu(tokens_per_s)), flush=True)

        stats = trainer.run(asked, on_step, log_every=self.log_every, stop=stop)
        if paced is not None:
            wait_for_close(start + window)  # that machine would still be computing
        compute = time.monotonic() - t0
        self.compute_s += compute
        self.on_progress()
        if stats.steps == asked or (windowed and time.monotonic() >= closes):
            fail_point("trained", r)
        return stats, compute


def window_stop(trainer: Any, *, closes: float, min_steps: int, also: Callable[[], bool] | None = None,
                first: int | None = None) -> Callable[[], bool]:
    """The stop hook of a compute window: true once the window has closed (time.monotonic() >=
    `closes`) and at least `min_steps` steps ran in this phase (since the trainer's step `first`;
    default: now), or when `also` says so."""
    first = trainer.step if first is None else first

    def stop() -> bool:
        return (time.monotonic() >= closes and trainer.step - first >= min_steps) or (also is not None and also())

    return stop
