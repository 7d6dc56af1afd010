"""One swarmloco exchange round (the real exchange code) vs one hivemind DecentralizedAverager all-reduce.

Same peers, same tensor, same wire precision, same processes, run alternately:

    .venv/bin/python scripts/bench_vs_hivemind.py --peers 8 --numel 1M 10M --precision fp16 --json benchmarks/vs_hivemind.json --write-md
    .venv/bin/python scripts/bench_vs_hivemind.py --peers 2 --numel 10000 --precision fp32 --repeats 1  # smoke

Each of N worker processes hosts BOTH systems: a hivemind DHT + DecentralizedAverager (started
first: hivemind forks, gRPC is not fork-safe) and, per swarmloco variant timed (`--exchange`), an
ExchangePeer of scripts/exchange_round.py: a gRPC Peer server (PayloadService, byte-counting
interceptors), a ChannelPool, 8 fetch threads and the real SliceExchange / ManifestFetcher.

swarmloco round, timed in every worker from a shared barrier until its θ_{r+1} is computed:
  encode    RoundMath.encode, sha256 of the payload and of every slice, signed header, stored, slices served
  manifest  the header to the parent, which plays the coordinator (verifies every header, builds the
            manifest with sliced_manifest's owner draw, signs it with its own key) and sends the signed
            bytes back: includes waiting for the slowest peer's header
  reduce    open_manifest + SliceExchange.open_round (every header verified, owner draw re-checked) and
            reduce_owned: each owned slice's n inputs traded with the other owners over gRPC (one SwapSlices stream a pair), checked, decoded,
            reduced (rule `mean`), signed
  results   the signed slice results to the parent and the full list back (the coordinator's "results
            final"): includes waiting for the slowest owner
  gather    SliceExchange.gather (each aggregated slice fetched from one of its owners, 4 slices at a
            time; spot checks as a peer runs them: K slices recomputed from their inputs with probability
            min(1, coverage·S / (n·K)), coverage the config's 0.5: every round at 8 peers, S = 32)
            + the outer step (fedavg, lr 1)
all-to-all: encode, manifest as above; gather = every other payload fetched in parallel (ManifestFetcher),
  decoded, RoundMath.apply; reduce and results are empty.
hivemind round: matchmaking runs BEFORE the barrier (step(require_trigger=True) until the group of n
  is formed, as hivemind.Optimizer pre-schedules it), then the barrier, then allow_allreduce() ->
  result(): butterfly all-reduce with its compression, averaged in place.
The round time is the slowest worker's. hivemind is timed WITHOUT its matchmaking, while swarmloco's
header, manifest and result relays are inside its timing: the comparison leans toward hivemind.
Both are checked against the exact fp32 mean of the N tensors; every swarmloco peer's θ_{r+1} must be
bit-identical (sha256 compared). Those checks run after a second barrier, once every worker's round
has ended (both systems): run inside the round of a slower worker, they took CPU from it on the shared cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for extra in (str(ROOT), str(ROOT / "scripts")):
    if extra not in sys.path:
        sys.path.insert(0, extra)

from vs_hivemind_workers import PRECISIONS, SPLIT_KEYS, WorkerPool  # noqa: E402


def parse_numel(text: str) -> int:
    t = text.strip().upper()
    scale = {"K": 1_000, "M": 1_000_000}.get(t[-1:], 1)
    try:
        value = int(float(t[:-1] if scale > 1 else t) * scale)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--numel {text!r}: use an integer or e.g. 1M, 10M, 250K") from None
    if value < 64:
        raise argparse.ArgumentTypeError("--numel must be at least 64")
    return value


def parse_sliced(text: str) -> dict:
    """S:R:K[:noef] -> the sliced exchange's settings of one timed variant."""
    parts = text.split(":")
    try:
        slices, replicas, spot_checks = (int(p) for p in parts[:3])
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sliced {text!r}: use S:R:K[:noef], e.g. 32:2:1 or 8:1:0:noef") from None
    if len(parts) > 4 or (len(parts) == 4 and parts[3] != "noef"):
        raise argparse.ArgumentTypeError(f"--sliced {text!r}: the only option after S:R:K is noef")
    return {"slices": slices, "replicas": replicas, "spot_checks": spot_checks, "error_feedback": len(parts) == 3}


def run_config(n: int, numel: int, precision: str, repeats: int, specs: list, match_s: float, profile: str) -> list[dict]:
    """Alternate swarmloco (each variant) and hivemind rounds `repeats` times after one warm-up."""
    from machine_info import load_average

    labels = [s.label for s in specs]
    times: dict[str, list[float]] = {label: [] for label in labels} | {"hivemind": []}
    slowest: dict[str, list[dict]] = {label: [] for label in labels}
    coordinator_s: dict[str, list[float]] = {label: [] for label in labels}
    cpu: dict[str, list[float]] = {label: [] for label in times}  # CPU seconds of all workers per round
    identical = {label: True for label in labels}
    groups: list[int] = []
    errors = {label: 0.0 for label in times}  # max |result - exact mean| over peers and repetitions
    load_before = load_average()
    pool = WorkerPool(n, numel, precision, specs, match_s, profile)
    try:
        for rep in range(repeats + 1):
            line = []
            for i, label in enumerate(labels):
                results, coord_s = pool.swarm_round(i)
                identical[label] &= len({r["params_sha256"] for r in results}) == 1
                worst = max(results, key=lambda r: r["round_s"])
                line.append(f"{label} {worst['round_s']:.3f}s")
                if rep:
                    times[label].append(worst["round_s"])
                    slowest[label].append(worst | {"max_received_bytes": max(r["received_bytes"] for r in results),
                                                   "max_sent_bytes": max(r["sent_bytes"] for r in results),
                                                   "max_rss_mb": max(r["max_rss_mb"] for r in results)})
                    coordinator_s[label].append(coord_s)
                    cpu[label].append(sum(r["cpu_s"] for r in results))
                    errors[label] = max(errors[label], *(r["max_abs_error"] for r in results))
            results = pool.hivemind_round()
            hive_s = max(r["round_s"] for r in results)
            if rep:
                times["hivemind"].append(hive_s)
                groups.append(min(r["group_size"] for r in results))
                cpu["hivemind"].append(sum(r["cpu_s"] for r in results))
                errors["hivemind"] = max(errors["hivemind"], *(r["max_abs_error"] for r in results))
            print(f"  {n} peers {numel:,} {precision} rep {rep}{' (warm-up)' if not rep else ''}: "
                  + ", ".join([*line, f"hivemind {hive_s:.3f}s"]), flush=True)
    finally:
        pool.close()
    hive = statistics.median(times["hivemind"])
    rows = []
    for spec, label in zip(specs, labels):
        ours = statistics.median(times[label])
        figures = slowest[label]
        rows.append({
            "peers": n, "numel": numel, "precision": precision, **asdict(spec), "label": label,
            "hivemind_compression": PRECISIONS[precision][1], "payload_bytes": figures[0]["payload_bytes"],
            "swarmloco_round_s": ours, "hivemind_round_s": hive, "ratio": ours / hive,
            "swarmloco_times_s": times[label], "hivemind_times_s": times["hivemind"], "hivemind_group_sizes": groups,
            "swarmloco_max_abs_error": errors[label], "hivemind_max_abs_error": errors["hivemind"],
            "swarmloco_identical_on_every_peer": identical[label],
            "swarmloco_split_s": {k: statistics.median(f[k] for f in figures) for k in SPLIT_KEYS},
            "coordinator_manifest_s": statistics.median(coordinator_s[label]),
            "swarmloco_cpu_s": statistics.median(cpu[label]), "hivemind_cpu_s": statistics.median(cpu["hivemind"]),
            "swarmloco_max_gc_s": max(f["gc_s"] for f in figures),
            "swarmloco_thread_cpu_s": thread_split(figures),
            "received_bytes_per_peer": statistics.median(f["max_received_bytes"] for f in figures),
            "sent_bytes_per_peer": statistics.median(f["max_sent_bytes"] for f in figures),
            "recomputed_slices": max(f["recomputed"] for f in figures), "liars": max(f["liars"] for f in figures),
            "max_rss_mb": max(f["max_rss_mb"] for f in figures), "repeats": repeats,
            "load_before": load_before, "load_after": load_average(),
        })
    return rows


def thread_split(figures: list[dict]) -> dict[str, float]:
    """Median over the repetitions of one worker's (the round's slowest) CPU seconds by kind of thread."""
    kinds = {k for f in figures for k in f.get("thread_cpu_s", {})}
    split = {k: statistics.median(f.get("thread_cpu_s", {}).get(k, 0.0) for f in figures) for k in kinds}
    return dict(sorted(split.items(), key=lambda kv: -kv[1]))


def worker_bytes(n: int, numel: int, specs: list) -> int:
    """Peak memory of one worker. all-to-all, measured at 8 x 10M (2.7 GB RSS before the aggregator
    lost its float64 copies): n payloads + n decoded rows + the stacked (n, d) copy, about
    4·d·(6n + 10) bytes. sliced: its update, the exact mean, hivemind's tensors, the payload and its
    served slices, the owned slices' inputs (~r·n/m·d values), the gathered (d,) and θ: ~4·d·16."""
    return max(4 * numel * (6 * n + 10) if s.mode == "all-to-all" else 4 * numel * 16 for s in specs)


def available_bytes() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


def repeats_for(n: int, numel: int, requested: int | None) -> int:
    if requested is not None:
        return requested
    return 2 if n * numel >= 40_000_000 else 3 if n * numel >= 10_000_000 else 5


def profile_path(base: str, n: int, numel: int, precision: str) -> str:
    """One profile file per configuration: PATH.txt -> PATH_8x1M_fp16.txt."""
    path = Path(base)
    size = f"{numel // 1_000_000}M" if numel % 1_000_000 == 0 else f"{numel // 1000}K" if numel % 1000 == 0 else str(numel)
    return str(path.with_name(f"{path.stem}_{n}x{size}_{precision}{path.suffix or '.txt'}"))


def main(argv: list[str] | None = None) -> int:
    from exchange_round import ExchangeSpec  # gRPC modules: never imported by the workers before hivemind forks
    from vs_hivemind_report import write_markdown

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", type=int, nargs="+", default=[8])
    parser.add_argument("--numel", type=parse_numel, nargs="+", default=[1_000_000, 10_000_000], help="floats per peer (1M, 10M)")
    parser.add_argument("--precision", nargs="+", choices=list(PRECISIONS), default=["fp16"])
    parser.add_argument("--exchange", nargs="+", choices=["sliced", "all-to-all"], default=["sliced"],
                        help="swarmloco exchange modes to time (each beside hivemind)")
    parser.add_argument("--all-to-all-max-numel", type=parse_numel, default=2_000_000,
                        help="time all-to-all only up to this size (its (n, d) aggregation is what OOMed at 8 x 10M)")
    parser.add_argument("--sliced", type=parse_sliced, nargs="+", default=[parse_sliced("32:2:1")], metavar="S:R:K[:noef]",
                        help="sliced variants: exchange.slices S, replicas R, spot_checks K; noef = no error feedback "
                             "(default 32:2:1, the run config's defaults)")
    parser.add_argument("--no-error-feedback", action="store_true", help="all-to-all without error feedback")
    parser.add_argument("--aggregator", default="mean", help="aggregation rule (mean: checkable against the exact mean)")
    parser.add_argument("--repeats", type=int, help="timed rounds per config (default: 5, fewer for big configs)")
    parser.add_argument("--match-s", type=float, default=1.0, help="hivemind min_matchmaking_time (outside the timing)")
    parser.add_argument("--json", metavar="PATH", help="write all rows here")
    parser.add_argument("--write-md", nargs="?", const=str(ROOT / "benchmarks/vs_hivemind.md"), metavar="PATH")
    parser.add_argument("--profile", metavar="PATH", help="cProfile worker 0's swarmloco rounds (every thread) into this text file")
    parser.add_argument("--force", action="store_true", help="run configurations that look too big for the free memory")
    parser.add_argument("--report-only", metavar="JSON", nargs="+", help="rewrite --write-md from earlier --json files (rows in "
                        "the order given); run nothing")
    args = parser.parse_args(argv)
    if args.report_only:
        write_markdown(Path(args.write_md or ROOT / "benchmarks/vs_hivemind.md"),
                       [(_shown(Path(p)), json.loads(Path(p).read_text())) for p in args.report_only])
        return 0
    if any(n < 2 for n in args.peers):
        parser.error("--peers: an all-reduce needs at least 2 peers")
    _exit_cleanly_on_signals()
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    from machine_info import load_average

    load_before, started = load_average(), time.monotonic()
    rows: list[dict] = []
    for numel in args.numel:
        for n in args.peers:
            for precision in args.precision:
                codec = PRECISIONS[precision][0]
                specs = [ExchangeSpec(codec=codec, mode="sliced", aggregator=args.aggregator, **variant)
                         for variant in args.sliced if "sliced" in args.exchange]
                if "all-to-all" in args.exchange and numel <= args.all_to_all_max_numel:
                    specs.append(ExchangeSpec(codec=codec, mode="all-to-all", aggregator=args.aggregator,
                                              error_feedback=not args.no_error_feedback))
                need, free = n * worker_bytes(n, numel, specs), available_bytes()
                if need > 0.9 * free and not args.force:
                    print(f"skipping {n} peers x {numel:,} {precision}: needs ~{need / 2**30:.1f} GiB, "
                          f"{free / 2**30:.1f} GiB available (--force to try anyway)", flush=True)
                    continue
                profile = profile_path(args.profile, n, numel, precision) if args.profile else ""
                rows += run_config(n, numel, precision, repeats_for(n, numel, args.repeats), specs, args.match_s, profile)
                if args.json:  # keep partial results if a later config fails; say they are partial
                    _write_json(Path(args.json), run_record(rows, load_before, wall_s=time.monotonic() - started, finished=False))
    print(f"\n{'peers':>5} {'floats':>11} {'exchange':>38} {'swarmloco s':>11} {'hivemind s':>10} {'ratio':>6}")
    for r in rows:
        print(f"{r['peers']:>5} {r['numel']:>11,} {r['label']:>38} {r['swarmloco_round_s']:>11.3f} "
              f"{r['hivemind_round_s']:>10.3f} {r['ratio']:>6.2f}")
    record = run_record(rows, load_before, load_average(), time.monotonic() - started, finished=True)
    if args.json:
        _write_json(Path(args.json), record)
    if args.write_md:  # from the record the JSON holds: the md is what --report-only writes from it
        write_markdown(Path(args.write_md), [(_shown(Path(args.json)) if args.json else None, record)])
        print(f"wrote {args.write_md}")
    return 0


def _exit_cleanly_on_signals() -> None:
    """SIGTERM / SIGHUP (timeout, a closed terminal) raise SystemExit, so WorkerPool.close runs
    and kills every worker's process group; SIGKILL is covered by the workers themselves, which
    kill their group once this process is gone (vs_hivemind_workers._die_with)."""
    import signal

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(f"stopped by signal {signum}: workers killed")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)


def _shown(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def run_record(rows: list[dict], load_before: str, load_after: str = "", wall_s: float | None = None,
               finished: bool = False) -> dict:
    """What the JSON holds and the md is written from: the rows, this machine's facts, load, command."""
    from machine_info import command_line, machine_facts

    facts = machine_facts()
    return {"rows": rows, "cpu": facts["cpu"], "cores": facts["cores"], "load_before": load_before, "load_after": load_after,
            "wall_s": wall_s, "finished": finished, "os": facts["os"], "versions": facts["versions"], "command": command_line()}


def _write_json(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    sys.exit(main())
