"""Running the Byzantine benchmark's cases: one case through `swarmloco simulate`
(peer/cli/simulate.py: the real RoundMath, attackers = the first f virtual peers), and a list of
cases in worker processes, one torch thread each, checkpointing after every run.
"""

from __future__ import annotations

import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from peer.cli.simulate import SimulationOptions, run_simulation  # noqa: E402
from optim import aggregate  # noqa: E402
from scripts.byzantine_cases import CLEAN, HONEST_ONLY, PEERS, RULES, Case, Profile, refusal  # noqa: E402


def aggregate_name(case: Case) -> str:
    return RULES.get(case.aggregator, (case.aggregator, {}))[0]


def run_case(case: Case, profile: Profile) -> dict[str, Any]:
    record: dict[str, Any] = {"key": case.key, **asdict(case), "attack_options": dict(case.attack_options)}
    why = refusal(case.aggregator, case.f, exchange=case.exchange)
    if why:
        return {**record, "status": "refused", "error": why}
    attacked = case.attack not in (CLEAN, HONEST_ONLY)
    peers, f = PEERS, case.f
    if case.attack == HONEST_ONLY:  # the f attackers' peers absent, not replaced; f as the swarm lowers it for n - f rows
        peers = PEERS - case.f
        while f > 0 and aggregate.minimum_rows(aggregate_name(case), f) > peers:
            f -= 1
    opts = SimulationOptions(
        peers=peers, rounds=profile.rounds, byzantine=case.f if attacked else 0,
        attack=case.attack if attacked else None, attack_options=dict(case.attack_options),
        seed=case.seed, threads=1, config=profile.config(case.seed, case.aggregator, f, case.codec, case.exchange),
    )
    started = time.perf_counter()
    try:
        result = run_simulation(opts)
    except (ValueError, RuntimeError) as exc:  # e.g. too few rows left once excluded updates are dropped
        return {**record, "status": "error", "error": str(exc), "wall_s": time.perf_counter() - started}
    return {
        **record, "status": "ok", "final_val_loss": result["final_val_loss"],
        "initial_val_loss": result["initial_val_loss"], "val_loss_per_round": result["val_loss_per_round"],
        "excluded": sum(len(e) for e in result["excluded_per_round"]), "wall_s": result["wall_s"],
        "final_params_sha256": result["final_params_sha256"], "lying_owner": result["lying_owner"],
    }


def run_all(todo: list[Case], profile: Profile, workers: int, results: dict[str, dict], checkpoint, runner=run_case) -> None:
    t0 = time.perf_counter()

    def done(i: int, record: dict[str, Any]) -> None:
        results[record["key"]] = record
        checkpoint()
        loss = record.get("final_val_loss")
        print(f"[{i}/{len(todo)} {time.perf_counter() - t0:.0f}s] {record['key']}: {record['status']}"
              + (f" val {loss:.4f}" if loss is not None else f" ({record.get('error')})"), flush=True)

    if workers <= 0:
        for i, case in enumerate(todo, 1):
            done(i, runner(case, profile))
        return
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(runner, case, profile) for case in todo]
        for i, future in enumerate(as_completed(futures), 1):
            done(i, future.result())
