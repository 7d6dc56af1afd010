"""Who owns which slice in a round, and which of several signed slice results to believe.

Owners are drawn after the commit phase closes, from a seed that hashes every listed update's
payload sha256: nobody knows the others' payloads before committing, so nobody can steer which
slices they (or their friends) will own. Only peers that serve (not --client-mode) own; each of
the S slices gets r = min(replicas, servers) distinct owners, spread evenly (every server owns
about S·r/m slices). The draw is a pure function of the manifest, so every node checks it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass


def owner_seed(run_id: str, round_: int, payload_sha256s: Sequence[str]) -> bytes:
    text = "/".join([run_id, str(round_), *sorted(payload_sha256s)])
    return hashlib.sha256(text.encode()).digest()


def assign_owners(servers: Sequence[str], num_slices: int, replicas: int, seed: bytes) -> list[list[str]]:
    """owners[j] = the r peer_ids that own slice j (distinct; [] when nobody serves)."""
    ordered = sorted(set(servers), key=lambda peer_id: hashlib.sha256(seed + peer_id.encode()).digest())
    m = len(ordered)
    if m == 0:
        return [[] for _ in range(num_slices)]
    r = min(replicas, m)
    return [[ordered[(j * r + k) % m] for k in range(r)] for j in range(num_slices)]


def owned_by(owners: Sequence[Sequence[str]], peer_id: str) -> list[int]:
    return [j for j, slice_owners in enumerate(owners) if peer_id in slice_owners]


@dataclass(frozen=True, slots=True)
class Claim:
    """One owner's word on slice j: the result's sha256 over an input set."""

    owner: str
    result_sha256: str
    result_size: int
    inputs: tuple[str, ...]


def distinct_claims(claims: Sequence[Claim]) -> list[tuple[str, tuple[str, ...]]]:
    """The different (result_sha256, inputs) pairs, most inputs first, then by hash: the order
    in which every node prefers them once they are verified."""
    pairs = {(c.result_sha256, c.inputs) for c in claims}
    return sorted(pairs, key=lambda pair: (-len(pair[1]), pair[0]))


def liars(claims: Sequence[Claim], verified: dict[tuple[str, tuple[str, ...]], bool]) -> list[Claim]:
    """Claims whose recomputation over their own inputs gave other bytes."""
    return [c for c in claims if verified.get((c.result_sha256, c.inputs)) is False]


def lie_survival(owner_fraction_byzantine: float, replicas: int, num_slices: int, spot_checks: int, honest_peers: int) -> dict[str, float]:
    """How likely colluding owners get a lie through one round, and how long they last.

    A lie needs all r owners of a slice Byzantine: p_slice = β^r (β = Byzantine share of
    servers). It survives the round when none of the h honest peers spot-checks that slice:
    each checks k of S slices at random, so (1 − k/S)^h. Expected rounds until a colluding pair
    that lies every time it can is caught: 1 / (p_slice·(1 − (1 − k/S)^h)) rounds in which it
    owns a slice together... reported here per round and per lie."""
    p_all_owners = owner_fraction_byzantine**replicas
    p_unchecked = (1 - spot_checks / num_slices) ** honest_peers
    return {
        "p_slice_all_byzantine": p_all_owners,
        "p_lie_unchecked": p_unchecked,
        "p_caught_per_lie": 1 - p_unchecked,
        "expected_lies_before_caught": 1 / max(1e-12, 1 - p_unchecked),
    }
