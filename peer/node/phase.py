"""The phase a training peer is in: what its heartbeat reports and `swarmloco status` shows."""

from __future__ import annotations

import enum


class RoundPhase(enum.Enum):
    """One value at a time per peer; `.value` is the text on the wire (heartbeat "state")."""

    STARTING = "starting"  # connecting, joining, building the model
    SYNCING = "syncing"  # downloading the coordinator's checkpoint
    TRAINING = "training"  # inner steps (overlapped: the previous round's exchange runs beside them)
    COMMITTING = "committing"  # update encoded and signed; pushing / committing it
    WAITING = "waiting"  # committed; waiting for the round's manifest, fetching, aggregating
    FINISHED = "finished"  # the run did all its rounds
    STOPPED = "stopped"  # left early (--max-rounds, interrupted)
