"""What share of a compute-window round this machine could fill (`swarmloco preflight` in a run
with rounds.window_s > 0; shared/DESIGN.md, "Heterogeneous peers").

From the measured inner-step time: the steps this machine would take in the window (as the node
does: it trains until the window has closed, at least rounds.min_steps and at most
rounds.max_steps), the tokens they are, and the weight they would get among the work the other
peers' headers claimed last round, capped with the owners' math (peer/run/work_math.py): a
newcomer has no history, so only the round's median and the minority cap bind. A machine whose
rounds.min_steps outlast the window makes every round wait for it; that is said too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from peer.run.work_math import RowWork, capped


@dataclass(frozen=True, slots=True)
class WindowShare:
    steps: int  # inner steps this machine would take in one window
    tokens: int
    phase_s: float  # seconds its phase would last (longer than the window when min_steps binds)
    share: float | None  # its share of the round's counted work (None: no other peer has reported work)
    uncapped_share: float | None  # its share of the tokens trained
    capped_by: str  # "" or what capped its weight ("median", "minority")
    others: int  # how many peers' last work it is compared with


def window_steps(*, window_s: float, step_s: float, min_steps: int, max_steps: int) -> int:
    """The inner steps a machine taking `step_s` seconds a step takes in a `window_s` window, as the
    node trains (until the window has closed, checked after each step): ceil(window_s / step_s),
    at least min_steps, at most max_steps."""
    if not (window_s > 0 and step_s > 0):
        raise ValueError(f"window_s={window_s!r}, step_s={step_s!r}: both must be > 0")
    return min(max_steps, max(min_steps, math.ceil(window_s / step_s - 1e-9)))


def window_share(*, window_s: float, step_s: float, min_steps: int, max_steps: int, tokens_per_step: int,
                 others_tokens: list[int], num_byzantine: int) -> WindowShare:
    """This machine's steps in the window and its share among `others_tokens` (the tokens each
    other live peer's last counted update claimed)."""
    steps = window_steps(window_s=window_s, step_s=step_s, min_steps=min_steps, max_steps=max_steps)
    tokens = steps * tokens_per_step
    others = [t for t in others_tokens if t > 0]
    if not others:
        return WindowShare(steps, tokens, steps * step_s, None, None, "", 0)
    claims = (tokens, *others)
    shares = capped(RowWork(claims, (None,) * len(claims)), num_byzantine)
    return WindowShare(steps, tokens, steps * step_s, shares.weights[0] / sum(shares.weights), tokens / sum(claims),
                       shares.capped_by[0], len(others))


def describe(w: WindowShare, window_s: float, min_steps: int) -> list[str]:
    """The lines preflight prints about the window."""
    lines = [f"in the {window_s:g} s window this machine would take {w.steps} inner steps ({w.tokens:,} tokens)"]
    if w.phase_s > window_s * 1.05:
        lines.append(f"its rounds.min_steps = {min_steps} take {w.phase_s:.1f} s, longer than the window: every round "
                     f"would wait for it; a faster device (or a run with a lower min_steps) fits")
    if w.share is None:
        lines.append("no peer has reported work yet: its share of the round shows once one has")
    else:
        cap = f", capped by the {w.capped_by} cap" if w.capped_by else ""
        lines.append(f"against the {w.others} live peers' last work it would fill {w.share:.1%} of the round's counted work"
                     f"{cap} ({w.uncapped_share:.1%} of the tokens trained)")
    return lines
