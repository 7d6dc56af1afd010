"""Heterogeneous volunteers (issue 23; shared/DESIGN.md "Heterogeneous peers"): real local swarms of
4 peers with speeds {1, 1, 0.5, 0.25}, each peer held to speed x --base-core of one core by a
cgroup, under a fixed H against a compute window, and a homogeneous swarm (every peer at speed 1)
for the loss at equal tokens.

    .venv/bin/python scripts/bench_heterogeneous.py --json benchmarks/heterogeneous.json --md benchmarks/heterogeneous.md
    .venv/bin/python scripts/bench_heterogeneous.py --report-only --json benchmarks/heterogeneous.json --md benchmarks/heterogeneous.md

Each row is one swarm: a coordinator and 4 peers of a small byte-level GPT on loopback (sliced
exchange, the default median rule, fp16 codec, Nesterov outer), one thread each. A peer is moved,
with its DHT processes, into a cgroup of its own once it has joined (round 0 trains partly
unthrottled: figures count rounds 1 on, as the issue's measurement did); its CPU quota is its
speed x base-core, its cpu.shares high enough that the quota, not the other jobs on this shared
machine, sets its speed (the measured speed ratio is in the JSON). The coordinator gets a cgroup
of its own too (--coordinator-core).

Figures, all from the processes' own --summary-json records:
- utilization of a peer: its inner-step seconds over its rounds' wall seconds, rounds 1 on;
- counted share: each peer's share of the work the aggregate counted, the capped weights the
  owners used recomputed from the signed claims with the same math (peer/run/work_math.WorkLedger;
  a fixed-H run counts every update the same); compute share: its share of the row's speeds;
- val loss at equal wall time: the coordinator's val loss after the last round closed by the
  shorter run's end (time from round 1's start);
- loss at equal tokens: the heterogeneous window run's final val loss against the homogeneous
  run's val loss interpolated (linear in tokens) at the same tokens trained.
- calibrated compute share (window rows): before the swarm starts, one scripts/speed_probe.py per
  peer trains the row's model alone in that peer's cgroup, all four at once, for --calibrate-s
  seconds: each quota's own training rate, which a small quota does not buy in proportion. So the
  slower peers' quotas are scaled and probed again (--calibrate-attempts) until each probe trains
  at its speed relative to the speed-1 probes (within 5%): the row's speeds are then what the
  peers can train, and the swarm runs under those quotas (`cores` in the JSON).
Rows of another seed than 0 are named `<row>-s<seed>` (--seed), so seeds sit side by side.
The md is rendered from the JSON (scripts/heterogeneous_report.py), a pure function of it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for extra in (str(ROOT), str(ROOT / "scripts")):
    if extra not in sys.path:
        sys.path.insert(0, extra)

from chaos_cgroup import CpuThrottle  # noqa: E402
from heterogeneous_report import render  # noqa: E402
from machine_info import command_line, load_average, machine_facts, write_keeping_notes  # noqa: E402
from stop_signals import unwind_on_stop_signals  # noqa: E402

SPEEDS = (1.0, 1.0, 0.5, 0.25)
MODEL = {"d_model": 64, "n_layer": 2, "n_head": 2, "seq_len": 64}
DATA = {"batch_size": 8, "val_batches": 8, "max_corpus_bytes": 2_000_000}
SHARES = 16384  # cpu.shares of each swarm cgroup: 16x a default task's, so the quota binds, not the load
# The cgroups' CFS period. Each period a throttled process resumes costs it about 3 ms of CPU that
# trains nothing (measured with scripts/speed_probe.py's CPU seconds: at 100 ms a 0.0875-core quota
# trained 101 steps per CPU-second alone against 157 unthrottled; at 1 s, 144), a larger part of a
# small quota: at 100 ms the speed-0.25 peer trained at 0.195 of a speed-1 peer, at 1 s at 0.237.
# A 1 s period makes each quota buy compute in proportion to it (within ~5%); the price is a
# throttled peer frozen for up to 1 - quota of a second at a time, which the 32 s window absorbs.
PERIOD_US = 1_000_000


def run_config(*, rounds: int, steps: int, window_s: float, seed: int, max_steps: int = 4000) -> dict[str, Any]:
    from peer.run.config import RunConfig

    data = RunConfig().to_dict()
    data["seed"] = seed
    data["model"].update(MODEL)
    data["data"].update(DATA)
    data["inner"].update({"steps": steps, "warmup_steps": 10})
    data["compression"]["codec"] = "fp16"
    data["rounds"].update({"rounds": rounds, "expected_peers": len(SPEEDS), "min_deadline_s": 10.0, "deadline_s": 120.0,
                           "peer_timeout_s": 60.0, "window_s": window_s, "min_steps": 1, "max_steps": max_steps})
    return RunConfig.from_dict(data).to_dict()


def descendants(root: int) -> list[int]:
    """root and every process below it (from /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    tree, frontier = [root], [root]
    while frontier:
        frontier = [p for p, parent in parents.items() if parent in frontier]
        tree += frontier
    return tree


SPEED_TOLERANCE = 0.05  # a probe's speed ratio this close to the row's speed is matched (30 s probes vary ~+-5%)


def calibrate(name: str, speeds: tuple[float, ...], *, base_core: float, seconds: float, workdir: Path,
              period_us: int, attempts: int = 3) -> dict[str, Any]:
    """The quotas that make the row's speeds real, and what each trains alone under them.

    Each attempt runs one speed probe per peer cgroup, all at once. A quota does not buy training
    in proportion to it (a throttled period resumes with cold caches, and this VM's speed varies),
    so a slower peer's quota is scaled by speed / measured ratio (to the speed-1 probes' mean rate)
    and probed again, up to `attempts` probes, until every ratio is within SPEED_TOLERANCE of its
    speed. -> the closest attempt's steps, rates and CPU seconds, the quotas it ran under (`cores`,
    which the swarm then gets), whether it was within the tolerance (`matched`) and every attempt's."""
    cores = [speed * base_core for speed in speeds]
    tried: list[dict[str, Any]] = []
    for attempt in range(attempts):
        probe = _probe(name, cores, seconds=seconds, workdir=workdir, period_us=period_us)
        full = [r for r, s in zip(probe["rates"], speeds) if s == max(speeds)]
        ratios = [r / max(sum(full) / len(full), 1e-9) * max(speeds) for r in probe["rates"]]  # in the row's speed units
        off = max(abs(x / s - 1) for x, s in zip(ratios, speeds))
        tried.append({"cores": list(cores), **probe, "speed_ratios": ratios, "worst_off": off})
        print(f"  calibration {attempt + 1}: cores {', '.join(f'{c:.3f}' for c in cores)} -> speeds "
              f"{', '.join(f'{x:.3f}' for x in ratios)} (worst {off:+.1%})", flush=True)
        if off <= SPEED_TOLERANCE:
            break
        cores = [c if s == max(speeds) else min(1.0, c * s / max(x, 1e-3)) for c, s, x in zip(cores, speeds, ratios)]
    best = min(tried, key=lambda t: t["worst_off"])  # the quotas the swarm gets: the closest attempt, matched or not
    return {"seconds": seconds, **best, "matched": best["worst_off"] <= SPEED_TOLERANCE, "attempts": tried}


def _probe(name: str, cores: list[float], *, seconds: float, workdir: Path, period_us: int) -> dict[str, Any]:
    """Each quota's training rate alone: one speed probe per cgroup, all timed at once. A probe sets
    itself up unthrottled (--wait-go): at a 0.0875-core quota its imports and corpus took minutes."""
    groups, probes = [], []
    try:
        for core in cores:
            probes.append(subprocess.Popen([sys.executable, str(ROOT / "scripts" / "speed_probe.py"), str(workdir / "run.json"),
                                            str(seconds), "--wait-go"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        for i, (probe, core) in enumerate(zip(probes, cores)):
            if json.loads(probe.stdout.readline() or "{}").get("ready") is not True:
                raise RuntimeError(f"speed probe {i} exited before it was ready (exit status {probe.wait()})")
            group = CpuThrottle(f"swlH{name}cal{i}")
            groups.append(group)
            group.limit([probe.pid], core, shares=SHARES, period_us=period_us)
        for probe in probes:
            probe.stdin.write("go\n")
            probe.stdin.flush()
        results = [json.loads(p.communicate(timeout=seconds * 20 + 300)[0].strip().splitlines()[-1]) for p in probes]
    finally:
        for probe in probes:
            if probe.poll() is None:
                probe.kill()
                probe.wait()
        for group in groups:
            group.close()
    return {"steps": [r["steps"] for r in results], "rates": [r["steps"] / r["seconds"] for r in results],
            "cpu_s": [r["cpu_s"] for r in results]}


def run_row(name: str, speeds: tuple[float, ...], *, steps: int, window_s: float, rounds: int, base_core: float,
            coordinator_core: float, seed: int, workdir: Path, calibrate_s: float = 0.0, max_steps: int = 4000,
            period_us: int = PERIOD_US, calibrate_attempts: int = 3, cores: list[float] | None = None) -> dict[str, Any]:
    from peer.cli.launcher import Swarm

    workdir.mkdir(parents=True, exist_ok=True)
    config = run_config(rounds=rounds, steps=steps, window_s=window_s, seed=seed, max_steps=max_steps)
    (workdir / "run.json").write_text(json.dumps(config))
    calibration = calibrate(name, speeds, base_core=base_core, seconds=calibrate_s, workdir=workdir, period_us=period_us,
                            attempts=calibrate_attempts) if calibrate_s else None
    cores = calibration["cores"] if calibration else cores or [speed * base_core for speed in speeds]
    groups: list[CpuThrottle] = []
    started = time.monotonic()
    try:
        with Swarm(workdir) as swarm:
            coordinator = swarm.start_coordinator(["--config", str(workdir / "run.json")], timeout_s=300)
            group = CpuThrottle(f"swlH{name}coord")
            groups.append(group)
            group.limit(descendants(coordinator.process.pid), coordinator_core, shares=SHARES, period_us=period_us)
            peers = [swarm.start_peer(f"peer{i}", ["--shard", f"{i}/{len(speeds)}", "--log-every", "100000"], via_dht=False)
                     for i in range(len(speeds))]
            throttled: set[int] = set()
            while len(throttled) < len(peers):  # each peer into its cgroup once it has joined (its DHT is up)
                for i, peer in enumerate(peers):
                    if i not in throttled and peer.joined:
                        group = CpuThrottle(f"swlH{name}{i}")
                        groups.append(group)
                        group.limit(descendants(peer.process.pid), cores[i], shares=SHARES, period_us=period_us)
                        throttled.add(i)
                    if not peer.alive():
                        raise RuntimeError(f"{peer.name} exited before joining: {peer.last_words()}")
                time.sleep(0.2)
            if swarm.wait(coordinator, 1800) != 0:
                raise RuntimeError(f"coordinator failed: {coordinator.last_words()}")
            for peer in peers:
                swarm.wait(peer, 120)
            swarm.check(peers)
            summaries = {c.name: json.loads((workdir / f"{c.name}.json").read_text()) for c in [coordinator, *peers]}
    finally:
        for group in groups:
            group.close()
    return {"name": name, "speeds": list(speeds), "inner_steps": steps, "window_s": window_s, "rounds": rounds,
            "base_core": base_core, "cores": cores, "period_us": period_us, "coordinator_core": coordinator_core, "seed": seed, "config": config,
            "wall_s": time.monotonic() - started, "calibration": calibration, "coordinator": _coordinator_record(summaries["coordinator"]),
            "peers": [_peer_record(summaries[f"peer{i}"]) for i in range(len(speeds))]}


def _coordinator_record(summary: dict[str, Any]) -> dict[str, Any]:
    return {"initial_val_loss": summary["initial_val_loss"], "param_hash": summary["param_hash"],
            "history": [{k: r[k] for k in ("round", "updates", "seconds", "val_loss", "param_hash", "close_reason")}
                        for r in summary["history"]]}


def _peer_record(summary: dict[str, Any]) -> dict[str, Any]:
    keep = ("round", "inner_steps", "tokens", "compute_s", "round_s", "in_sync", "wait_s", "train_loss", "window_late_s")
    return {"peer_id": summary["peer_id"], "param_hash": summary["param_hash"],
            "history": [{k: r[k] for k in keep if k in r} for r in summary["history"]]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "heterogeneous.json"))
    parser.add_argument("--md", default=str(ROOT / "benchmarks" / "heterogeneous.md"))
    parser.add_argument("--report-only", action="store_true", help="render the md from the JSON, run nothing")
    parser.add_argument("--rows", default="fixed-h,window,homogeneous", help="which rows to run (comma-separated)")
    parser.add_argument("--steps", type=int, default=20, help="H of the fixed-H rows")
    parser.add_argument("--window-s", type=float, default=32.0, help="the compute window of the window rows")
    parser.add_argument("--fixed-rounds", type=int, default=22)
    parser.add_argument("--window-rounds", type=int, default=5)
    parser.add_argument("--homogeneous-rounds", type=int, default=5)
    parser.add_argument("--homogeneous-window-s", type=float, default=22.0,
                        help="the homogeneous row's window: sized so its 4 full-speed peers train about the tokens a round "
                             "of the mixed window row trains (2.75 of 4 peers' speed: 32 s x 2.75 / 4 = 22 s), so equal "
                             "tokens come at an equal number of outer steps (19 s matched the rates the 100 ms period's "
                             "quotas bought)")
    parser.add_argument("--base-core", type=float, default=0.35, help="share of one core a speed-1 peer gets")
    parser.add_argument("--coordinator-core", type=float, default=0.5)
    parser.add_argument("--period-ms", type=float, default=PERIOD_US / 1000,
                        help="the cgroups' CFS period (ms; the rows before it ran at 100): each throttled period costs "
                             "~3 ms of CPU, so at 100 ms a small quota buys less than its share")
    parser.add_argument("--max-steps", type=int, default=4000,
                        help="rounds.max_steps of every row: high enough that no peer reaches it within a window (1000 "
                             "capped the speed-1 peers at 1000 steps in ~22 s of a 32 s window at load 4)")
    parser.add_argument("--seed", type=int, default=0, help="the rows' seed; rows of seed N != 0 are stored as <row>-sN")
    parser.add_argument("--calibrate-s", type=float, default=30.0,
                        help="seconds of each mixed-speed row's speed probes (its quotas' own training rates); 0: none")
    parser.add_argument("--calibrate-attempts", type=int, default=3,
                        help="speed probes per mixed-speed row: after each, a slower peer's quota is scaled so its measured "
                             "speed matches the row's (within 5%%); 1: probe the nominal quotas (speed x base core) only, "
                             "as the rows before this option did")
    parser.add_argument("--workdir", default="/tmp/swarmloco-heterogeneous")
    args = parser.parse_args(argv)
    path = Path(args.json)
    if not args.report_only:
        unwind_on_stop_signals()  # through Swarm's cleanup and the cgroups' removal
        record = json.loads(path.read_text()) if path.exists() else {"rows": {}}
        record["machine"] = machine_facts()
        plans = {"fixed-h": (SPEEDS, 0.0, args.fixed_rounds), "window": (SPEEDS, args.window_s, args.window_rounds),
                 "homogeneous": ((1.0,) * len(SPEEDS), args.homogeneous_window_s, args.homogeneous_rounds)}
        for plan in args.rows.split(","):
            speeds, window_s, rounds = plans[plan]
            name = plan if args.seed == 0 else f"{plan}-s{args.seed}"
            load_before = load_average()
            print(f"row {name}: speeds {speeds}, window {window_s or 'off'} s, H {args.steps}, {rounds} rounds (load {load_before})", flush=True)
            calibrate_s = args.calibrate_s if plan == "window" else 0.0
            # fixed H against the window of its seed: on the same quotas when that row matched them to the speeds
            window_row = record["rows"].get("window" if args.seed == 0 else f"window-s{args.seed}", {})
            cores = window_row.get("cores") if plan == "fixed-h" and window_row.get("speeds") == list(speeds) else None
            row = run_row(name, speeds, steps=args.steps, window_s=window_s, rounds=rounds, base_core=args.base_core,
                          coordinator_core=args.coordinator_core, seed=args.seed, workdir=Path(args.workdir) / name,
                          calibrate_s=calibrate_s, max_steps=args.max_steps, period_us=int(args.period_ms * 1000),
                          calibrate_attempts=args.calibrate_attempts, cores=cores)
            row.update({"load_before": load_before, "load_after": load_average(), "command": command_line()})
            record["rows"][name] = row
            path.write_text(json.dumps(record, indent=1) + "\n")  # after every row: a later failure keeps it
            print(f"row {name}: done in {row['wall_s']:.0f} s", flush=True)
    write_keeping_notes(args.md, render(json.loads(path.read_text())))
    print(f"wrote {args.md}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
