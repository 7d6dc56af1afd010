"""The swarm's clock for overlapped rounds (rounds.overlap_window): how long the next phase runs.

Overlapped, a peer starts the phase of round r + 1 the moment it commits round r. With a fixed H a
faster peer then commits earlier every round, and the average of a round lands later and later in
its next phase (benchmarks/wan.md: 0.72 of H at 4 peers, the fast peer's lag growing from round to
round). Instead, each manifest carries the window of the phase its arrival starts
(RoundManifest.window_ms); every peer closes that phase window_ms after it received the manifest
(peer/node/overlap.py), so the next round's commits line up whatever each peer's speed.

The coordinator sizes the window from the commits it sees. A peer's rate is the steps its header
claims over the time since its commit of the round before (its phase: overlapped phases run back
to back). A peer's next phase began at its commit, so when the manifest leaves it has already
run for a while: its lag, now minus its commit's arrival; its phase lasts lag + W. The window
moves so that the median peer takes H steps:

    W' = W + GAIN x (H - median steps) / median rate + (median lag before - median lag now)
    (the first one: H / median rate - median lag now)

at most a factor of 4 per round. The lag terms are what the coordinator knows before the phase
runs: the first window, signed after rounds of H steps whose commits spread over seconds, would
otherwise give the early committers' long phases to every peer's count (8 peers: the first
windowed phases ran 34-47 steps, the window then shrank to 17-24-step phases and grew back over
rounds); once commits line up, lags are equal and the feedback on steps alone remains, which also
takes in what the lag does not see (the commit's encode and one-way delays). Half a step (GAIN): a phase's rate is not the machine's, it falls as
the phase shortens (the exchange's CPU is a fixed cost per round beside training: 8 peers on 2
cores measured 1.7 steps/s in a 7 s window and 3.6 in a 13 s one), so a full correction overshoots;
the window swung between 6 and 13 s round after round. One peer lying about its steps moves one rate of n, and only the
median counts (its weight is capped as in any window run: peer/run/work_math.py). With no rate known
(rounds 0 and 1, see FIRST_MEASURED_ROUND; the first round after a takeover) the window stays what
it was: none at first, and the peers then take H steps; after a takeover, the window of the manifest
it continued (resume).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping

from protocol.envelope import MAX_WINDOW_MS

# The phase of round 1 runs beside the swarm's first exchange, which carries its start-up (every
# channel opened, first fetches, first state writes): 8 peers on 2 cores trained at 2.2k tokens/s in
# it against 5.1k in round 0's, and a window sized on it was twice too long. Phases from round 2 on.
FIRST_MEASURED_ROUND = 2
STEP_FACTOR = 4.0  # the window changes by at most this factor from one round to the next
GAIN = 0.5  # the share of the measured error corrected in one round
MIN_WINDOW_S = 0.05


class PhaseWindow:
    def __init__(self, steps: int) -> None:
        self.steps = steps  # H: what the median peer's phase should hold
        self.window_s = 0.0  # the window last signed (0: none yet)
        self._last: dict[str, tuple[int, float]] = {}  # peer_id -> (round, when its commit arrived)
        self._lag: float | None = None  # the median lag when the last manifest was signed (None: unknown)

    def resume(self, window_ms: int) -> None:
        """A takeover continues the round in flight under the manifest the previous active signed:
        its window goes on as ours until we have measured the peers' rates ourselves."""
        if self.window_s == 0 and window_ms > 0:
            self.window_s = window_ms / 1000

    def next(self, round_: int, commits: Mapping[str, tuple[float, int]], *, now: float | None = None) -> int:
        """The window_ms to sign into round `round_`'s manifest, from its listed commits: peer_id ->
        (when the commit arrived, time.monotonic(); the inner steps its header claims); `now`: when
        it is signed (time.monotonic())."""
        now = time.monotonic() if now is None else now
        rates, steps = [], []
        for peer_id, (arrived, claimed) in commits.items():
            seen = self._last.get(peer_id)
            if round_ >= FIRST_MEASURED_ROUND and seen is not None and seen[0] == round_ - 1 and arrived > seen[1] and claimed > 0:
                rates.append(claimed / (arrived - seen[1]))
                steps.append(claimed)
        self._last = {peer_id: (round_, arrived) for peer_id, (arrived, _) in commits.items()}
        lag = statistics.median(max(0.0, now - arrived) for arrived, _ in commits.values()) if commits else 0.0
        lag_before, self._lag = (lag if self._lag is None else self._lag), lag
        if rates:
            rate, done = statistics.median(rates), statistics.median(steps)
            if self.window_s == 0:
                target = self.steps / rate - lag
            else:
                target = self.window_s + GAIN * (self.steps - done) / rate + (lag_before - lag)
                target = min(max(target, self.window_s / STEP_FACTOR), self.window_s * STEP_FACTOR)
            self.window_s = max(target, MIN_WINDOW_S)
        return min(round(self.window_s * 1000), MAX_WINDOW_MS)
