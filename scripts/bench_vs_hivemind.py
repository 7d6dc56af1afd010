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
            reduce_owned: each owned slice's n inputs fetched over gRPC (8 threads), checked, decoded,
            reduced (rule `mean`), signed
  results   the signed slice results to the parent and the full list back (the coordinator's "results
            final"): includes waiting for the slowest owner
  gather    SliceExchange.gather (each aggregated slice fetched from one of its owners, 4 slices at a
            time; `--spot-checks` slices recomputed from their inputs) + the outer step (fedavg, lr 1)
all-to-all: encode, manifest as above; gather = every other payload fetched in parallel (ManifestFetcher),
  decoded, RoundMath.apply; reduce and results are empty.
hivemind round: matchmaking runs BEFORE the barrier (step(require_trigger=True) until the group of n
  is formed, as hivemind.Optimizer pre-schedules it), then the barrier, then allow_allreduce() ->
  result(): butterfly all-reduce with its compression, averaged in place.
The round time is the slowest worker's. hivemind is timed WITHOUT its matchmaking, while swarmloco's
header, manifest and result relays are inside its timing: the comparison leans toward hivemind.
Both are checked against the exact fp32 mean of the N tensors; every swarmloco peer's θ_{r+1} must be
bit-identical (sha256 compared).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
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

PRECISIONS = {  # wire precision -> (swarmloco codec, hivemind compression class)
    "fp32": ("fp32", "NoCompression"),
    "fp16": ("fp16", "Float16Compression"),
    "8-bit": ("int8", "Uniform8BitQuantization"),
}
SPLIT_KEYS = ("encode_s", "manifest_s", "reduce_s", "results_s", "gather_s")


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


# --- worker process ------------------------------------------------------------------------


def _worker(rank: int, n: int, numel: int, precision: str, spec_fields: list[dict], conn, barrier, match_s: float,
            profile_path: str) -> None:
    os.setsid()  # own process group: the parent can kill hivemind's p2pd with us
    mp.set_start_method("fork", force=True)  # hivemind forks its DHT and averager processes
    import hashlib
    import resource

    import torch
    import hivemind
    from hivemind.averaging.control import AveragingStage

    torch.set_num_threads(1)
    initial_peers = conn.recv()
    dht = hivemind.DHT(initial_peers=initial_peers, host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    if rank == 0:
        conn.send([str(m) for m in dht.get_visible_maddrs()])

    def update_of(r: int) -> torch.Tensor:
        return torch.randn(numel, generator=torch.Generator().manual_seed(r))  # (d,) peer r's update

    local = update_of(rank)
    exact_mean = sum(update_of(r) for r in range(n)) / n  # (d,) what both systems must compute
    compression = getattr(hivemind.compression, PRECISIONS[precision][1])()
    averager = hivemind.averaging.DecentralizedAverager(
        [local.clone()], dht, start=True, prefix="bench", target_group_size=n, min_group_size=n,
        min_matchmaking_time=match_s, request_timeout=max(0.5, match_s / 2), compression=compression,
    )

    # gRPC only now: hivemind's DHT and averager have forked their children.
    from exchange_round import ExchangePeer, ExchangeSpec
    from profiling import ThreadProfiles

    specs = [ExchangeSpec(**fields) for fields in spec_fields]
    peers = [ExchangePeer(local, spec) for spec in specs]
    profiles = [ThreadProfiles.attach(p) if profile_path and rank == 0 else None for p in peers]
    conn.send(("ready", [(p.peer_id, p.endpoint) for p in peers]))

    def swarm_round(i: int, round_: int, coordinator_key: bytes) -> dict:
        peer, profile = peers[i], profiles[i]
        barrier.wait()
        before = peer.counter.total()
        t0 = time.perf_counter()
        with profile or _nothing():
            conn.send(("header", *peer.commit(round_)))
            t_encoded = time.perf_counter()
            signed_manifest = conn.recv()
            t_manifest = time.perf_counter()
            peer.open(signed_manifest, coordinator_key, round_)
            conn.send(("results", peer.reduce()))
            t_reduced = time.perf_counter()
            results = conn.recv()
            t_results = time.perf_counter()
            params = peer.gather(results, round_)
            t_end = time.perf_counter()
        after = peer.counter.total()
        outcome = peer.outcome
        return {
            "round_s": t_end - t0, "encode_s": t_encoded - t0, "manifest_s": t_manifest - t_encoded,
            "reduce_s": t_reduced - t_manifest, "results_s": t_results - t_reduced, "gather_s": t_end - t_results,
            "max_abs_error": float((params + exact_mean).abs().max()),  # fedavg lr 1 stepped θ = 0 to -aggregate
            "params_sha256": hashlib.sha256(params.numpy().tobytes()).hexdigest(),
            "payload_bytes": len(peer.payload), "sent_bytes": after.sent - before.sent,
            "received_bytes": after.received - before.received,
            "recomputed": len(outcome.recomputed) if outcome is not None else 0,
            "liars": len(outcome.liars) if outcome is not None else 0,
            "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }

    def hivemind_round() -> dict:
        with averager.get_tensors() as tensors:
            tensors[0].copy_(local)
        control = averager.step(require_trigger=True, wait=False, timeout=120)
        while control.stage != AveragingStage.AWAITING_TRIGGER and not control.done():
            time.sleep(0.005)
        barrier.wait()
        t0 = time.perf_counter()
        control.allow_allreduce()
        group = control.result()
        t_end = time.perf_counter()
        with averager.get_tensors() as tensors:
            error = float((tensors[0] - exact_mean).abs().max())
        return {"round_s": t_end - t0, "group_size": len(group) if group else 0, "max_abs_error": error}

    try:
        while True:
            command = conn.recv()
            if command[0] == "stop":
                break
            if command[0] == "swarm":
                conn.send(("result", swarm_round(*command[1:])))
            elif command[0] == "hivemind":
                conn.send(("result", hivemind_round()))
    finally:
        if profile_path and rank == 0:
            ThreadProfiles.write(profile_path, [(s.label, p) for s, p in zip(specs, profiles)],
                                 header=f"worker 0 of {n} peers x {numel:,} floats, {precision}")
        for p in peers:
            p.close()
        averager.shutdown()
        dht.shutdown()


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


# --- parent ---------------------------------------------------------------------------------


class WorkerPool:
    """N workers that each host swarmloco peers and a hivemind averager; the parent is the coordinator."""

    def __init__(self, n: int, numel: int, precision: str, specs: list, match_s: float, profile_path: str = "") -> None:
        from exchange_round import BenchCoordinator

        ctx = mp.get_context("spawn")
        self.barrier = ctx.Barrier(n)
        self.conns, self.procs = [], []
        self.rounds = 0
        try:
            for rank in range(n):
                parent_end, child_end = ctx.Pipe()
                proc = ctx.Process(target=_worker, args=(rank, n, numel, precision, [asdict(s) for s in specs], child_end, self.barrier, match_s, profile_path))
                proc.start()
                self.conns.append(parent_end)
                self.procs.append(proc)
                if rank == 0:
                    parent_end.send([])
                    initial = self._recv(parent_end, 120)
                else:
                    parent_end.send(initial)
            for c in self.conns:
                self._recv(c, 180)
            # gRPC in the parent only after every worker has forked its hivemind children.
            self.coordinators = [BenchCoordinator(spec, numel) for spec in specs]
        except BaseException:
            self.close()
            raise

    def _recv(self, conn, timeout_s: float):
        if not conn.poll(timeout_s):
            raise TimeoutError(f"a benchmark worker did not answer within {timeout_s:.0f}s (overloaded machine?)")
        return conn.recv()

    def swarm_round(self, i: int) -> tuple[list[dict], float]:
        """One round of variant i; (each worker's figures, the coordinator's manifest seconds)."""
        self.rounds += 1
        coordinator = self.coordinators[i]
        for c in self.conns:
            c.send(("swarm", i, self.rounds, coordinator.public_key))
        headers = [tuple(self._recv(c, 300)[1:]) for c in self.conns]
        t = time.perf_counter()
        signed_manifest = coordinator.manifest(headers, self.rounds)
        coordinator_s = time.perf_counter() - t
        for c in self.conns:
            c.send(signed_manifest)
        results = [r for c in self.conns for r in self._recv(c, 600)[1]]
        for c in self.conns:
            c.send(results)
        return [self._recv(c, 600)[1] for c in self.conns], coordinator_s

    def hivemind_round(self) -> list[dict]:
        for c in self.conns:
            c.send(("hivemind",))
        return [self._recv(c, 600)[1] for c in self.conns]

    def close(self) -> None:
        for c in self.conns:
            try:
                c.send(("stop",))
            except (OSError, BrokenPipeError):
                pass
        deadline = time.monotonic() + 20
        for p in self.procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
        for p in self.procs:
            if p.is_alive() or p.pid:
                try:
                    os.killpg(p.pid, 9)  # the worker's group: p2pd daemons and averager children too
                except (ProcessLookupError, PermissionError):
                    pass
            p.join(timeout=5)


def run_config(n: int, numel: int, precision: str, repeats: int, specs: list, match_s: float, profile: str) -> list[dict]:
    """Alternate swarmloco (each variant) and hivemind rounds `repeats` times after one warm-up."""
    from machine_info import load_average

    labels = [s.label for s in specs]
    times: dict[str, list[float]] = {label: [] for label in labels} | {"hivemind": []}
    slowest: dict[str, list[dict]] = {label: [] for label in labels}
    coordinator_s: dict[str, list[float]] = {label: [] for label in labels}
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
                    errors[label] = max(errors[label], *(r["max_abs_error"] for r in results))
            results = pool.hivemind_round()
            hive_s = max(r["round_s"] for r in results)
            if rep:
                times["hivemind"].append(hive_s)
                groups.append(min(r["group_size"] for r in results))
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
            "received_bytes_per_peer": statistics.median(f["max_received_bytes"] for f in figures),
            "sent_bytes_per_peer": statistics.median(f["max_sent_bytes"] for f in figures),
            "recomputed_slices": max(f["recomputed"] for f in figures), "liars": max(f["liars"] for f in figures),
            "max_rss_mb": max(f["max_rss_mb"] for f in figures), "repeats": repeats,
            "load_before": load_before, "load_after": load_average(),
        })
    return rows


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
