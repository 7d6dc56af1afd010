"""A swarm over an emulated WAN: coordinator and peers in their own Linux network namespaces.

    sudo .venv/bin/python scripts/wan_emulation.py --rate-mbit 100 --rtt-ms 50 --codec fp32 fp16 --write-md
    .venv/bin/python scripts/wan_emulation.py --check          # can this machine do it? (exits 0 either way)

Topology (scripts/netns_testbed.py; all inside namespaces this script creates and always deletes,
also on failure or ^C; the host's own network namespace is never touched):

    swl<pid>-hub: bridge br0 -- veth h<i>  <->  eth0 in swl<pid>-n<i>: 10.77.0.<i+1>/24
    n0 = coordinator, n1..nN = peers

Bandwidth: a `tbf` qdisc on every node's eth0 (its uplink) and on its hub-side veth (its
downlink), rate --rate-mbit, burst 32 KiB (> the MTU), so each node has a symmetric link of that rate.
Latency: `tc netem` where the kernel has it; otherwise (these machines: "Specified qdisc kind is
unknown") a user-space delaying proxy (scripts/delay_proxy.c, or .py: --delay-proxy) in front of every node's gRPC port
adds rtt/2 in each direction, so every gRPC connection (updates, manifests, checkpoints) sees the
RTT. The hivemind DHT's libp2p traffic then is NOT delayed (discovery only); the output says which.

Compute utilization = the share of each peer's round wall time spent in inner steps
(sum compute_s / sum round_s over peers and rounds, from the peers' own records).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os  # noqa: F401 (tests stub os.geteuid through this module)
import re
import signal
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

import delay_proxy  # noqa: E402
from peer.node.thread_priority import MODES as PRIORITY_MODES, resolve as resolve_priority  # noqa: E402
from netns_testbed import BURST, CPU_GROUPS, Testbed, measure_link_mbit, namespaces_permitted, netem_available, run_ip  # noqa: E402

# The shaping text's words for each way the peers share the cores (JSONs before session 24 have no
# cpu_groups: they ran per-node).
CPU_GROUPS_TEXT = {"shared": "peers in one CPU scheduling group", "per-node": "a CPU scheduling group per peer"}

COORD_GRPC, COORD_DHT, PEER_GRPC = 31338, 31337, 31400
# docs/sliced-exchange.md "Round trips": the sequential round trips of one sliced round (commit with
# the manifest's long-poll beside it, reduce-scatter, submit with the final results' long-poll beside
# it, all-gather with its spot checks, gathered with the applied long-poll beside it, whose answer
# carries the signed state of θ_{r+1}). 8 before (plus an uncounted GetRunInfo after every round).
# Stored in each run's JSON, so that the md stays a function of the JSON when the count changes.
SLICED_ROUND_TRIPS = 5


# --- one swarm run on the testbed ------------------------------------------------------------


def run_swarm(bed: Testbed, *, peers: int, rounds: int, inner_steps: int, codec: str, workdir: Path, timeout_s: float,
              overlap: bool = False, exchange: str | None = None, window_s: float = 0.0, train_priority: str = "auto",
              delay_proxy_kind: str = "c", overlap_window: bool = True) -> dict:
    from measure_bandwidth import read_workdir, write_run_config

    write_run_config(workdir, peers=peers, rounds=rounds, inner_steps=inner_steps, codec=codec, overlap=overlap,
                     exchange=exchange, window_s=window_s, overlap_window=overlap_window)
    python = sys.executable
    proxy = bed.delay_mode == "proxy"

    def grpc_args(i: int, port: int) -> list[str]:
        if proxy:  # serve on loopback; others dial the delaying proxy on the alias address
            argv = delay_proxy.command(f"{bed.proxy_ip_of(i)}:{port}", f"127.0.0.1:{port}", bed.rtt_ms / 2,
                                          native=delay_proxy_kind == "c")
            bed.spawn(i, argv, workdir / f"proxy{i}.log")
            return ["--host", "127.0.0.1", "--port", str(port), "--announce-host", bed.proxy_ip_of(i)]
        return ["--host", "0.0.0.0", "--port", str(port), "--announce-host", bed.ip_of(i)]

    started = time.monotonic()
    coordinator = bed.spawn(0, [python, "-m", "peer.cli.main", "coordinator", "--config", str(workdir / "run.json"), *grpc_args(0, COORD_GRPC),
                                "--host-maddrs", f"/ip4/0.0.0.0/tcp/{COORD_DHT}", "--announce-maddrs", f"/ip4/{bed.ip_of(0)}/tcp/{COORD_DHT}",
                                "--identity-path", str(workdir / "coordinator.pem"), "--summary-json", str(workdir / "coordinator.json")],
                            workdir / "coordinator.log")
    maddr = wait_for_maddr(workdir / "coordinator.log", coordinator, bed.ip_of(0), 120)
    children = [bed.spawn(i, [python, "-m", "peer.cli.main", "peer", "--initial-peers", maddr, *grpc_args(i, PEER_GRPC),
                              "--host-maddrs", "/ip4/0.0.0.0/tcp/0", "--identity-path", str(workdir / f"peer{i}.pem"),
                              "--summary-json", str(workdir / f"peer{i}.json"), "--threads", "1", "--shard", f"{i - 1}/{peers}",
                              "--log-every", "1000", "--train-priority", train_priority], workdir / f"peer{i}.log")
                for i in range(1, peers + 1)]
    try:
        coordinator.wait(timeout=max(1.0, timeout_s - (time.monotonic() - started)))
        for child in children:
            child.wait(timeout=60)
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"the swarm did not finish within {timeout_s:.0f}s; logs in {workdir}") from None
    return {**read_workdir(workdir), "wall_s": time.monotonic() - started, "workdir": str(workdir)}


def wait_for_maddr(log: Path, process: subprocess.Popen, ip: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = log.read_text() if log.exists() else ""
        for maddr in re.findall(r"--initial-peers (\S+)", text):
            if f"/ip4/{ip}/" in maddr:
                return maddr
        if process.poll() is not None:
            raise RuntimeError(f"coordinator exited early:\n{text[-3000:]}")
        time.sleep(0.2)
    raise TimeoutError(f"coordinator printed no /ip4/{ip}/ multiaddr within {timeout_s:.0f}s")


def shaping_text(bed_rate: float, rtt_ms: float, delay_mode: str, proxy_kind: str = "python") -> str:
    rate = f"tbf {bed_rate:g} Mbit/s up + down per node (burst {BURST})" if bed_rate > 0 else "no rate limit"
    which = "" if proxy_kind == "python" else f" ({proxy_kind})"  # rows before the C proxy say nothing: Python
    delay = {"netem": f"netem +{rtt_ms:g} ms RTT", "proxy": f"+{rtt_ms:g} ms RTT on gRPC via user-space delay proxy{which} (DHT not delayed)",
             "none": "no added latency"}[delay_mode]
    return f"{rate}; {delay}"


def utilization_spread(result: dict) -> str:
    """min-max of per-peer per-round utilization over all but the last round, and the last round's
    (an overlapped run cannot overlap its last round: nothing is left to train beside it)."""
    last = max(row["round"] for row in result["rows"])
    body = [row["utilization"] for row in result["rows"] if row["round"] != last]
    tail = [row["utilization"] for row in result["rows"] if row["round"] == last]

    def span(values: list[float]) -> str:
        return f"{100 * min(values):.0f}–{100 * max(values):.0f}%" if values else "-"

    return f"{span(body)} (last: {span(tail)})"


def landing_shares(result: dict, *, of_phase: bool = False) -> list[float]:
    """landed_after_steps of every overlapped round that landed, as a share of H (inner.steps), or
    with `of_phase` of the steps the phase it landed in ran (the same peer's next round record:
    a compute window's phases vary; with a fixed H both are the same)."""
    steps = {(row["peer"], row["round"]): row.get("phase_steps") for row in result["rows"]}
    shares = []
    for row in result["rows"]:
        if row.get("landed_after_steps") is None:
            continue
        phase = steps.get((row["peer"], row["round"] + 1)) if of_phase else result["inner_steps"]
        if phase:
            shares.append(row["landed_after_steps"] / phase)
    return shares


def landing_spread(result: dict) -> str:
    """Where the average of an overlapped round landed, as a share of the next phase's H inner steps:
    median (min–max) over peers and rounds of landed_after_steps / H; "-" where no row has it
    (synchronous runs, and results stored before the peers recorded it). In a compute-window run,
    run, or wherever the phases' steps varied (overlapped phases sized by the coordinator's window,
    rounds.overlap_window), as a share of the steps that phase ran, with the share of H beside it."""

    def spread(shares: list[float]) -> str:
        return f"{statistics.median(shares):.2f} ({min(shares):.2f}–{max(shares):.2f})" if shares else "-"

    shares = landing_shares(result)
    if not shares:
        return "-"
    varied = any(row.get("phase_steps") not in (None, result["inner_steps"]) for row in result["rows"])
    if not result.get("window_s") and not varied:
        return spread(shares)
    return f"{spread(landing_shares(result, of_phase=True))} of the phase's steps; of H = {result['inner_steps']}: {spread(shares)}"


def link_bound_s(result: dict) -> float | None:
    """What the link allows one sliced round: the bytes a peer moves per round (the larger of the
    median sent and received: each direction has its own tbf) at the link rate, plus the
    documented sequential round trips x RTT. None where the JSON has no documented count."""
    trips, rate = result.get("round_trips"), result.get("rate_mbit")
    if trips is None or not rate:
        return None
    m = result["median"]
    return max(m["bytes_sent"], m["bytes_received"]) * 8 / (rate * 1e6) + trips * result.get("rtt_ms", 0.0) / 1000


def after_last_commit(result: dict) -> dict[str, float]:
    """Each exchange step's end (the peers' timelines, peer/exchange/sliced_peer.py) as seconds
    after the round's last commit (any peer's), median over peers and rounds, in the order the
    steps run; {} for JSONs without timelines."""
    by_round: dict[int, list[dict]] = {}
    for row in result["rows"]:
        if row.get("timeline"):
            by_round.setdefault(row["round"], []).append(row["timeline"])
    offsets: dict[str, list[float]] = {}
    for marks in by_round.values():
        last = max(m["committed"] for m in marks)
        for m in marks:
            for step, at in m.items():
                if step != "committed":
                    offsets.setdefault(step, []).append(at - last)
    return {step: statistics.median(values) for step, values in sorted(offsets.items(), key=lambda kv: statistics.median(kv[1]))}


def exchange_span_s(result: dict) -> float | None:
    """The exchange as the link sees it: the round's last commit to a peer's applied θ_{r+1},
    median over peers and rounds. It leaves out the wait for the slowest peer's commit (compute,
    not network); None for JSONs without timelines."""
    return after_last_commit(result).get("applied")


def timeline_text(result: dict) -> str:
    return ", ".join(f"{step} {at:.3f}" for step, at in after_last_commit(result).items())


def reduce_times_text(result: dict) -> str:
    """The owners' slice reduces per peer-round (peer/run/thread_clock.py), median over the
    peer-rounds that reduced: wall time, the thread's CPU and its wait for a core (ms per slice);
    "" for JSONs without them."""
    times = [t for row in result["rows"] if (t := row.get("reduce_times")) and t.get("calls")]
    if not times:
        return ""

    def per_slice(key: str) -> str:
        values = [t[key] / t["calls"] for t in times if t.get(key) is not None]
        return f"{1000 * statistics.median(values):.1f}" if values else "not recorded (no per-thread schedstat)"

    return (f"wall {per_slice('wall_s')} ms, CPU {per_slice('cpu_s')} ms, waiting for a core {per_slice('core_wait_s')} ms "
            f"(median per slice over {len(times)} peer-rounds)")


def bound_cells(result: dict) -> list[str]:
    """The md's bound columns: the bound, fetch / bound and span / bound (target: fetch <= 1.5x)."""
    bound, span = link_bound_s(result), exchange_span_s(result)
    if bound is None:
        return ["-", "-", "-" if span is None else f"{span:.2f}", "-"]
    fetch = result["median"]["fetch_s"]
    verdict = "reached" if fetch <= 1.5 * bound else "**NOT reached**"
    return [f"{bound:.2f} ({result['round_trips']} RT)", f"{fetch / bound:.2f}x: {verdict}",
            "-" if span is None else f"{span:.2f}", "-" if span is None else f"{span / bound:.2f}x"]


def write_markdown(path: Path, sources: list[dict]) -> None:
    """`sources`: one dict per JSON ({"json": its path as shown, "runs", "command", "load_before",
    "load_after", optional "versions"}); every table row names the JSON it comes from, and the
    machine is what the JSONs recorded (a run's own md too), never the machine writing the md."""
    from machine_info import write_keeping_notes

    lines = ["# Compute utilization under an emulated WAN", "",
             "Written by `scripts/wan_emulation.py`: coordinator and peers each in their own network namespace,",
             "joined by veth pairs on a bridge; shaping as stated on every row. utilization = sum of inner-step time /",
             "sum of round wall time over all peers and rounds (the peers' own records); bytes are the transport's counts.",
             "lands after (overlapped rounds): where a round's average landed in the next inner phase, as landed_after_steps / H",
             "from the peers' round records, median (min–max) over peers and rounds (the last round has no next phase);",
             "`-` for synchronous runs and for JSONs written before the peers recorded it. Where the phases' steps vary (a",
             "compute window: `--window-s`, or overlapped phases on the coordinator's window, the default since session 18),",
             "first as a share of the steps of the phase it landed in, then of H.",
             "bound (sliced runs whose JSON names the documented round trips): a peer's bytes per round (the larger of median",
             "sent and received) at the link rate + the round trips docs/sliced-exchange.md counts x RTT; the issue-24 target is",
             "fetch <= 1.5x bound. span: the round's last commit (any peer) to a peer's applied mark, from the peers' timelines,",
             "median over peers and rounds: the whole exchange as the link sees it (it covers every counted round trip, fetch only",
             "reduce-scatter to gathered), without the wait for the slowest peer's commit.",
             "Every row names the JSON it is generated from; each JSON's command and the load around it:", ""]
    recorded = {json.dumps(s["versions"], sort_keys=True) for s in sources if s.get("versions")}
    lines.append("- machine and library versions: " + (", ".join(sorted(recorded)) if recorded else
                 "not recorded in these JSONs (report regenerated with --report-only)"))
    for s in sources:
        lines.append(f"- `{s['json']}`: `{s.get('command', '?')}` (load average 1/5/15 min before: "
                     f"{s.get('load_before', '?')}; after: {s.get('load_after') or 'not recorded'})")
    lines += ["",
              "| JSON | codec | shaping | peers | rounds x H | payload (B) | recv/peer/round (B) | compute (s) | wait (s) "
              "| fetch (s) | aggregate (s) | round (s) | goodput (MB/s) | utilization | per peer-round utilization "
              "| lands after (steps of H) | bound (s) | fetch / bound | span (s) | span / bound |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|---:|---:|"]
    results = [(s["json"], r) for s in sources for r in s["runs"]]
    for source, r in results:
        m = r["median"]
        lines.append(f"| {Path(source).name} | {r['codec']} | {r['shaping']} | {r['peers']} | {r['rounds']} x {r['inner_steps']} | "
                     f"{', '.join(f'{p:,}' for p in r['payload_bytes_measured'])} | {m['bytes_received']:,.0f} | {m['compute_s']:.2f} | "
                     f"{m['wait_s']:.2f} | {m['fetch_s']:.2f} | {m['aggregate_s']:.3f} | {m['round_s']:.2f} | "
                     f"{(m['goodput_MBps'] or 0):.2f} | **{100 * r['utilization']:.1f}%** | {utilization_spread(r)} | "
                     f"{landing_spread(r)} | {' | '.join(bound_cells(r))} |")
    lines += ["", "Per-peer per-round detail (`scripts/measure_bandwidth.py` format):", ""]
    from measure_bandwidth import format_table

    for source, r in results:
        lines += [f"### {r['codec']}: {r['shaping']} ({Path(source).name})", "", "```", format_table(r), "```", ""]
        if after_last_commit(r):
            lines += ["Each step's end after the round's last commit (s, median over peers and rounds): " + timeline_text(r), ""]
        if reduced := reduce_times_text(r):
            lines += ["An owner's slice reduce: " + reduced, ""]
    write_keeping_notes(path, "\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--inner-steps", type=int, default=25)
    parser.add_argument("--codec", nargs="+", default=["fp32", "fp16"])
    parser.add_argument("--rate-mbit", type=float, default=100.0, help="per-node up and down rate (0 = unlimited)")
    parser.add_argument("--rtt-ms", type=float, default=50.0, help="added round-trip time (0 = none)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per swarm run before it is killed")
    parser.add_argument("--workdir", help="keep logs and summaries here (default: a temporary folder)")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--write-md", nargs="?", const=str(ROOT / "benchmarks/wan.md"), metavar="PATH")
    parser.add_argument("--report-only", nargs="+", metavar="JSON", help="write --write-md from earlier --json files; run nothing")
    parser.add_argument("--overlap", action="store_true", help="overlapped rounds (rounds.overlap_communication)")
    parser.add_argument("--exchange", choices=("sliced", "all-to-all"), help="exchange.mode (default: the run config's, sliced)")
    parser.add_argument("--train-priority", choices=PRIORITY_MODES, default="auto",
                        help="the peers' --train-priority (overlapped rounds: the training thread's CPU priority; auto: idle on Linux)")
    parser.add_argument("--cpu-groups", choices=CPU_GROUPS, default="shared",
                        help="how the peers share this machine's cores (scripts/netns_testbed.py): shared (the default since "
                             "session 24): one scheduling group, threads compete by priority; per-node: a group (session) "
                             "per peer, an equal share of the cores each, as every run before session 24")
    parser.add_argument("--window-s", type=float, default=0.0,
                        help="rounds.window_s: a compute window instead of --inner-steps per phase (overlapped: the swarm's)")
    parser.add_argument("--fixed-h", action="store_true",
                        help="overlapped phases of exactly --inner-steps (rounds.overlap_window = false; before session 18 "
                             "the only overlapped schedule), not the window the coordinator signs into each manifest")
    parser.add_argument("--delay-proxy", choices=("c", "python"), default="c",
                        help="where netem is missing: the C delay proxy (scripts/delay_proxy.c, built on first use; the "
                             "Python one where no C compiler is found) or the Python one (rows before session 18)")
    parser.add_argument("--check", action="store_true", help="only say whether namespaces + tbf (+ netem) work here")
    args = parser.parse_args(argv)
    if args.report_only:
        if not args.write_md:  # it would rewrite benchmarks/wan.md from these JSONs alone, dropping every other row
            parser.error("--report-only rewrites an md from exactly the JSONs given: say which with --write-md PATH "
                         "(benchmarks/wan.md lists every JSON it is made of; pass them all to rewrite it)")
        sources = [{"json": p, **json.loads(Path(p).read_text())} for p in args.report_only]
        write_markdown(Path(args.write_md), sources)
        return 0
    reason = namespaces_permitted()
    if reason:
        print(f"wan_emulation: cannot emulate a WAN on this machine: {reason}. Nothing was run.")
        return 0
    if args.check:
        bed = Testbed(1, rate_mbit=0, rtt_ms=0)
        try:
            run_ip("netns", "add", bed.names[0])
            bed.created.append(bed.names[0])
            netem = netem_available(bed.names[0])
        finally:
            bed.close()
        print(f"wan_emulation: network namespaces and tbf work; netem {'works' if netem else 'is missing (latency via delay proxy)'}")
        return 0
    from machine_info import load_average

    load_before = load_average()
    base = Path(args.workdir or tempfile.mkdtemp(prefix="swarmloco-wan-"))
    results = []
    for codec in args.codec:
        bed = Testbed(args.peers + 1, rate_mbit=args.rate_mbit, rtt_ms=args.rtt_ms, cpu_groups=args.cpu_groups)
        atexit.register(bed.close)
        previous = {s: signal.signal(s, _raise_interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
        try:
            bed.up()
            link = measure_link_mbit(bed, 1, 0)
            proxy_kind = "none"
            if bed.delay_mode == "proxy":
                proxy_kind = "c" if args.delay_proxy == "c" and delay_proxy.native_binary() is not None else "python"
            shaping = shaping_text(args.rate_mbit, args.rtt_ms, bed.delay_mode, proxy_kind) + f" (measured TCP {link:.0f} Mbit/s)"
            if args.overlap:
                shaping += "; overlapped rounds"
                if not args.window_s:
                    shaping += "; phases of exactly H steps" if args.fixed_h else "; phases on the coordinator's window"
            if args.exchange:
                shaping += f"; {args.exchange} exchange"
            priority = resolve_priority(args.train_priority)  # what the peers apply (the peers run here)
            if args.overlap and (priority != "normal" or args.train_priority != "auto"):
                shaping += f"; training thread priority {priority}" + (" (the default)" if args.train_priority == "auto" else "")
            shaping += "; " + CPU_GROUPS_TEXT[args.cpu_groups]
            if args.window_s:
                shaping += f"; compute window {args.window_s:g} s" + (" (swarm-aligned)" if args.overlap else "")
            print(f"codec {codec}: {args.peers} peers + coordinator in namespaces; {shaping}", flush=True)
            result = run_swarm(bed, peers=args.peers, rounds=args.rounds, inner_steps=args.inner_steps, codec=codec,
                               workdir=base / codec.replace(":", "_").replace("+", "_"), timeout_s=args.timeout,
                               overlap=args.overlap, exchange=args.exchange, window_s=args.window_s,
                               train_priority=args.train_priority, delay_proxy_kind=proxy_kind, overlap_window=not args.fixed_h)
            exchange = args.exchange or "sliced"
            results.append({**result, "shaping": shaping, "measured_link_mbit": link, "delay_mode": bed.delay_mode,
                            "delay_proxy": proxy_kind, "overlap_window": args.overlap and not args.window_s and not args.fixed_h,
                            "rate_mbit": args.rate_mbit,
                            "rtt_ms": args.rtt_ms, "exchange": exchange, "window_s": args.window_s,
                            "train_priority": priority, "cpu_groups": args.cpu_groups,
                            "round_trips": SLICED_ROUND_TRIPS if exchange == "sliced" else None})
            from measure_bandwidth import format_table

            print(format_table(result) + "\n", flush=True)
            print("bound | fetch / bound | span | span / bound: " + " | ".join(bound_cells(results[-1])), flush=True)
            print("after the last commit (s): " + timeline_text(results[-1]), flush=True)
            if reduced := reduce_times_text(results[-1]):
                print("an owner's slice reduce: " + reduced, flush=True)
        finally:
            bed.close()
            for s, handler in previous.items():
                signal.signal(s, handler)
    from machine_info import command_line, machine_facts

    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    facts = machine_facts()
    run = {"runs": results, "load_before": load_before, "load_after": load_average(), "command": command_line(),
           "versions": {**facts["versions"], "cpu": facts["cpu"], "cores": str(facts["cores"]), "os": facts["os"],
                        "commit": head.stdout.strip() or "unknown"}}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(run, indent=2))
    if args.write_md:
        write_markdown(Path(args.write_md), [{"json": args.json or "(no --json given)", **run}])
        print(f"wrote {args.write_md}")
    return 0


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    sys.exit(main())
