"""What a chaos run is (scripts/chaos.py): its peers, its configuration, and the seeded schedule
of faults it goes through."""

from __future__ import annotations

import random
from dataclasses import dataclass

PEERS = ("steady", "straggler", "churner", "partitioned", "attacker", "liar")


@dataclass(frozen=True)
class Schedule:
    """What goes wrong, by round. Windows are (first, last): the fault starts once round `first - 1`
    has closed and ends once round `last` has closed."""

    churn_kills: tuple[int, ...] = ()  # the churner SIGKILLs itself after training these rounds
    throttle: tuple[int, int] | None = None  # the straggler's CPU quota is cut in these rounds
    partition: tuple[int, int] | None = None  # the partitioned peer's link is down in these rounds
    coordinator_kill: int | None = None  # the active coordinator SIGKILLs itself in this round, at coordinator_phase
    # manifest-followed: once the standby holds the round's signed manifest (it continues the round);
    # manifest-signed: while signing it, before anyone saw it (the successor reopens the round)
    coordinator_phase: str = "manifest-followed"
    attacker: bool = False  # the attacker sign-flips (else it is honest)
    liar: bool = False  # the liar signs false slice results (else it is honest)

    def events(self) -> list[tuple[int, str]]:
        out = [(r, f"churner SIGKILLed after training round {r}, restarted with --resume") for r in self.churn_kills]
        if self.throttle:
            out.append((self.throttle[0], f"straggler CPU-throttled in rounds {self.throttle[0]}-{self.throttle[1]}"))
        if self.partition:
            out.append((self.partition[0], f"partitioned peer's link down in rounds {self.partition[0]}-{self.partition[1]}"))
        if self.coordinator_kill is not None:
            when = {"manifest-followed": "once the standby held", "manifest-signed": "while signing"}[self.coordinator_phase]
            out.append((self.coordinator_kill, f"active coordinator SIGKILLed {when} round {self.coordinator_kill}'s manifest "
                                               f"({self.coordinator_phase})"))
        if self.attacker:
            out.append((0, "attacker sign-flips its update every round"))
        if self.liar:
            out.append((0, "liar signs false results for every slice it owns"))
        return sorted(out)


COORDINATOR_PHASES = ("manifest-followed", "manifest-signed")


def draw_schedule(rounds: int, seed: int, coordinator_phase: str = "manifest-followed") -> Schedule:
    """The full schedule for `rounds` rounds from `seed`: about one churn kill per 20 rounds (at least
    one, 6+ rounds apart, none in the last quarter), a throttle and a partition window of max(3, rounds/10) rounds, the
    coordinator kill in the run's middle fifth; the last 3 rounds are left quiet to settle."""
    if coordinator_phase not in COORDINATOR_PHASES:
        raise ValueError(f"coordinator phase {coordinator_phase!r}: choose one of {', '.join(COORDINATOR_PHASES)}")
    if rounds < 10:
        raise ValueError(f"--rounds {rounds}: the full schedule needs at least 10 rounds (use 20 or more)")
    rng = random.Random(seed)
    width = max(3, rounds // 10)
    kills: list[int] = []
    slots = list(range(2, int(rounds * 0.75)))  # a restarted peer has a quarter of the run to start and rejoin
    while len(kills) < max(1, rounds // 20) and slots:
        r = rng.choice(slots)
        kills.append(r)
        slots = [s for s in slots if abs(s - r) >= 6]
    throttle_start = rng.randint(max(1, rounds // 10), max(1, rounds // 4))
    partition_start = rng.randint(rounds // 2 + 1, max(rounds // 2 + 1, rounds - 4 - width))
    return Schedule(churn_kills=tuple(sorted(kills)), throttle=(throttle_start, throttle_start + width - 1),
                    partition=(partition_start, min(rounds - 4, partition_start + width - 1)),
                    coordinator_kill=rng.randint(int(rounds * 0.35), int(rounds * 0.55)), coordinator_phase=coordinator_phase,
                    attacker=True, liar=True)


@dataclass(frozen=True)
class ChaosConfig:
    rounds: int = 20
    seed: int = 0
    inner_steps: int = 32  # H: a round of the tiny model is a couple of seconds with six peers on 2 cores
    lease_s: float = 8.0  # the lease floor (test_failover's: a loaded 2-core box renews slowly)
    peer_timeout_s: float = 6.0
    throttle_fraction: float = 0.1  # the straggler's CPU quota while throttled (of one core)
    timeout_s: float = 0.0  # whole run; 0: 30 s per round + 300 s
    peers: tuple[str, ...] = PEERS  # which of the six roles run (tests run fewer)
    standby: bool = True  # a standby coordinator follows the run (tests without a coordinator kill go without)
    gate_round: int | None = None  # tests: every peer waits after training this round until each restarted one is in it

    def run_sections(self) -> dict:
        return {"seed": self.seed, "inner": {"steps": self.inner_steps},
                "rounds": {"rounds": self.rounds, "expected_peers": len(self.peers), "peer_timeout_s": self.peer_timeout_s},
                "control": {"lease_s": self.lease_s}}
