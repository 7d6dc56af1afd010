"""One swarmloco exchange-and-aggregate round vs one hivemind DecentralizedAverager all-reduce.

Same peers, same tensor, same wire precision, same processes, run alternately:

    .venv/bin/python scripts/bench_vs_hivemind.py                       # the full grid (~15 min on 2 cores)
    .venv/bin/python scripts/bench_vs_hivemind.py --peers 2 --numel 10000 --precision fp32 --repeats 1  # smoke

Each of N worker processes hosts BOTH systems: a hivemind DHT + DecentralizedAverager (started
first: hivemind forks, gRPC is not fork-safe) and a swarmloco Peer gRPC server (PayloadService,
byte-counting interceptors, ChannelPool: the real transport of peer/node/node.py).

swarmloco round, timed in every worker from a shared barrier to its aggregate:
  RoundMath.encode (fedavg outer, run codec, error feedback) -> sha256 -> signed UpdateHeader ->
  PayloadStore; headers go through the parent (the coordinator's manifest in a real run); then,
  one entry after another in peer_id order: verify each signed header (open_update), fetch the n-1
  other payloads over gRPC (fetch_payload: chunked stream, size + sha256 checked), decode,
  RoundMath.apply (mean). This harness (scripts/exchange_round.py) re-implements the exchange and
  fetches one payload at a time; peer/node has fetched a round's payloads in parallel since 176e4a9,
  so the fetch column here is what a sequential fetch costs, not what a node pays.
hivemind round: matchmaking runs BEFORE the barrier (step(require_trigger=True) until the group
  of n is formed, as hivemind.Optimizer pre-schedules it), then the barrier, then
  allow_allreduce() -> result(): butterfly all-reduce with its compression, averaged in place.
The round time is the slowest worker's. hivemind is thus timed WITHOUT its matchmaking, while
swarmloco's header relay is inside its timing: the comparison leans toward hivemind.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
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
COMPRESSED_CODEC = "topk:0.01+int8"
DEFAULT_CODEC = "fp16"  # peer/run/config.py CompressionConfig.codec


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


# --- worker process ------------------------------------------------------------------------


def _worker(rank: int, n: int, numel: int, precision: str, conn, barrier, match_s: float, profile_path: str) -> None:
    os.setsid()  # own process group: the parent can kill hivemind's p2pd with us
    mp.set_start_method("fork", force=True)  # hivemind forks its DHT and averager processes
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
    from exchange_round import ExchangePeer

    peer = ExchangePeer(local)
    profiler = None
    if profile_path and rank == 0:
        import cProfile

        profiler = cProfile.Profile()
    conn.send(("ready", peer.peer_id, peer.endpoint))

    def swarm_round(codec: str, round_: int) -> dict:
        peer.math(codec)  # build codec state outside the timing
        barrier.wait()
        t0 = time.perf_counter()
        if profiler:
            profiler.enable()
        conn.send(("header", *peer.commit(codec, round_)))
        t_encoded = time.perf_counter()
        manifest = conn.recv()  # [(peer_id, signed header bytes, endpoint)] sorted by peer_id
        t_manifest = time.perf_counter()
        params, split = peer.aggregate(manifest, codec, round_)
        t_end = time.perf_counter()
        if profiler:
            profiler.disable()
        error = float((params + exact_mean).abs().max())  # fedavg lr 1 stepped params to -mean
        return {"round_s": t_end - t0, "max_abs_error": error, "encode_s": t_encoded - t0, "manifest_s": t_manifest - t_encoded,
                **split, "payload_bytes": len(peer.payload)}

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

    round_ = 0
    try:
        while True:
            command = conn.recv()
            if command[0] == "stop":
                break
            if command[0] == "swarm":
                round_ += 1
                conn.send(("result", swarm_round(command[1], round_)))
            elif command[0] == "hivemind":
                conn.send(("result", hivemind_round()))
    finally:
        if profiler:
            import pstats

            with open(profile_path, "w") as f:
                pstats.Stats(profiler, stream=f).sort_stats("cumulative").print_stats(30)
        peer.close()
        averager.shutdown()
        dht.shutdown()


# --- parent ---------------------------------------------------------------------------------


class WorkerPool:
    """N workers that each host a swarmloco peer and a hivemind averager; always torn down."""

    def __init__(self, n: int, numel: int, precision: str, match_s: float, profile_path: str = "") -> None:
        ctx = mp.get_context("spawn")
        self.barrier = ctx.Barrier(n)
        self.conns, self.procs = [], []
        try:
            for rank in range(n):
                parent_end, child_end = ctx.Pipe()
                proc = ctx.Process(target=_worker, args=(rank, n, numel, precision, child_end, self.barrier, match_s, profile_path))
                proc.start()
                self.conns.append(parent_end)
                self.procs.append(proc)
                if rank == 0:
                    parent_end.send([])
                    initial = self._recv(parent_end, 120)
                else:
                    parent_end.send(initial)
            self.peers = [self._recv(c, 180)[1:] for c in self.conns]  # [(peer_id, endpoint)]
        except BaseException:
            self.close()
            raise

    def _recv(self, conn, timeout_s: float):
        if not conn.poll(timeout_s):
            raise TimeoutError(f"a benchmark worker did not answer within {timeout_s:.0f}s (overloaded machine?)")
        return conn.recv()

    def swarm_round(self, codec: str) -> list[dict]:
        for c in self.conns:
            c.send(("swarm", codec))
        headers = sorted((self._recv(c, 300)[1:] for c in self.conns), key=lambda h: h[0])
        for c in self.conns:
            c.send(headers)
        return [self._recv(c, 600)[1] for c in self.conns]

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


def run_config(n: int, numel: int, precision: str, repeats: int, codecs: list[str], match_s: float, profile: str) -> list[dict]:
    """Alternate swarmloco (each codec) and hivemind rounds `repeats` times after one warm-up."""
    times: dict[str, list[float]] = {c: [] for c in codecs} | {"hivemind": []}
    splits: dict[str, list[dict]] = {c: [] for c in codecs}
    payload: dict[str, int] = {}
    groups: list[int] = []
    errors = {c: 0.0 for c in times}  # max |result - exact mean| over peers and repetitions
    pool = WorkerPool(n, numel, precision, match_s, profile)
    try:
        for rep in range(repeats + 1):
            for codec in codecs:
                results = pool.swarm_round(codec)
                if rep:
                    slowest = max(results, key=lambda r: r["round_s"])
                    times[codec].append(slowest["round_s"])
                    splits[codec].append(slowest)
                    errors[codec] = max(errors[codec], *(r["max_abs_error"] for r in results))
                payload[codec] = results[0]["payload_bytes"]
            results = pool.hivemind_round()
            if rep:
                times["hivemind"].append(max(r["round_s"] for r in results))
                groups.append(min(r["group_size"] for r in results))
                errors["hivemind"] = max(errors["hivemind"], *(r["max_abs_error"] for r in results))
            print(f"  {n} peers {numel:,} {precision} rep {rep}{' (warm-up)' if not rep else ''}: "
                  + ", ".join(f"{c} {times[c][-1] if rep else results[0]['round_s']:.3f}s" for c in ([*codecs, 'hivemind'] if rep else ['hivemind'])),
                  flush=True)
    finally:
        pool.close()
    hive = statistics.median(times["hivemind"])
    rows = []
    for codec in codecs:
        ours = statistics.median(times[codec])
        split = {k: statistics.median(s[k] for s in splits[codec]) for k in ("encode_s", "manifest_s", "fetch_s", "decode_s", "aggregate_s")}
        rows.append({
            "peers": n, "numel": numel, "precision": precision, "codec": codec,
            "hivemind_compression": PRECISIONS[precision][1], "payload_bytes": payload[codec],
            "swarmloco_round_s": ours, "hivemind_round_s": hive, "ratio": ours / hive,
            "swarmloco_times_s": times[codec], "hivemind_times_s": times["hivemind"],
            "hivemind_group_sizes": groups, "swarmloco_max_abs_error": errors[codec],
            "hivemind_max_abs_error": errors["hivemind"], "swarmloco_split_s": split, "repeats": repeats,
        })
    return rows


def worker_bytes(n: int, numel: int) -> int:
    """Peak memory of one worker, measured at 8 x 10M (2.7 GB RSS): its update, the exact mean,
    hivemind's tensors, and for swarmloco n payloads + n decoded rows + the stacked (n, d) copy +
    the aggregator's two (n, d) float64 temporaries, about 4 * d * (6n + 10) bytes."""
    return 4 * numel * (6 * n + 10)


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


def wall_time_text(wall_s: float | None, finished: bool | None) -> str:
    """The md's wall-time line: a JSON kept from a run that stopped early has no total to state."""
    if wall_s is None:
        return "not recorded (this JSON was written before its run finished; the run did not reach its end)"
    if finished is False:
        return f"{wall_s:.0f} s until the last configuration written here (the run did not finish)"
    return f"{wall_s:.0f} s"


def saved_machine_lines(saved: dict) -> list[str]:
    """The machine lines of an earlier run, from what its JSON recorded (not this machine's)."""
    v = saved.get("versions", {})
    return [
        f"- CPU: {saved.get('cpu', '?')}, {saved.get('cores', '?')} cores visible (shared with other jobs)",
        f"- load average (1/5/15 min) before: {saved.get('load_before', '?')}; "
        f"after: {saved.get('load_after') or '(not recorded)'}",
        f"- {saved.get('os', 'OS not recorded')}, Python {v.get('python', '?')}, torch {v.get('torch', '?')}, hivemind {v.get('hivemind', '?')}, "
        f"grpcio {v.get('grpc', '?')}",
    ]


def write_markdown(path: Path, rows: list[dict], load_before: str, load_after: str, wall_s: float | None,
                   command: str | None = None, finished: bool | None = True, machine: list[str] | None = None) -> None:
    """`machine`: the machine lines (default: this machine, for a report written by the run itself)."""
    from machine_info import command_line, machine_lines, write_keeping_notes

    lines = [
        "# swarmloco exchange round vs hivemind all-reduce",
        "",
        "Written by `scripts/bench_vs_hivemind.py` (method in its docstring). One row = one (peers, tensor,",
        "precision); both systems ran alternately in the same worker processes on loopback; medians over",
        "the repetitions after one warm-up; round time = the slowest peer's. hivemind is timed from the",
        "trigger after matchmaking (its matchmaking excluded); swarmloco from encode to aggregate, header",
        "relay (the coordinator's manifest) included. ratio = swarmloco / hivemind (< 1: swarmloco faster).",
        "max err = largest |result - exact mean of the N fp32 tensors| over all peers and repetitions (randn data).",
        "",
        *(machine or machine_lines(load_before, load_after)),
        f"- total wall time: {wall_time_text(wall_s, finished)}",
        f"- command: `{command or command_line()}`",
        "",
        "| peers | floats | precision | swarmloco codec | payload (B) | swarmloco (s) | hivemind (s) | ratio | reps "
        "| max err swarmloco | max err hivemind |",
        "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['peers']} | {r['numel']:,} | {r['precision']} ({r['hivemind_compression']}) | {r['codec']} | "
                     f"{r['payload_bytes']:,} | {r['swarmloco_round_s']:.3f} | {r['hivemind_round_s']:.3f} | "
                     f"{r['ratio']:.2f} | {r['repeats']} | {r['swarmloco_max_abs_error']:.2g} | {r['hivemind_max_abs_error']:.2g} |")
    lines += ["", "swarmloco round split (median, slowest peer, seconds): encode+sign | manifest relay | fetch | decode | aggregate", "",
              "| peers | floats | codec | encode | relay | fetch | decode | aggregate |", "|---:|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        s = r["swarmloco_split_s"]
        lines.append(f"| {r['peers']} | {r['numel']:,} | {r['codec']} | {s['encode_s']:.3f} | {s['manifest_s']:.3f} | "
                     f"{s['fetch_s']:.3f} | {s['decode_s']:.3f} | {s['aggregate_s']:.3f} |")
    write_keeping_notes(path, "\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--numel", type=parse_numel, nargs="+", default=[1_000_000, 10_000_000], help="floats per peer (1M, 10M)")
    parser.add_argument("--precision", nargs="+", choices=list(PRECISIONS), default=list(PRECISIONS))
    parser.add_argument("--repeats", type=int, help="timed rounds per config (default: 5, fewer for big configs)")
    parser.add_argument("--extra-codecs", nargs="*", default=[COMPRESSED_CODEC], help="swarmloco codecs timed beside the matched one")
    parser.add_argument("--match-s", type=float, default=1.0, help="hivemind min_matchmaking_time (outside the timing)")
    parser.add_argument("--json", metavar="PATH", help="write all rows here")
    parser.add_argument("--write-md", nargs="?", const=str(ROOT / "benchmarks/vs_hivemind.md"), metavar="PATH")
    parser.add_argument("--profile", metavar="PATH", help="cProfile worker 0's swarmloco rounds into this text file")
    parser.add_argument("--force", action="store_true", help="run configurations that look too big for the free memory")
    parser.add_argument("--report-only", metavar="JSON", help="rewrite --write-md from an earlier --json file; run nothing")
    args = parser.parse_args(argv)
    if args.report_only:
        saved = json.loads(Path(args.report_only).read_text())
        write_markdown(Path(args.write_md or ROOT / "benchmarks/vs_hivemind.md"), saved["rows"], saved.get("load_before", "?"),
                       saved.get("load_after") or "(not recorded)", saved.get("wall_s"), saved.get("command"),
                       saved.get("finished"), saved_machine_lines(saved))
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
                need, free = n * worker_bytes(n, numel), available_bytes()
                if need > 0.9 * free and not args.force:
                    print(f"skipping {n} peers x {numel:,} {precision}: needs ~{need / 2**30:.1f} GiB, "
                          f"{free / 2**30:.1f} GiB available (--force to try anyway)", flush=True)
                    continue
                codecs = list(dict.fromkeys([PRECISIONS[precision][0], *args.extra_codecs]))
                rows += run_config(n, numel, precision, repeats_for(n, numel, args.repeats), codecs, args.match_s, args.profile or "")
                if args.json:  # keep partial results if a later config fails; say they are partial
                    _write_json(Path(args.json), rows, load_before, wall_s=time.monotonic() - started, finished=False)
    print(f"\n{'peers':>5} {'floats':>11} {'precision':>9} {'codec':>15} {'swarmloco s':>11} {'hivemind s':>10} {'ratio':>6}")
    for r in rows:
        print(f"{r['peers']:>5} {r['numel']:>11,} {r['precision']:>9} {r['codec']:>15} {r['swarmloco_round_s']:>11.3f} "
              f"{r['hivemind_round_s']:>10.3f} {r['ratio']:>6.2f}")
    if args.json:
        _write_json(Path(args.json), rows, load_before, load_average(), time.monotonic() - started, finished=True)
    if args.write_md:
        write_markdown(Path(args.write_md), rows, load_before, load_average(), time.monotonic() - started)
        print(f"wrote {args.write_md}")
    return 0


def _write_json(path: Path, rows: list[dict], load_before: str, load_after: str = "", wall_s: float | None = None,
                finished: bool = False) -> None:
    from machine_info import command_line, cpu_model, versions

    first = rows[0] if rows else {}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "swarmloco_round_s": first.get("swarmloco_round_s"), "hivemind_round_s": first.get("hivemind_round_s"),
        "rows": rows, "cpu": cpu_model(), "cores": os.cpu_count(), "load_before": load_before, "load_after": load_after,
        "wall_s": wall_s, "finished": finished, "os": f"{platform.system()} {platform.release()}",
        "versions": versions(), "command": command_line(),
    }, indent=2))


if __name__ == "__main__":
    sys.exit(main())
