"""What a swarm costs on the wire, from the transport's own byte counters (never an estimate).

    .venv/bin/python scripts/measure_bandwidth.py --peers 4 --rounds 3 --inner-steps 10          # local swarm, table
    .venv/bin/python scripts/measure_bandwidth.py --codec fp32 --json out.json --write-md        # + benchmarks/bandwidth.md
    .venv/bin/python scripts/measure_bandwidth.py --coordinator 10.0.0.5:31338 --duration 120    # attach to a running swarm
    .venv/bin/python scripts/measure_bandwidth.py --from-workdir /tmp/swarmloco-demo-xyz          # re-read a finished run
    .venv/bin/python scripts/measure_bandwidth.py --report-only benchmarks/bandwidth.json --write-md  # md from the JSON

Local mode starts a coordinator and peers as processes on loopback (peer.cli.launcher.Swarm, as
`swarmloco demo` does) and reads each peer's --summary-json: per round, the ByteCounter
interceptor counts (bytes_sent / bytes_received, every RPC, serialized protobuf sizes) and the
time split compute / encode / wait (commit + manifest) / fetch / aggregate, plus the per-remote
snapshot (coordinator vs other peers). Goodput of update transfers = payload bytes fetched in the
round / fetch time. Beside them: the codec's largest payload (max_encoded_size of the model: exact
for fixed-size codecs, an upper bound for chunk-topk / dct-topk) and the real payload length. Attach mode polls `swarmloco status` JSON instead: per-peer totals,
the last round's bytes and the utilization the peers report in heartbeats (no time split there).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for extra in (str(ROOT), str(ROOT / "scripts")):
    if extra not in sys.path:
        sys.path.insert(0, extra)

SPLIT_KEYS = ("compute_s", "encode_s", "wait_s", "fetch_s", "aggregate_s")
MB = 1e6


def codec_sizes(codec: str, numel: int) -> dict[str, int]:
    from optim import codecs

    return {"numel": numel, "fp32_bytes": 4 * numel, "codec_bytes": codecs.build(codec).max_encoded_size(numel)}


def analyze(peer_summaries: list[dict], *, codec: str, numel: int, coordinator_keys: tuple[str, ...] = ()) -> dict:
    """Per-peer per-round rows and swarm-wide medians from peer --summary-json files.

    `coordinator_keys`: the coordinator's endpoint (a peer's calls to it are counted under it) and
    its peer_id (its calls to the peer, e.g. fetching the payload to verify it, are counted under
    that), so the per-remote snapshot splits into coordinator and peer-to-peer traffic.
    """
    sizes = codec_sizes(codec, numel)
    rows = []
    for summary in peer_summaries:
        peer = summary.get("peer_id", "?")[:8]
        traffic = summary.get("traffic", {})
        for record in summary.get("history", []):
            fetched = record["payload_bytes"] * max(0, record["updates"] - 1)  # every update but its own
            by_remote = traffic.get(str(record["round"]), {})
            coord = [t for remote, t in by_remote.items() if remote in coordinator_keys]
            others = [t for remote, t in by_remote.items() if remote not in coordinator_keys]
            round_s = record.get("round_s") or sum(record[k] for k in SPLIT_KEYS)
            rows.append({
                "peer": peer, "round": record["round"], "updates": record["updates"],
                "bytes_sent": record["bytes_sent"], "bytes_received": record["bytes_received"],
                # from the per-remote snapshot, whose round bucket also holds traffic between rounds
                "coordinator_sent": sum(t["bytes_sent"] for t in coord), "coordinator_received": sum(t["bytes_received"] for t in coord),
                "peers_sent": sum(t["bytes_sent"] for t in others), "peers_received": sum(t["bytes_received"] for t in others),
                "payload_bytes": record["payload_bytes"], "fetched_payload_bytes": fetched,
                "goodput_MBps": fetched / MB / record["fetch_s"] if record["fetch_s"] > 0 and fetched else None,
                **{k: record[k] for k in SPLIT_KEYS}, "round_s": round_s,
                "utilization": record["compute_s"] / round_s if round_s > 0 else None,
                # overlapped rounds: inner steps of the next phase run when this round's average landed
                "landed_after_steps": record.get("landed_after_steps"),
                "phase_steps": record.get("inner_steps"),  # the inner steps this round's phase ran (a window's vary)
                "next_window_s": record.get("next_window_s"),  # overlapped: the window the manifest gave the next phase
                # sliced exchange: wall-clock end of each exchange step (peer/exchange/sliced_peer.py)
                "timeline": record.get("timeline") or None,
                # sliced exchange: the owned slices' reduces, wall / CPU / wait for a core (peer/run/thread_clock.py)
                "reduce_times": (record.get("slices") or {}).get("reduce"),
            })

    def median(key: str) -> float | None:
        values = [r[key] for r in rows if r[key] is not None]
        return statistics.median(values) if values else None

    total_compute = sum(r["compute_s"] for r in rows)
    total_round = sum(r["round_s"] for r in rows)
    payloads = sorted({r["payload_bytes"] for r in rows})
    return {
        "codec": codec, **sizes, "payload_bytes_measured": payloads,
        "peers": len(peer_summaries), "rounds": len({r["round"] for r in rows}), "rows": rows,
        "median": {k: median(k) for k in ("bytes_sent", "bytes_received", "goodput_MBps", *SPLIT_KEYS, "round_s")},
        "bytes_per_peer_per_round": statistics.mean(r["bytes_sent"] + r["bytes_received"] for r in rows) if rows else None,
        "utilization": total_compute / total_round if total_round else None,
    }


def format_table(result: dict) -> str:
    """Per-peer per-round rows; a `land` column (inner steps of the next phase run when the round's
    average landed) only where some row has one (overlapped rounds), "-" on a row without it; a
    `steps` column (the inner steps of the round's own phase) where some phase did not run H."""
    landing = any(r.get("landed_after_steps") is not None for r in result["rows"])
    varied = any(r.get("phase_steps") not in (None, result.get("inner_steps")) for r in result["rows"])
    lines = [
        f"codec {result['codec']}: {result['numel']:,} params | payload measured {', '.join(f'{p:,}' for p in result['payload_bytes_measured'])} B"
        f" | codec size {result['codec_bytes']:,} B | fp32 {result['fp32_bytes']:,} B",
        f"{'peer':8} {'rnd':>3} {'upd':>3} {'sent':>11} {'recv':>11} {'coordinator sent/recv':>21} {'peers sent/recv':>21} {'goodput':>9} "
        f"{'compute':>7} {'encode':>6} {'wait':>6} {'fetch':>6} {'aggr':>6} {'round':>6} {'util':>5}" + (f" {'land':>4}" if landing else "")
        + (f" {'steps':>5}" if varied else ""),
    ]
    for r in result["rows"]:
        goodput = f"{r['goodput_MBps']:.1f}MB/s" if r["goodput_MBps"] is not None else "-"
        lines.append(
            f"{r['peer']:8} {r['round'] + 1:>3} {r['updates']:>3} {r['bytes_sent']:>11,} {r['bytes_received']:>11,} "
            f"{r['coordinator_sent']:>10,}/{r['coordinator_received']:<10,} {r['peers_sent']:>10,}/{r['peers_received']:<10,} {goodput:>9} {r['compute_s']:>7.2f} {r['encode_s']:>6.3f} "
            f"{r['wait_s']:>6.2f} {r['fetch_s']:>6.3f} {r['aggregate_s']:>6.3f} {r['round_s']:>6.2f} "
            f"{100 * r['utilization']:>4.0f}%" + (f" {_or_dash(r.get('landed_after_steps')):>4}" if landing else "")
            + (f" {_or_dash(r.get('phase_steps')):>5}" if varied else "")
        )
    m = result["median"]
    if result["rows"]:
        lines.append(
            f"median   sent {m['bytes_sent']:,.0f} B recv {m['bytes_received']:,.0f} B per peer per round | goodput "
            f"{(m['goodput_MBps'] or 0):.1f} MB/s | compute {m['compute_s']:.2f}s encode {m['encode_s']:.3f}s wait {m['wait_s']:.2f}s "
            f"fetch {m['fetch_s']:.3f}s aggregate {m['aggregate_s']:.3f}s | utilization {100 * result['utilization']:.1f}%"
        )
    return "\n".join(lines)


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)


# --- sources: a local swarm, a finished workdir, a running coordinator ---------------------------


def write_run_config(workdir: Path, *, peers: int, rounds: int, inner_steps: int, codec: str, overlap: bool = False,
                     exchange: str | None = None, window_s: float = 0.0, overlap_window: bool = True) -> Path:
    """The demo run config with these overrides, validated as `swarmloco demo` does, in workdir/run.json
    (`exchange`: exchange.mode, None keeps the default; `window_s`: rounds.window_s, 0 keeps fixed H;
    `overlap_window`: rounds.overlap_window, false for overlapped phases of exactly H steps)."""
    from peer.cli.main import build_parser, load_run_config
    from peer.cli.run_flags import resolve_run_config

    args = build_parser().parse_args(["demo", "--peers", str(peers), "--rounds", str(rounds), "--inner-steps", str(inner_steps),
                                      "--codec", codec, *(["--overlap"] if overlap else [])])
    args.expected_peers = peers
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "run.json"
    cfg = load_run_config(args)
    if exchange is not None:
        cfg = resolve_run_config(cfg, {"exchange.mode": exchange})
    if window_s:
        cfg = resolve_run_config(cfg, {"rounds.window_s": window_s})
    if not overlap_window:
        cfg = resolve_run_config(cfg, {"rounds.overlap_window": False})
    path.write_text(cfg.to_json())
    return path


def run_local_swarm(*, peers: int, rounds: int, inner_steps: int, codec: str, workdir: Path, echo: bool = False,
                    peer_args: list[str] | None = None) -> dict:
    """Run a swarm to completion on loopback and return analyze()'s result plus the wall time."""
    from peer.cli.launcher import Swarm

    write_run_config(workdir, peers=peers, rounds=rounds, inner_steps=inner_steps, codec=codec)
    started = time.monotonic()
    with Swarm(workdir, echo=echo) as swarm:
        coordinator = swarm.start_coordinator(["--config", str(workdir / "run.json")])
        children = [swarm.start_peer(f"peer{i}", ["--shard", f"{i}/{peers}", "--log-every", "1000", *(peer_args or [])])
                    for i in range(peers)]
        swarm.wait(coordinator, 300 + 60 * rounds)
        for child in children:
            swarm.wait(child, 60)
    return {**read_workdir(workdir), "wall_s": time.monotonic() - started, "workdir": str(workdir)}


def read_workdir(workdir: Path) -> dict:
    from peer.run.config import RunConfig
    from peer.learn.model import build_model, num_params

    cfg = RunConfig.from_json((workdir / "run.json").read_text())
    summaries = [json.loads(p.read_text()) for p in sorted(workdir.glob("peer*.json"))]
    if not summaries:
        raise FileNotFoundError(f"no peer*.json summaries in {workdir}: did the peers run with --summary-json?")
    keys: tuple[str, ...] = ()
    if (workdir / "coordinator.json").exists():
        coordinator = json.loads((workdir / "coordinator.json").read_text())
        keys = (coordinator.get("endpoint", ""), coordinator.get("coordinator_id", ""))
    numel = num_params(build_model(cfg.model, cfg.seed))
    return {**analyze(summaries, codec=cfg.compression.codec, numel=numel, coordinator_keys=keys),
            "inner_steps": cfg.inner.steps}


def attach(endpoint: str, *, duration_s: float, interval_s: float) -> dict:
    """Poll a running coordinator; keep each peer's reported bytes for every round it completes."""
    from peer.cli.status import fetch_status

    seen: dict[tuple[str, int], dict] = {}
    status: dict = {}
    deadline = time.monotonic() + duration_s
    while True:
        status = fetch_status(endpoint)
        for p in status["peers"]:
            last = p.get("last_round_bytes") or {}
            if "round" in last:
                seen[(p["peer_id"][:8], last["round"])] = {"peer": p["peer_id"][:8], "round": last["round"],
                                                           "bytes_sent": last.get("sent", 0), "bytes_received": last.get("received", 0),
                                                           "utilization": p.get("utilization")}
        if status.get("finished") or time.monotonic() >= deadline:
            break
        time.sleep(interval_s)
    rows = sorted(seen.values(), key=lambda r: (r["round"], r["peer"]))
    return {"coordinator": endpoint, "codec": status.get("codec"), "round": status.get("round"), "rows": rows,
            "peers_total": [{k: p.get(k) for k in ("peer_id", "bytes_sent", "bytes_received", "utilization", "state")}
                            for p in status.get("peers", [])],
            "coordinator_traffic": status.get("coordinator_traffic")}


def format_attach(result: dict) -> str:
    lines = [f"coordinator {result['coordinator']} | codec {result['codec']} | round {result['round']}",
             f"{'peer':8} {'round':>5} {'sent':>12} {'recv':>12} {'util':>5}"]
    for r in result["rows"]:
        util = f"{100 * r['utilization']:.0f}%" if r["utilization"] is not None else "-"
        lines.append(f"{r['peer']:8} {r['round'] + 1:>5} {r['bytes_sent']:>12,} {r['bytes_received']:>12,} {util:>5}")
    return "\n".join(lines)


def write_markdown(path: Path, run: dict) -> None:
    """benchmarks/bandwidth.md from what the run's JSON holds: its runs, machine facts, load and command."""
    from machine_info import machine_lines, write_keeping_notes

    results = run["runs"]

    lines = ["# Bandwidth per peer per round (measured)", "",
             "Written by `scripts/measure_bandwidth.py`: a coordinator and peers as processes on loopback; bytes are",
             "the ByteCounter interceptors' counts (serialized protobuf sizes of every RPC, HTTP/2 framing excluded);",
             "times are each peer's per-round record. goodput = update payload bytes fetched / fetch time.", "",
             *machine_lines(run.get("machine"), run.get("load_before"), run.get("load_after")),
             f"- command: `{run.get('command', 'not recorded')}`", "",
             "| codec | params | payload measured (B) | codec size (B) | fp32 (B) | sent/peer/round (B) | recv/peer/round (B) "
             "| goodput (MB/s) | compute (s) | encode (s) | wait (s) | fetch (s) | aggregate (s) | round (s) | utilization |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        m = r["median"]
        lines.append(
            f"| {r['codec']} | {r['numel']:,} | {', '.join(f'{p:,}' for p in r['payload_bytes_measured'])} | {r['codec_bytes']:,} | "
            f"{r['fp32_bytes']:,} | {m['bytes_sent']:,.0f} | {m['bytes_received']:,.0f} | {(m['goodput_MBps'] or 0):.1f} | "
            f"{m['compute_s']:.2f} | {m['encode_s']:.3f} | {m['wait_s']:.2f} | {m['fetch_s']:.3f} | {m['aggregate_s']:.3f} | "
            f"{m['round_s']:.2f} | {100 * r['utilization']:.1f}% |")
    lines += ["", "Medians over every (peer, round) of each run. Per-peer per-round detail:", ""]
    for r in results:
        lines += [f"### {r['codec']} ({r['peers']} peers, {r['rounds']} rounds x {r['inner_steps']} inner steps, wall {r.get('wall_s', 0):.0f} s)",
                  "", "```", format_table(r), "```", ""]
    write_keeping_notes(path, "\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--inner-steps", type=int, default=10)
    parser.add_argument("--codec", nargs="+", default=["fp16"], help="one local run per codec (fp32 fp16 int8 topk:0.01+int8 ...)")
    parser.add_argument("--workdir", help="keep the runs' logs and summaries here (default: a temporary folder)")
    parser.add_argument("--from-workdir", help="analyze a finished run's folder (run.json + peer*.json) instead of starting one")
    parser.add_argument("--coordinator", metavar="HOST:PORT", help="attach to a running swarm through `swarmloco status`")
    parser.add_argument("--duration", type=float, default=60.0, help="attach mode: seconds to watch")
    parser.add_argument("--interval", type=float, default=2.0, help="attach mode: seconds between status polls")
    parser.add_argument("--json", metavar="PATH", help="write the results here")
    parser.add_argument("--write-md", nargs="?", const=str(ROOT / "benchmarks/bandwidth.md"), metavar="PATH")
    parser.add_argument("--report-only", metavar="JSON", help="rewrite --write-md from an earlier --json; run nothing")
    args = parser.parse_args(argv)
    if args.report_only:
        write_markdown(Path(args.write_md or ROOT / "benchmarks/bandwidth.md"), json.loads(Path(args.report_only).read_text()))
        return 0
    from machine_info import command_line, load_average, machine_facts

    load_before = load_average()
    if args.coordinator:
        result = attach(args.coordinator, duration_s=args.duration, interval_s=args.interval)
        print(format_attach(result))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2))
        return 0
    if args.from_workdir:
        results = [read_workdir(Path(args.from_workdir))]
    else:
        base = Path(args.workdir or tempfile.mkdtemp(prefix="swarmloco-bandwidth-"))
        results = []
        for codec in args.codec:
            print(f"running {args.peers} peers x {args.rounds} rounds x {args.inner_steps} inner steps, codec {codec} (logs in {base})", flush=True)
            results.append(run_local_swarm(peers=args.peers, rounds=args.rounds, inner_steps=args.inner_steps, codec=codec,
                                           workdir=base / codec.replace(":", "_").replace("+", "_")))
    for result in results:
        print(format_table(result) + "\n")
    run = {"runs": results, "load_before": load_before, "load_after": load_average(), "command": command_line(),
           "machine": machine_facts()}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(run, indent=2))
    if args.write_md:  # from the record the JSON holds: the md is what --report-only writes from it
        write_markdown(Path(args.write_md), run)
        print(f"wrote {args.write_md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
