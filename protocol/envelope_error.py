"""EnvelopeError: a signed body (update, manifest, run state, slice result) that must be refused.

Its own floor, below envelope.py and keys.py, so that the coordinator-key check can raise one
without the key module importing the envelopes it guards.
"""

from __future__ import annotations


class EnvelopeError(ValueError):
    """An update or manifest that must be refused; `reason` is counted in status."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
