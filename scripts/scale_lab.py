"""The scale lab (issue 24): dozens of real peers on one machine, several peer nodes per process.

    .venv/bin/python scripts/scale_lab.py --peers 4 16 32 48 --nodes-per-process 8 --write-md
    .venv/bin/python scripts/scale_lab.py --peers 64 --merge --write-md      # add a row, keep the rest

A swarm of n is a coordinator (`swarmloco coordinator`, its own process, with its DHT node as
always) and ceil(n / --nodes-per-process) lab processes. Each lab process runs its nodes, one
thread each, through the peer's own entry point (`peer.cli.main.main(["peer", ...])`: the same
options, join, rounds and --summary-json as `swarmloco peer`), so each node has its own identity,
gRPC server, channels and transport ledger, and only the Python runtime and torch are shared.
The nodes dial the coordinator directly (`--coordinator HOST:PORT --coordinator-key FINGERPRINT`,
the key pinned from what the coordinator printed): the DHT is not what the lab measures (a DHT node
per peer is what made 48 one-process peers not fit in 23 GiB; the join storm through the DHT is
measured by scripts/measure_scale.py --storm). Everything else is scripts/measure_scale.py's: the
run config, the launcher and its cleanup (peer.cli.launcher.Swarm), the memory floor, the ledger
rows, the coordinator's CPU per round (from /proc, scripts/swarm_meters.py), and the report
(scripts/scale_report.py: the "scale lab" table of benchmarks/scale.md, rows under "lab_runs").

The same file is the lab process: `python -m scripts.scale_lab peer ... --node NAME SHARD ...`
(the launcher's `peer` arguments, then one --node per node it runs).
"""

from __future__ import annotations

import argparse
import io
import math
import os
import sys
import threading
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for extra in (str(ROOT), str(ROOT / "scripts")):
    if extra not in sys.path:
        sys.path.insert(0, extra)

FINGERPRINT_PREFIX = "coordinator fingerprint: "  # peer/coordinator/main.py prints it once it serves


class LineAtomic(io.TextIOBase):
    """A text stream shared by the nodes' threads that writes whole lines only: one node's line is
    never cut by another's (launchers count joins by line)."""

    def __init__(self, stream) -> None:
        super().__init__()
        self.stream, self.lock, self.local = stream, threading.Lock(), threading.local()

    def write(self, text: str) -> int:
        *lines, rest = (getattr(self.local, "pending", "") + text).split("\n")
        self.local.pending = rest
        if lines:
            with self.lock:
                self.stream.write("".join(line + "\n" for line in lines))
                self.stream.flush()
        return len(text)

    def flush(self) -> None:  # a partial line waits for its end
        pass

    def fileno(self) -> int:
        return self.stream.fileno()

    def writable(self) -> bool:
        return True


def lab_process(argv: list[str]) -> int:
    """Run each --node as a `swarmloco peer` of the given arguments, one thread each; the exit
    status is the worst node's."""
    front = argparse.ArgumentParser(prog="python -m scripts.scale_lab peer ...", allow_abbrev=False)
    front.add_argument("--node", nargs=2, action="append", required=True, metavar=("NAME", "SHARD"),
                       help="a peer node to run here: its name (identity NAME.pem, summary NAME.json) and data shard I/N")
    ours, rest = front.parse_known_args(argv)
    from peer.cli.main import build_parser, main as swarmloco, quiet_grpc_logging

    template = build_parser().parse_args(rest)
    if template.verb != "peer" or not template.identity_path:
        front.error("expected `peer ... --identity-path PATH ...` (the launcher's arguments) before the --node flags")
    folder = Path(template.identity_path).parent
    quiet_grpc_logging(False)
    sys.stdout, sys.stderr = LineAtomic(sys.stdout), LineAtomic(sys.stderr)
    codes: dict[str, int] = {}

    def node(name: str, shard: str) -> None:
        try:
            codes[name] = swarmloco([*rest, "--identity-path", str(folder / f"{name}.pem"),
                                     "--summary-json", str(folder / f"{name}.json"), "--shard", shard])
        except BaseException:  # noqa: BLE001  (said, and counted as a failure: the other nodes go on)
            print(f"swarmloco peer: node {name} failed:\n{traceback.format_exc()}", file=sys.stderr)
            codes[name] = 1

    threads = [threading.Thread(target=node, args=(name, shard), name=name) for name, shard in ours.node]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for name, _ in ours.node:
        print(f"lab | node {name} exit {codes.get(name, 1)}", flush=True)
    return max(codes.get(name, 1) for name, _ in ours.node)


def coordinator_fingerprint(coordinator) -> str:
    """The key the coordinator printed (start_coordinator returns once it served its address,
    after this line)."""
    for line in list(coordinator.lines):
        if line.startswith(FINGERPRINT_PREFIX):
            return line[len(FINGERPRINT_PREFIX):].strip()
    raise RuntimeError(f"the coordinator printed no '{FINGERPRINT_PREFIX}' line (log: {coordinator.log_path})")


def groups(peers: int, per_process: int) -> list[list[int]]:
    """Peer indices per lab process: ceil(n / per_process) processes, as even as they come."""
    processes = math.ceil(peers / per_process)
    return [list(range(peers))[p::processes] for p in range(processes)]


def lab_peers(per_process: int):
    """A run_swarm `start_peers`: the n nodes in lab processes, dialling the coordinator directly."""
    def start(swarm, coordinator, peers: int) -> list:
        key = coordinator_fingerprint(coordinator)
        children = []
        for p, members in enumerate(groups(peers, per_process)):
            nodes = [arg for i in members for arg in ("--node", f"peer{i}", f"{i}/{peers}")]
            children.append(swarm.start_peer(f"lab{p}", ["--coordinator-key", key, "--log-every", "1000", *nodes],
                                             via_dht=False, module="scripts.scale_lab"))
        return children
    return start


def main(argv: list[str] | None = None) -> int:
    from measure_scale import build_parser, measure_and_store

    parser = build_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--nodes-per-process", type=int, default=8, help="peer nodes per lab process (each with its own "
                        "identity, gRPC server and ledger)")
    parser.set_defaults(peers=[4, 16, 32, 48])
    args = parser.parse_args(argv)
    if args.nodes_per_process < 1:
        parser.error("--nodes-per-process must be at least 1")
    if args.report_only:
        parser.error("--report-only: use scripts/measure_scale.py --report-only (one report for every table)")
    # the lab processes run `python -m scripts.scale_lab`: the repository must be importable from wherever we run
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    how = {"launch": "lab", "nodes_per_process": args.nodes_per_process, "discovery": "direct"}
    return measure_and_store(args, "lab_runs", start_peers=lab_peers(args.nodes_per_process), how=how)


if __name__ == "__main__":
    argv = sys.argv[1:]
    sys.exit(lab_process(argv) if argv[:1] == ["peer"] else main(argv))
