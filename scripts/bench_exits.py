"""How long Ctrl+C takes to end each role (issue 22: "within 10 s with nothing left"): SIGINT to the
process group, as a terminal sends it, then the time until the process exits and until its whole
tree (its forked DHT process, p2pd) is gone.

    .venv/bin/python scripts/bench_exits.py --trials 3 --json benchmarks/exits.json --md benchmarks/exits.md
    .venv/bin/python scripts/bench_exits.py --report --json benchmarks/exits.json --md benchmarks/exits.md

Per trial: an idle coordinator alone (no peer ever joined); then one swarm stopped role by role,
in tests/test_signals.py's phases: a peer parked mid-round (fault hook trained:1:delay=600, after
training, before its commit), the standby following the run, and the coordinator whose round 1 is
open and whose only peer is gone. `--verbose` runs the children with -v and keeps, per stop, the
lines each printed after the signal (timestamped here), to see which step of a shutdown is slow.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from scripts.machine_info import command_line, load_average, machine_facts, machine_lines, write_keeping_notes  # noqa: E402

STOPS = ("idle coordinator", "peer mid-round", "following standby", "coordinator, its peer gone mid-round")
TARGET_S = 10.0


def _stop(swarm, child, verbose: bool) -> dict:
    from tests.helpers import kill_tree, process_tree, still_running

    tree = process_tree(child.process.pid)
    seen = len(child.lines)
    t0 = time.monotonic()
    swarm.kill(child, signal.SIGINT)
    stamped: list[tuple[float, str]] = []
    while child.process.poll() is None and time.monotonic() - t0 < 120:
        stamped += [(time.monotonic() - t0, line.rstrip()) for line in child.lines[seen + len(stamped):]]
        time.sleep(0.01)
    exited = time.monotonic() - t0
    rc = child.process.poll()
    left = still_running(tree, 30.0)
    gone = time.monotonic() - t0
    kill_tree(tree)
    time.sleep(0.2)  # the pump thread reads the last lines
    stamped += [(exited, line.rstrip()) for line in child.lines[seen + len(stamped):]]
    return {"exit_s": round(exited, 2), "gone_s": round(gone, 2), "rc": rc, "processes": len(tree), "left": sorted(left.values()),
            "clean": any("stopped cleanly" in line for _, line in stamped),
            "lines": [f"{t:+.2f} {line}" for t, line in stamped if "swarmloco" in line or not line.startswith(("\t", "  "))]
            if verbose else []}


def one_trial(workdir: Path, verbose: bool) -> dict:
    from peer.cli.launcher import Swarm
    from protocol.identity import Identity
    from tests.helpers import free_port, wait_line, write_run_config

    out: dict[str, dict] = {}
    flags = ["-v"] if verbose else []
    swarm = Swarm(workdir / "idle")
    try:
        config = write_run_config(workdir / "idle.json", rounds={"rounds": 3, "expected_peers": 2})
        coordinator = swarm.start_coordinator(["--config", str(config), *flags])
        out[STOPS[0]] = _stop(swarm, coordinator, verbose)
    finally:
        swarm.stop_all()
    swarm = Swarm(workdir / "swarm")
    try:
        standby_key = Identity.load_or_create(swarm.workdir / "standby.pem")
        config = write_run_config(workdir / "run.json", rounds={"rounds": 50, "expected_peers": 1})
        coordinator = swarm.start_coordinator(["--config", str(config), "--coordinators", standby_key.peer_id, *flags])
        standby = swarm.start_standby("standby", ["--port", str(free_port()), *flags])
        os.environ["SWARMLOCO_FAIL_AT"] = "trained:1:delay=600"
        try:
            peer = swarm.start_peer("peer", flags)
        finally:
            del os.environ["SWARMLOCO_FAIL_AT"]
        wait_line(peer, r"reached trained:1, sleeping", 180)
        wait_line(standby, r"following run \S+'s active coordinator", 120)
        for name, child in zip(STOPS[1:], (peer, standby, coordinator)):
            out[name] = _stop(swarm, child, verbose)
    finally:
        swarm.stop_all()
    return out


def render(data: dict) -> str:
    trials = data["trials"]
    lines = ["# Ctrl+C to exit, per role (issue 22)", "",
             f"Written by `scripts/bench_exits.py` from `exits.json` (same run): `{data['command']}`.", "",
             *machine_lines(data.get("machine"), data["load_before"], data["load_after"]), "",
             f"{len(trials)} trials; SIGINT to the role's process group (what a terminal sends); the tests' tiny config "
             "(d_model 64, 1 layer, 8 inner steps), DHT and gRPC on loopback (no TLS, the launcher's default). "
             "Phases as tests/test_signals.py reaches them (fault hook trained:1:delay=600 parks the peer mid-round).", "",
             f"| role and phase | exit s median | max | whole tree gone s max | exit status | left running | within {TARGET_S:.0f} s |",
             "|---|---|---|---|---|---|---|"]
    for stop in STOPS:
        rows = [t[stop] for t in trials if stop in t]
        if not rows:
            continue
        exits = [r["exit_s"] for r in rows]
        lines.append(f"| {stop} | {statistics.median(exits):.2f} | {max(exits):.2f} | {max(r['gone_s'] for r in rows):.2f} | "
                     f"{', '.join(sorted({str(r['rc']) for r in rows}))} | {sum(len(r['left']) for r in rows)} | "
                     f"{sum(r['gone_s'] <= TARGET_S and not r['left'] for r in rows)} of {len(rows)} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--verbose", action="store_true", help="children run with -v; their lines after the signal are kept")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--md", type=Path)
    parser.add_argument("--report", action="store_true", help="only render --md from an existing --json")
    args = parser.parse_args()
    if args.report:
        write_keeping_notes(args.md, render(json.loads(args.json.read_text())))
        return 0
    data = {"command": command_line(), "machine": machine_facts(), "load_before": load_average(), "trials": []}
    for i in range(args.trials):
        with tempfile.TemporaryDirectory(prefix="swarmloco-exits-") as tmp:
            trial = one_trial(Path(tmp), args.verbose)
        print(f"trial {i}: " + ", ".join(f"{k} {v['exit_s']:.2f}s (gone {v['gone_s']:.2f}s, rc {v['rc']})" for k, v in trial.items()),
              flush=True)
        data["trials"].append(trial)
    data["load_after"] = load_average()
    if args.json:
        args.json.write_text(json.dumps(data, indent=2))
    if args.md:
        write_keeping_notes(args.md, render(data))
    print(render(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
