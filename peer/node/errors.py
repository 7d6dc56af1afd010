"""Why a training peer stops: PeerExit, raised from any phase, caught by the CLI."""

from __future__ import annotations


class PeerExit(Exception):
    """The peer must stop; the message says why and what to do."""
