"""Bytes per peer per round as the swarm grows: sliced vs all-to-all, from the transport's counters.

    .venv/bin/python scripts/measure_scale.py --peers 3 6 9 12 --codec fp16 int8 --all-to-all-peers 3 12 --write-md
    .venv/bin/python scripts/measure_scale.py --peers 6 --codec int8 --merge --write-md   # re-run one, keep the rest

For each (codec, exchange mode, n) it runs a real local swarm on loopback (a coordinator and n
peer processes, `peer.cli.launcher.Swarm`) and reads every peer's per-round transport ledger
(`traffic`: bytes by counterpart and round, counted by the byte-counting gRPC interceptors). What
a peer exchanges with the coordinator's endpoint is control (headers, manifest, the signed results
list, result submissions, heartbeats); the rest is data (slices, aggregated slices, payloads), set
beside the expected bytes of docs/sliced-exchange.md plus the spot checks (P: payload, A:
aggregated result, m = n serving peers, r owners per slice, S slices, k spot checks per peer):

  sliced, per peer (average over the owner draw):
    received ≈ r·(n−1)/m·P + (1 − r/m)·A + k·((n−1)·P − A)/S
    sent     ≈ (r − r/m)·P + (n − r + 1)/m·A + k·((n−1)·P − A)/S
  all-to-all, per peer: received ≈ (n − 1)·P

A spot-checked slice is recomputed from its n inputs (n − 1 fetched) instead of fetching its
result: that term grows as k·n/S, so it is bounded only while S grows with n. The coordinator's
bytes per round are summed from the peers' ledgers (control with every peer, plus what it fetched
from them to gather θ_{r+1} and spot-check). The projection to 100 and 1,000 peers uses the
measured bytes per parameter of P and A and a linear fit of the measured control bytes in n.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for extra in (str(ROOT), str(ROOT / "scripts")):
    if extra not in sys.path:
        sys.path.insert(0, extra)

from scale_projection import COVERAGE, control_fit, control_runs, expected, expected_coordinator, projection, with_projection  # noqa: E402,F401
from scale_report import row_key  # noqa: E402
from stop_signals import unwind_on_stop_signals  # noqa: E402
from swarm_meters import CoordinatorCpu, MemoryGuard  # noqa: E402  (scripts/ is on the path now)

JOINED_NODE_RE = re.compile(r"^peer (\S+) \| joined run ")  # peer/node/node.py prints it at its first accepted join


def run_config(*, peers: int, rounds: int, inner_steps: int, codec: str, mode: str, slices: int, replicas: int, spot_checks: int):
    """The run the swarm trains: generous timeouts, since n peer processes share the machine's cores."""
    from peer.run.config import RunConfig

    return RunConfig.from_dict({
        "run_id": "scale",
        "inner": {"steps": inner_steps},
        "compression": {"codec": codec},
        "aggregation": {"name": "median"},
        "rounds": {"rounds": rounds, "expected_peers": peers, "min_peers": peers, "start_timeout_s": 600.0,
                   "deadline_s": 300.0, "peer_timeout_s": 180.0},
        "exchange": {"mode": mode, "slices": slices, "replicas": replicas, "spot_checks": spot_checks,
                     "result_timeout_s": 300.0},
    })


def exchange_sizes(cfg) -> dict:
    """What one peer's round moves by construction: the model's numel, the payload P (the wire
    codec's largest message), the aggregate A (every slice's largest result in the result format,
    dense or a codec spec: exchange.result_codec), the slice count S and the result format. P and
    A are exact for fixed-size codecs and upper bounds for chunk-topk / dct-topk, whose Rice-coded
    offsets vary in length (the rows' "payload" is each round's real size)."""
    from optim import slicing
    from peer.learn.model import build_model, num_params
    from peer.run.round_math import RoundMath

    numel = num_params(build_model(cfg.model, cfg.seed))
    rm = RoundMath(cfg, numel)
    layout = rm.layout
    return {"numel": numel, "payload": rm.codec.max_encoded_size(numel), "result_format": rm.result_format,
            "result": sum(slicing.max_result_size(layout.size(j), rm.result_format) for j in range(layout.num_slices)),
            "slices": layout.num_slices}


def ledger_rows(summary: dict, coordinator_endpoint: str, coordinator_id: str) -> list[dict]:
    """One row per round of one peer: totals from its history, the split from its transport ledger.

    control = traffic with the coordinator's endpoint (our calls to it); to_coordinator = what the
    coordinator fetched from us (its gather and spot checks: data); the rest is peer-to-peer."""
    rows = []
    for h in summary.get("history", []):
        ledger = summary.get("traffic", {}).get(str(h["round"]), {})
        control = ledger.get(coordinator_endpoint, {})
        fetched = ledger.get(coordinator_id, {})
        slices = h.get("slices") or {}
        rows.append({
            "peer": summary.get("peer_id", "?")[:8], "round": h["round"], "sent": h["bytes_sent"], "received": h["bytes_received"],
            "control_sent": control.get("bytes_sent", 0), "control_received": control.get("bytes_received", 0),
            "to_coordinator_sent": fetched.get("bytes_sent", 0), "to_coordinator_received": fetched.get("bytes_received", 0),
            "payload": h["payload_bytes"], "updates": h["updates"], "in_sync": h.get("in_sync", False),
            "owned": slices.get("owned"), "spot_checked": slices.get("spot_checked"), "recomputed": slices.get("recomputed"),
            "result_bytes": slices.get("result_bytes"),  # the round's aggregate as gathered, all slices (sliced exchange)
            # {rpc: [sent, received]} for this round: what it called (GetManifest, ...) and served ("served:FetchPayload")
            "by_method": {m: [t["bytes_sent"], t["bytes_received"]]
                          for m, t in summary.get("traffic_by_method", {}).get(str(h["round"]), {}).items()},
        })
    return rows


FORKED = "forked"  # a row's "start": its processes forked from the launcher's fork server (else exec'd)


def storm_peers(swarm, coordinator, peers: int) -> list:
    """Every peer at once, one process each, through the DHT, as `swarmloco demo` starts them."""
    return [swarm.start_peer(f"peer{i}", ["--shard", f"{i}/{peers}", "--log-every", "1000"]) for i in range(peers)]


def joined_count(child) -> int:
    """Peer nodes of a child process that printed their join (one per peer process; several in a
    scale-lab process): counted by node, from its lines."""
    return len({m.group(1) for line in list(child.lines) if (m := JOINED_NODE_RE.match(line))})


def run_swarm(cfg, *, peers: int, workdir: Path, memory_floor_gib: float = 2.0, start_peers=storm_peers,
              prewarmed: bool = False) -> dict:
    """One local swarm to completion; per-peer per-round rows, the coordinator's CPU per round and
    whatever went wrong. `start_peers(swarm, coordinator, n)` starts the n peers' processes
    (default: one each, through the DHT; scripts/scale_lab.py: several nodes per process, direct);
    `prewarmed`: every process forked from the launcher's fork server, as `swarmloco demo` starts
    them (peer/cli/prewarmed.py), instead of exec'd."""
    from peer.cli.launcher import Swarm

    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "run.json").write_text(cfg.to_json())
    from machine_info import load_average

    problems: list[str] = []
    started, load_before = time.monotonic(), load_average()
    with Swarm(workdir, prewarmed=prewarmed) as swarm:
        swarm.prewarm()  # the fork server's own memory is not the swarm's (it runs once for every row)
        guard = MemoryGuard(swarm, memory_floor_gib)
        guard.start()
        coordinator = swarm.start_coordinator(["--config", str(workdir / "run.json")], timeout_s=300)
        cpu = CoordinatorCpu(coordinator)
        cpu.start()
        children = start_peers(swarm, coordinator, peers)
        for child, limit in [(coordinator, 600 + 300 * cfg.rounds.rounds), *((c, 120) for c in children)]:
            try:
                if (code := swarm.wait(child, limit)) != 0 and child is coordinator:
                    problems.append(f"{child.name} exited {code} (log: {child.log_path})")
            except subprocess.TimeoutExpired:
                if child is coordinator:
                    problems.append(f"{child.name} still running after {limit} s (log: {child.log_path})")
        guard.done.set()
        cpu.done.set()
        cpu.join()
        if guard.tripped_at is not None:  # the rest is the stop's doing: said once, with what it took
            problems.append(f"does not fit: stopped {guard.tripped_at:.0f} s in, when the machine's available memory fell below "
                            f"{memory_floor_gib:g} GiB (the swarm took about {guard.needed_gib:.1f} GiB of the {guard.start_gib:.1f} "
                            f"available at its start; {sum(map(joined_count, children))} of {peers} peers had joined)")
        else:
            problems += swarm.failures(children)  # a peer that never joined, failed or hangs: named with its last words
        joined = sum(map(joined_count, children))
        if guard.tripped_at is None and joined < peers:  # a lab process whose other nodes joined
            problems.append(f"only {joined} of {peers} peer nodes printed their join")
    wall = time.monotonic() - started
    facts = {"peers_started": peers, "peers_joined": joined, "load_before": load_before, "load_after": load_average(),
             "memory_available_start_gib": round(guard.start_gib, 2), "memory_taken_gib": round(guard.needed_gib, 2),
             "memory_floor_gib": memory_floor_gib, "stopped_for_memory": guard.tripped_at is not None,
             "coordinator_cpu": cpu.per_round()}
    coordinator_path = workdir / "coordinator.json"
    if not coordinator_path.exists():
        return {"rows": [], "wall_s": wall, "problems": problems + ["no coordinator summary"], "rounds_done": 0, **facts}
    coord = json.loads(coordinator_path.read_text())
    rows = []
    for path in sorted(workdir.glob("peer*.json")):
        rows += ledger_rows(json.loads(path.read_text()), coord["endpoint"], coord["coordinator_id"])
    rounds_done = len(coord.get("history", []))
    if rounds_done != cfg.rounds.rounds:
        problems.append(f"the coordinator closed {rounds_done} of {cfg.rounds.rounds} rounds")
    if len(rows) != peers * cfg.rounds.rounds:
        problems.append(f"{len(rows)} peer rounds recorded, expected {peers} x {cfg.rounds.rounds}")
    if bad := [f"{r['peer']} r{r['round']}" for r in rows if not r["in_sync"] or r["updates"] != peers]:
        problems.append(f"out of sync or short of updates: {', '.join(bad)}")
    traffic = coord.get("coordinator_traffic", {})
    return {"rows": rows, "wall_s": wall, "problems": problems, "rounds_done": rounds_done, **facts,
            "coordinator_total": traffic.get("bytes_sent", 0) + traffic.get("bytes_received", 0)}


def summarize(codec: str, mode: str, n: int, args, numel: int, payload: int, result_bytes: int, run: dict) -> dict:
    rows = [r for r in run["rows"] if r["round"] >= args.skip_rounds]
    spot = args.spot_checks if mode == "sliced" else 0
    exp = expected(mode, n, payload, result_bytes, args.replicas, args.slices, spot)

    def stat(key, how=statistics.fmean):
        values = [key(r) for r in rows]
        return how(values) if values else math.nan

    # all-to-all: the coordinator holds every payload and serves it like a peer, so traffic with it
    # is not control alone; the row compares the whole of it with the formula
    a2a = mode == "all-to-all"
    data_received = stat(lambda r: r["received"] - (0 if a2a else r["control_received"]))
    per_round: dict[int, float] = {}
    for r in rows:
        per_round[r["round"]] = per_round.get(r["round"], 0) + (r["control_sent"] + r["control_received"] + r["to_coordinator_sent"] + r["to_coordinator_received"])
    coordinator = statistics.fmean(per_round.values()) if per_round else math.nan
    return {
        "codec": codec, "mode": mode, "peers": n, "slices": args.slices if mode == "sliced" else None,
        "replicas": args.replicas if mode == "sliced" else None, "spot_checks": spot, "aggregator": "median",
        # expected recomputations of each slice per round (the run config's default; rows before issue 24's sampling: 2)
        "spot_check_coverage": COVERAGE if mode == "sliced" else None,
        "inner_steps": args.inner_steps, "rounds": args.rounds, "skip_rounds": args.skip_rounds, "numel": numel,
        "payload_bytes": payload, "result_bytes": result_bytes,
        "received_mean": stat(lambda r: r["received"]), "received_median": stat(lambda r: r["received"], statistics.median),
        "received_min": stat(lambda r: r["received"], min), "received_max": stat(lambda r: r["received"], max),
        "control_received_mean": None if a2a else stat(lambda r: r["control_received"]), "data_received_mean": data_received,
        "sent_mean": stat(lambda r: r["sent"]), "control_sent_mean": None if a2a else stat(lambda r: r["control_sent"]),
        "data_sent_mean": stat(lambda r: r["sent"] - (0 if a2a else r["control_sent"])),
        "expected_received": exp["received"], "expected_sent": exp["sent"], "expected_spot": exp["spot"],
        "received_vs_expected": stat(lambda r: r["received"]) / exp["received"],
        "data_received_vs_expected": data_received / exp["received"],
        "coordinator_bytes_per_round": coordinator,
        "coordinator_expected_data": expected_coordinator(mode, n, payload, result_bytes, args.slices, spot),
        "coordinator_total_per_round": run.get("coordinator_total", 0) / max(1, run["rounds_done"]),
        **coordinator_cpu(run.get("coordinator_cpu") or [], args.skip_rounds),
        "wall_s": run["wall_s"], "problems": run["problems"], "ok": not run["problems"], "rows": run["rows"],
        "rounds_done": run["rounds_done"], **{k: run.get(k) for k in (
            "peers_started", "peers_joined", "load_before", "load_after", "memory_available_start_gib", "memory_taken_gib",
            "memory_floor_gib", "stopped_for_memory")},
    }


def coordinator_cpu(per_round: list[dict], skip_rounds: int) -> dict:
    """The coordinator's CPU seconds and the wall seconds per round (mean over the counted rounds:
    the first `skip_rounds` hold start-up and joins), alone and with its DHT process and p2pd."""
    counted = [r for r in per_round if r["round"] >= skip_rounds]

    def mean(key: str) -> float:
        return statistics.fmean(r[key] for r in counted) if counted else math.nan

    return {"coordinator_cpu": per_round, "coordinator_cpu_s_per_round": mean("cpu_s"),
            "coordinator_tree_cpu_s_per_round": mean("tree_cpu_s"), "round_wall_s": mean("wall_s")}


def plan(args) -> list[tuple[str, str, int]]:
    runs = [(codec, mode, n) for codec in args.codec for mode in args.mode for n in args.peers]
    runs += [(codec, "all-to-all", n) for codec in args.codec for n in args.all_to_all_peers]
    return list(dict.fromkeys(runs))


def measure(args, *, start_peers=storm_peers, how: dict | None = None, on_row=None) -> list[dict]:
    """Every planned (codec, mode, n) swarm, one after the other; `how` is stored in each row (how it ran)."""
    base = Path(args.workdir or tempfile.mkdtemp(prefix="swarmloco-scale-"))
    results = []
    for codec, mode, n in plan(args):
        cfg = run_config(peers=n, rounds=args.rounds, inner_steps=args.inner_steps, codec=codec, mode=mode,
                         slices=args.slices, replicas=args.replicas, spot_checks=args.spot_checks)
        sizes = exchange_sizes(cfg)
        numel, payload, result_bytes = sizes["numel"], sizes["payload"], sizes["result"]  # P, the gathered aggregate A
        print(f"{codec} {mode} n={n}: running ({args.rounds} rounds x {args.inner_steps} inner steps)", flush=True)
        run = run_swarm(cfg, peers=n, workdir=base / f"{codec.replace(':', '_')}-{mode}-{n}", memory_floor_gib=args.memory_floor,
                        start_peers=start_peers, prewarmed=(how or {}).get("start") == FORKED)
        r = {**summarize(codec, mode, n, args, numel, payload, result_bytes, run), **(how or {})}
        results.append(r)
        if on_row is not None:
            on_row(r)
        print(f"  {run['wall_s']:.0f} s; received mean {r['received_mean']:,.0f} B (median {r['received_median']:,.0f}; data "
              f"{r['data_received_mean']:,.0f} vs expected {r['expected_received']:,.0f}: x{r['data_received_vs_expected']:.3f}; "
              f"control {r['control_received_mean'] or 0:,.0f}) | sent {r['sent_mean']:,.0f} B | coordinator "
              f"{r['coordinator_bytes_per_round']:,.0f} B/round, CPU {r['coordinator_cpu_s_per_round']:.2f} s/round "
              f"({r['coordinator_tree_cpu_s_per_round']:.2f} s with its DHT), round {r['round_wall_s']:.1f} s", flush=True)
        for problem in r["problems"]:
            print(f"  PROBLEM: {problem}", flush=True)
    return results


def add_swarm_arguments(parser: argparse.ArgumentParser) -> None:
    """The shape of every measured swarm (rounds, H, slices, owners, spot checks, rounds left out,
    where the runs write): the flags run_config and summarize read, shared with bench_compressed."""
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--inner-steps", type=int, default=2)
    parser.add_argument("--slices", type=int, default=32)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--spot-checks", type=int, default=1)
    parser.add_argument("--skip-rounds", type=int, default=1, help="leave out the first rounds (joins, warm-up) from the figures")
    parser.add_argument("--workdir")


def build_parser(description: str) -> argparse.ArgumentParser:
    """The flags of a measured series of swarms (this script's, and scripts/scale_lab.py's)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--peers", type=int, nargs="+", default=[3, 6, 9, 12])
    parser.add_argument("--codec", nargs="+", default=["fp16"])
    parser.add_argument("--mode", nargs="+", default=["sliced"], choices=["sliced", "all-to-all"])
    parser.add_argument("--all-to-all-peers", type=int, nargs="*", default=[], help="also run all-to-all at these sizes")
    add_swarm_arguments(parser)
    parser.add_argument("--json", default=str(ROOT / "benchmarks/scale.json"))
    parser.add_argument("--merge", action="store_true", help="keep the runs already in --json that this invocation does not repeat")
    parser.add_argument("--write-md", nargs="?", const=str(ROOT / "benchmarks/scale.md"), metavar="PATH")
    parser.add_argument("--report-only", action="store_true", help="rewrite --write-md from --json without running anything")
    parser.add_argument("--memory-floor", type=float, default=2.0, metavar="GIB",
                        help="stop a swarm when the machine's available memory falls below this (its row says it did not fit)")
    return parser


def measure_and_store(args, runs_key: str, *, start_peers=storm_peers, how: dict | None = None) -> int:
    """Run the planned swarms and store each row in --json (and --write-md) as soon as it is measured,
    under `runs_key` ("runs", "storm_runs", "lab_runs"): the rows of earlier invocations under that
    key are kept with --merge (those this one repeats are replaced), dropped without it."""
    from machine_info import command_line, load_average, machine_facts
    from scale_report import write_markdown

    invocations_key = runs_key.replace("runs", "invocations")
    stored = json.loads(Path(args.json).read_text()) if Path(args.json).exists() else {}
    if not args.merge:
        stored.pop(runs_key, None)
        stored.pop(invocations_key, None)
    unwind_on_stop_signals()  # through Swarm's cleanup: no orphaned swarm
    load_before, measured = load_average(), []
    previous = stored.get(invocations_key, [])

    def store(row: dict) -> None:
        measured.append(row)
        done = {row_key(r) for r in measured}
        kept = [r for r in stored.get(runs_key, []) if row_key(r) not in done]
        invocation = {"command": command_line(), "load_before": load_before, "load_after": load_average(),
                      "machine": machine_facts(), "runs": sorted(done)}
        stored[runs_key] = sorted(kept + measured, key=lambda r: (r["codec"], r["mode"] != "sliced", r["peers"]))
        stored[invocations_key] = previous + [invocation]
        Path(args.json).write_text(json.dumps(with_projection(stored), indent=1))
        print(f"wrote {args.json}", flush=True)
        if args.write_md:
            write_markdown(Path(args.write_md), stored)
            print(f"wrote {args.write_md}", flush=True)

    measure(args, start_peers=start_peers, how=how, on_row=store)
    return 0 if all(r["ok"] for r in measured) else 1


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--storm", action="store_true",
                        help="store the runs as the storm table (issue 24: every peer started at once through the DHT, "
                             "does each join and stay in sync?) instead of the formula table")
    parser.add_argument("--exec-processes", action="store_true",
                        help="--storm: start every process as a fresh Python, as `swarmloco demo --exec-processes` does "
                             "(default: forked from one that imported torch, as `swarmloco demo` does)")
    args = parser.parse_args(argv)
    from scale_report import write_markdown

    if args.report_only:
        if not Path(args.json).exists():
            parser.error(f"--report-only: {args.json} does not exist; run the measurement first")
        stored = with_projection(json.loads(Path(args.json).read_text()))
        Path(args.json).write_text(json.dumps(stored, indent=1))
        write_markdown(Path(args.write_md or ROOT / "benchmarks/scale.md"), stored)
        return 0
    if args.exec_processes and not args.storm:
        parser.error("--exec-processes goes with --storm (the formula table's swarms are exec'd)")
    how = {"start": "exec" if args.exec_processes else FORKED} if args.storm else None
    return measure_and_store(args, "storm_runs" if args.storm else "runs", how=how)


if __name__ == "__main__":
    sys.exit(main())
