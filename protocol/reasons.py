"""Why something was refused or left out of a round: one name per reason, as it travels.

A `Reason` is a `StrEnum`: its value is the text the wire and the status views carry (the
manifest's `excluded` map, a refusal's counted name, the registry's rejection counters), so
code compares and raises members, never bare strings, and an older peer still reads the text.
"""

from __future__ import annotations

import enum


class Reason(enum.StrEnum):
    # the update itself is faulty: each proves its author faulty (see FOR_CAUSE)
    NON_FINITE = "non-finite"
    UNDECODABLE = "undecodable"
    WRONG_SHAPE = "wrong-shape"
    EQUIVOCATION = "equivocation"
    HASH_MISMATCH = "hash-mismatch"
    SIZE_MISMATCH = "size-mismatch"
    # late or unreachable: not a fault of the update
    LATE = "late"
    UNREACHABLE = "unreachable"
    NO_PAYLOAD = "no-payload"
    # who may send what, and when
    UNKNOWN_PEER = "unknown-peer"
    WRONG_ENDPOINT = "wrong-endpoint"
    STALE_ROUND = "stale-round"
    WRONG_ROUND = "wrong-round"
    WRONG_BASE = "wrong-base"
    BANNED = "banned"
    RUN_FINISHED = "run-finished"
    WRONG_RUN = "wrong-run"
    STALE_JOIN = "stale-join"
    STALE_HEARTBEAT = "stale-heartbeat"
    NOT_ALLOWED = "not-allowed"
    NOT_OWNER = "not-owner"
    WRONG_TOKENIZER = "wrong-tokenizer"
    DUPLICATE_SESSION = "duplicate-session"  # a second live process of one key (Join or heartbeat)
    UNREACHABLE_ENDPOINT = "unreachable-endpoint"  # a Join whose announced endpoint the coordinator cannot dial
    # signatures and envelopes
    BAD_SIGNATURE = "bad-signature"
    FORGED = "forged"
    BAD_KEY = "bad-key"
    WRONG_TAG = "wrong-tag"
    WRONG_CODEC = "wrong-codec"
    WRONG_LAYOUT = "wrong-layout"
    BAD_TRANSFER = "bad-transfer"
    MALFORMED = "malformed"
    BAD_WORK = "bad-work"  # an update header claiming more work than the run allows
    OVERSIZED = "oversized"
    BAD_OFFSET = "bad-offset"
    # load
    RATE_LIMITED = "rate-limited"
    ADMISSION_LIMITED = "admission-limited"
    REGISTRY_FULL = "registry-full"
    BUSY = "busy"


# Exclusion reasons that prove the author faulty (as opposed to late or unreachable): each one is
# a declared Byzantine peer already out of the round.
FOR_CAUSE = frozenset({Reason.NON_FINITE, Reason.UNDECODABLE, Reason.WRONG_SHAPE, Reason.EQUIVOCATION,
                       Reason.HASH_MISMATCH, Reason.SIZE_MISMATCH})


def count_for_cause(excluded: dict[str, str]) -> int:
    """How many of a manifest's exclusions (peer_id -> reason text) are for cause."""
    return sum(reason in FOR_CAUSE for reason in excluded.values())
