"""Who owns which slice in a round, and which of several signed slice results to believe.

Owners are drawn after the commit phase closes, from a seed that hashes every listed update's
payload sha256: nobody knows the others' payloads before committing, so nobody can steer which
slices they (or their friends) will own. Only peers that serve (not --client-mode) own; each of
the S slices gets r = min(replicas, servers) distinct owners, spread evenly (every server owns
about S·r/m slices). The draw is a pure function of the manifest, so every node checks it.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Mapping, Sequence


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


def swap_partners(owners: Sequence[Sequence[str]], peer_ids: Sequence[str], me: str) -> tuple[list[str], list[str]]:
    """The reduce-scatter's trades (SwapSlices): every two peers that both own slices want slices
    of each other's update, and ONE stream carries both ways, opened by one of the two. Peers that
    own (in `peer_ids`' order, the manifest's) sit on a circle and each opens the streams to the
    next half of it (a round-robin tournament), so each opens about (m - 1) / 2 and takes as many.
    -> (the owners `me` opens a stream to, the owners that open one to `me`); ([], []) when `me`
    owns nothing. A pure function of the manifest: both ends of a pair agree on who opens."""
    traders = [p for p in dict.fromkeys(peer_ids) if any(p in o for o in owners)]
    if me not in traders:
        return [], []
    m, i = len(traders), traders.index(me)
    opens, awaits = [], []
    for k, other in enumerate(traders):
        if k == i:
            continue
        d = (k - i) % m
        (opens if d < m - d or (d == m - d and i < k) else awaits).append(other)
    return opens, awaits


def result_routes(owners: Sequence[Sequence[str]], peer_ids: Sequence[str], me: str) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """Who hands whom which aggregated slice over their trade (protocol/result_relay.py): each
    slice a peer does not own comes to it from ONE of the slice's r owners, the (k mod r)-th for
    the k-th of the slice's gatherers in `peer_ids`' order (the manifest's), so a slice's owners
    split its gatherers evenly. -> (gatherer -> the slices `me` sends it, owner -> the slices it
    sends `me`). A pure function of the manifest: both ends of a trade compute the same."""
    send: dict[str, list[int]] = {}
    receive: dict[str, list[int]] = {}
    for j, slice_owners in enumerate(owners):
        if not slice_owners:
            continue
        gatherers = [p for p in peer_ids if p not in slice_owners]
        if me in slice_owners:
            for k, gatherer in enumerate(gatherers):
                if slice_owners[k % len(slice_owners)] == me:
                    send.setdefault(gatherer, []).append(j)
        elif me in gatherers:
            receive.setdefault(slice_owners[gatherers.index(me) % len(slice_owners)], []).append(j)
    return send, receive


def spot_check_probability(spot_checks: int, coverage: float, num_slices: int, checkers: int) -> float:
    """Chance that one node (a peer, or the coordinator) runs its spot checks this round:
    min(1, coverage·S / (n·k)), so the swarm recomputes each slice about `coverage` times per round
    whatever its size, and a node's expected spot-check bytes, p·k·(n − 1)·P/S, stay ≤ coverage·P."""
    if spot_checks <= 0 or checkers <= 0:
        return 0.0
    return min(1.0, coverage * num_slices / (checkers * spot_checks))


def expected_traffic(n: int, payload: float, result: float, replicas: int, servers: int | None = None, *,
                     spot_checks: int = 0, coverage: float = 0.5, num_slices: int = 1) -> dict[str, float]:
    """Expected bytes one serving peer sends and receives per round in the sliced exchange (the
    owner draw spreads slices evenly, so these are averages over peers; docs/sliced-exchange.md).

    n updates of `payload` bytes, aggregated slices adding up to `result` bytes, `servers` = m
    serving peers (default n), r = min(replicas, m) owners per slice:
      sent     = (r − r/m)·P  (each slice to its owners, minus ours)  + (n − r + 1)/m·A (results we serve)
      received = r·(n − 1)/m·P (inputs of the slices we own)           + (1 − r/m)·A    (results of the others)
      + spot checks, both ways: k·p·((n − 1)·P − A)/S, p = spot_check_probability (bounded in n: ≤ coverage·P)
    """
    m = n if servers is None else servers
    r = min(replicas, m)
    # A spot check fetches a slice's n − 1 inputs instead of its aggregate; run with probability p.
    checks = spot_checks * spot_check_probability(spot_checks, coverage, num_slices, n) if r < m else 0.0  # r ≥ m: every slice is ours
    spot = checks * max(0.0, (n - 1) * payload - result) / num_slices
    return {"sent": (r - r / m) * payload + (n - r + 1) / m * result + spot,  # authors serve the checkers' fetches
            "received": r * (n - 1) / m * payload + (1 - r / m) * result + spot}


def cover(candidates: Mapping[int, Sequence[str]], rng: random.Random) -> dict[int, str]:
    """slice -> the one holder to ask for it, from `candidates` (slice -> who holds it), asking as
    few holders as possible (greedy set cover: the holder that holds most of what is still
    wanted first, ties drawn at random so that the swarm's askers spread over a slice's owners).
    A phase pays one stream per holder asked (issue 24): with r = 2 the owner draw gives pairs
    that own the same slices, so a peer gathering at 8 peers asks 3 owners, not 7. A slice with
    no candidate is left out."""
    left = {j: set(holders) for j, holders in candidates.items() if holders}
    chosen: dict[int, str] = {}
    while left:
        counts: dict[str, int] = {}
        for holders in left.values():
            for h in holders:
                counts[h] = counts.get(h, 0) + 1
        most = max(counts.values())
        pick = rng.choice(sorted(h for h, c in counts.items() if c == most))
        for j in [j for j, holders in left.items() if pick in holders]:
            chosen[j] = pick
            del left[j]
    return chosen


def distinct_claims(claims: Iterable[tuple[str, tuple[str, ...]]]) -> list[tuple[str, tuple[str, ...]]]:
    """The different (result_sha256, inputs) claims of a slice's owners, most inputs first, then
    by hash: the order in which every node prefers them once they are verified."""
    return sorted(set(claims), key=lambda pair: (-len(pair[1]), pair[0]))


def collusion_odds(servers: int, byzantine: int, replicas: int, slices: int, spot_checks: int,
                   honest_checkers: int | None = None, trials: int = 20_000, seed: int = 0,
                   coverage: float = 0.5) -> dict[str, float]:
    """How often colluding owners can lie, and how soon spot checks catch them, under this
    module's real owner draw (Monte Carlo over draws; each with probability spot_check_probability,
    the coordinator and every honest peer recompute `spot_checks` random slices they do not own).

    Colluders lie on every slice whose owners are all theirs (a slice with one honest owner would
    be a disagreement: recomputed and caught at once). Returns the chance that a round offers them
    such a slice, the chance that a round in which they lie survives every spot check, and the
    expected number of rounds until they are caught."""
    import random

    rng = random.Random(seed)
    ids = [f"p{i:04d}" for i in range(servers)]
    bad = set(ids[:byzantine])
    checkers = servers - byzantine + 1 if honest_checkers is None else honest_checkers  # + the coordinator
    lie_rounds = caught = 0
    for _ in range(trials):
        owners = assign_owners(ids, slices, replicas, rng.randbytes(32))
        lied = {j for j, o in enumerate(owners) if o and set(o) <= bad}
        if not lied:
            continue
        lie_rounds += 1
        honest = [p for p in ids if p not in bad][: max(0, checkers - 1)] + [""]  # "" = the coordinator, owns nothing
        p = spot_check_probability(spot_checks, coverage, slices, servers)
        for checker in honest:
            if rng.random() >= p:  # this node skips its checks this round (the coordinator too)
                continue
            candidates = [j for j in range(slices) if checker not in owners[j]]
            if lied & set(rng.sample(candidates, min(spot_checks, len(candidates)))):
                caught += 1
                break
    p_lie = lie_rounds / trials
    p_caught = caught / lie_rounds if lie_rounds else 1.0
    return {
        "p_round_offers_a_lie": p_lie,
        "p_lie_survives_round": 1 - p_caught if lie_rounds else 0.0,
        "expected_rounds_until_caught": (1 / (p_lie * p_caught)) if lie_rounds and caught else float("inf"),
    }
