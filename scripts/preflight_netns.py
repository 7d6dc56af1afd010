"""`swarmloco preflight` through tbf-shaped network namespaces (scripts/wan_emulation.py's testbed).

    sudo .venv/bin/python scripts/preflight_netns.py --rates 100 10 --json benchmarks/preflight.json --write-md

For each rate: a coordinator in one namespace, the preflight in another, both links shaped by
tbf at that rate (up and down, per node); raw TCP throughput is measured first for reference.
Checks the issue's targets: the preflight's throughput within 20% of the shaped rate each way,
and a recommendation that differs between the rates. Writes the JSON and a markdown report
generated from it (--report-only JSON rewrites the markdown without running anything).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for extra in (str(ROOT), str(ROOT / "scripts")):
    if extra not in sys.path:
        sys.path.insert(0, extra)

TOLERANCE = 0.20


def run_rate(rate: float, rtt_ms: float, workdir: Path, seconds: float) -> dict:
    from measure_bandwidth import write_run_config
    from netns_testbed import Testbed, measure_link_mbit
    from wan_emulation import COORD_DHT, COORD_GRPC, PEER_GRPC, shaping_text, wait_for_maddr

    bed = Testbed(2, rate_mbit=rate, rtt_ms=rtt_ms)
    try:
        bed.up()
        tcp = measure_link_mbit(bed, 1, 0)
        write_run_config(workdir, peers=1, rounds=1000, inner_steps=25, codec="fp16")  # the demo model, H = 25
        python = sys.executable
        coordinator = bed.spawn(0, [python, "-m", "peer.cli.main", "coordinator", "--config", str(workdir / "run.json"),
                                    "--host", "0.0.0.0", "--port", str(COORD_GRPC), "--announce-host", bed.ip_of(0),
                                    "--host-maddrs", f"/ip4/0.0.0.0/tcp/{COORD_DHT}", "--identity-path", str(workdir / "coordinator.pem")],
                                workdir / "coordinator.log")
        wait_for_maddr(workdir / "coordinator.log", coordinator, bed.ip_of(0), 120)
        out = workdir / "preflight.json"
        preflight = bed.spawn(1, [python, "-m", "peer.cli.main", "preflight", "--coordinator", f"{bed.ip_of(0)}:{COORD_GRPC}",
                                  "--port", str(PEER_GRPC), "--threads", "1", "--seconds", str(seconds), "--json", str(out)],
                              workdir / "preflight.log")
        if preflight.wait(timeout=300) != 0:
            raise RuntimeError(f"preflight failed:\n{(workdir / 'preflight.log').read_text()[-3000:]}")
        result = json.loads(out.read_text())
        return {"rate_mbit": rate, "rtt_ms": rtt_ms, "shaping": shaping_text(rate, rtt_ms, bed.delay_mode), "tcp_mbit": tcp,
                "download_mbit": 8 * result["download"]["bytes_per_s"] / 1e6, "upload_mbit": 8 * result["upload"]["bytes_per_s"] / 1e6,
                "report": (workdir / "preflight.log").read_text(), "preflight": result}
    finally:
        bed.close()


def write_markdown(path: Path, run: dict, source: str) -> None:
    from machine_info import write_keeping_notes

    rows = run["rows"]
    lines = ["# Preflight through shaped links", "",
             "Written by `scripts/preflight_netns.py` from `" + source + "`: `swarmloco preflight` in one network namespace,",
             "the run's coordinator in another, both links shaped by tbf (scripts/wan_emulation.py's testbed); demo model,",
             "run codec fp16, H = 25, sliced exchange. Raw TCP throughput (16 MiB, peer -> coordinator) is measured first for reference.",
             f"- command: `{run['command']}`; commit {run['commit']}; load average before {run['load_before']}, after {run['load_after']}", "",
             "| shaping | raw TCP (Mbit/s) | preflight download (Mbit/s) | upload (Mbit/s) | off the shaped rate | RTT (ms) | inner step (ms) "
             "| dial-back | recommendation |",
             "|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        p, choice = r["preflight"], r["preflight"]["recommendation"]["choice"]
        off = max(abs(r["download_mbit"] / r["rate_mbit"] - 1), abs(r["upload_mbit"] / r["rate_mbit"] - 1))
        client = "--client-mode" if p["recommendation"]["client_mode"]["recommended"] else "no --client-mode"
        lines.append(f"| {r['shaping']} | {r['tcp_mbit']:.1f} | {r['download_mbit']:.1f} | {r['upload_mbit']:.1f} | {100 * off:.1f}% | "
                     f"{1000 * p['rtt_s']:.2f} | {1000 * p['step_s']:.1f} | {'reachable' if p['dial_back']['reachable'] else 'NOT reachable'} "
                     f"| {client}; codec {choice['codec']}, H = {choice['inner_steps']} |")
    within = all(max(abs(r["download_mbit"] / r["rate_mbit"] - 1), abs(r["upload_mbit"] / r["rate_mbit"] - 1)) <= TOLERANCE for r in rows)
    choices = {json.dumps(r["preflight"]["recommendation"]["choice"], sort_keys=True) for r in rows}
    lines += ["", "Targets:",
              f"- throughput within {100 * TOLERANCE:.0f}% of the shaped rate, both directions, every rate: **{'reached' if within else 'NOT reached'}**",
              f"- the recommendation differs between the rates: **{'reached' if len(choices) == len(rows) else 'NOT reached'}**", ""]
    for r in rows:
        lines += [f"## {r['shaping']}", "", "```", r["report"].strip(), "```", ""]
    write_keeping_notes(path, "\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[100.0, 10.0], help="shaped rates in Mbit/s")
    parser.add_argument("--rtt-ms", type=float, default=0.0, help="added RTT (netem or the delay proxy; 0 = none)")
    parser.add_argument("--seconds", type=float, default=3.0, help="preflight --seconds: length of each throughput transfer")
    parser.add_argument("--json", default=str(ROOT / "benchmarks/preflight.json"))
    parser.add_argument("--write-md", nargs="?", const=str(ROOT / "benchmarks/preflight.md"), metavar="PATH")
    parser.add_argument("--report-only", metavar="JSON", help="rewrite --write-md from an earlier --json; run nothing")
    args = parser.parse_args(argv)
    if args.report_only:
        write_markdown(Path(args.write_md or ROOT / "benchmarks/preflight.md"), json.loads(Path(args.report_only).read_text()), args.report_only)
        return 0
    from machine_info import command_line, load_average
    from netns_testbed import namespaces_permitted

    reason = namespaces_permitted()
    if reason:
        print(f"preflight_netns: cannot shape links on this machine: {reason}. Nothing was run.")
        return 0
    load_before = load_average()
    base = Path(tempfile.mkdtemp(prefix="swarmloco-preflight-"))
    rows = []
    for rate in args.rates:
        print(f"rate {rate:g} Mbit/s ...", flush=True)
        rows.append(run_rate(rate, args.rtt_ms, base / f"rate{rate:g}", args.seconds))
        print(rows[-1]["report"], flush=True)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    run = {"rows": rows, "command": command_line(), "commit": head or "unknown", "load_before": load_before, "load_after": load_average(),
           "cores": os.cpu_count(), "finished_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(run, indent=2))
    if args.write_md:
        write_markdown(Path(args.write_md), run, os.path.relpath(args.json, ROOT))
        print(f"wrote {args.write_md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
