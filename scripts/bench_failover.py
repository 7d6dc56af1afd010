"""Control-plane timings (issue #11): how long a standby takes to take over from a killed
coordinator, and how the coordinator's RPCs fare while a slow round closes.

    nice -n 15 .venv/bin/python scripts/bench_failover.py takeover --trials 5 --json /tmp/takeover.json
    nice -n 15 .venv/bin/python scripts/bench_failover.py takeover --trials 5 --fail-at manifest-signed:2 --json /tmp/takeover_reopen.json
    nice -n 15 .venv/bin/python scripts/bench_failover.py lock --label after --json /tmp/lock_after.json
    PYTHONPATH=/tmp/before nice -n 15 .venv/bin/python scripts/bench_failover.py lock --label before --json /tmp/lock_before.json
    .venv/bin/python scripts/bench_failover.py report --parts /tmp/takeover.json /tmp/takeover_reopen.json /tmp/lock_*.json \
        /tmp/wan_*.json --json benchmarks/failover.json --md benchmarks/failover.md

`takeover`: per trial, an active coordinator (CLI, SWARMLOCO_FAIL_AT=--fail-at), one standby and
2 tiny peers on loopback. `manifest-followed:2` (the default): the active SIGKILLs itself as soon as
the standby's heartbeat says it holds round 2's signed manifest (the manifest is out, the peers work
on it): the standby continues round 2. `manifest-signed:2`: it SIGKILLs itself while signing round
2's manifest, before anyone saw it: the standby reopens round 2 (the peers commit the same update
again). The kill time is when the parent sees the active's process exit; from there to the
standby's "took over" line and to its next "round N/M closed" line. Lines are timestamped by a
10 ms poller of the launcher's line buffers.

`lock`: an in-process Coordinator with a bigger model served over gRPC; a client thread sends
a signed Heartbeat and a GetRunInfo every 20 ms while the clock closes one round; latencies of
the calls that overlap the close.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # appended: PYTHONPATH=/tmp/before wins for the "before" code

from scripts.machine_info import load_average, machine_facts, machine_lines, write_keeping_notes  # noqa: E402

LEASE_S = 2.0
FAIL_POINTS = {  # --fail-at: what the takeover finds
    "manifest-followed:2": "the active died once the standby held round 2's signed manifest: round 2 continued under it",
    "manifest-signed:2": "the active died signing round 2's manifest (nobody saw it): round 2 reopened, the peers' same updates committed again",
}
ROUND_FATE_RE = re.compile(r"round (\d+) (continued|reopened)")
ROUNDS = 5
CLOSED_RE = re.compile(r"coordinator \| round (\d+)/(\d+) closed .*?\| ([\d.]+)s \(")
TOOK_RE = re.compile(r"took over run \S+ with term \d+ at round (\d+).*?(?:the lapsed lease was ([\d.]+)s)?\)")


class LineClock:
    """Timestamps (monotonic) each new line of a launcher Child, polling every 10 ms."""

    def __init__(self, children) -> None:
        self.seen: dict[str, list[tuple[float, str]]] = {c.name: [] for c in children}
        self.children = children
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def add(self, child) -> None:
        self.seen[child.name] = []
        self.children = [*self.children, child]

    def _run(self) -> None:
        while not self.stop.wait(0.01):
            now = time.monotonic()
            for child in self.children:
                got = self.seen[child.name]
                for line in child.lines[len(got):]:
                    got.append((now, line))

    def first(self, name: str, pattern: str, after: float = 0.0) -> tuple[float, str] | None:
        regex = re.compile(pattern)
        for t, line in self.seen.get(name, []):
            if t >= after and regex.search(line):
                return t, line
        return None


def wait_for(clock: LineClock, name: str, pattern: str, timeout_s: float, after: float = 0.0) -> tuple[float, str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        hit = clock.first(name, pattern, after)
        if hit:
            return hit
        time.sleep(0.02)
    raise TimeoutError(f"{name} never printed {pattern!r}")


def one_takeover(workdir: Path, fail_at: str) -> dict:
    from peer.cli.launcher import Swarm
    from protocol.identity import Identity
    from tests.conftest import write_run_config
    from tests.helpers import free_port as _free_port

    swarm = Swarm(workdir)
    try:
        standby_key = Identity.load_or_create(workdir / "standby.pem")
        config = write_run_config(workdir / "run.json", rounds={"rounds": ROUNDS, "expected_peers": 2}, control={"lease_s": LEASE_S})
        os.environ["SWARMLOCO_FAIL_AT"] = fail_at
        try:
            active = swarm.start_coordinator(["--config", str(config), "--coordinators", standby_key.peer_id])
        finally:
            del os.environ["SWARMLOCO_FAIL_AT"]
        clock = LineClock([active])
        exited: dict[str, float] = {}

        def watch() -> None:
            active.process.wait()
            exited["t"] = time.monotonic()

        threading.Thread(target=watch, daemon=True).start()
        standby = swarm.start_standby("standby", ["--port", str(_free_port())])
        clock.add(standby)
        wait_for(clock, "standby", r"following run \S+'s active coordinator", 120)
        for i in range(2):
            clock.add(swarm.start_peer(f"peer{i}", ["--shard", f"{i}/2"]))
        deadline = time.monotonic() + 300
        while "t" not in exited and time.monotonic() < deadline:
            time.sleep(0.01)
        if "t" not in exited:
            raise TimeoutError("the active coordinator never died at its fail point")
        killed = exited["t"]
        took, took_line = wait_for(clock, "standby", r"took over run \S+ with term \d+ at round \d+", 120)
        closed, closed_line = wait_for(clock, "standby", r"coordinator \| round \d+/\d+ closed", 180, after=took)
        fate = ROUND_FATE_RE.search(wait_for(clock, "standby", r"round \d+ (continued|reopened)", 10, after=took)[1])
        before = [float(m.group(3)) for _, line in clock.seen["coordinator"] if (m := CLOSED_RE.search(line))]
        rc = active.process.returncode
        took_match = TOOK_RE.search(took_line)
        return {
            "active_rc": rc,
            # A trial where the standby took over before the kill (the loaded machine let the
            # active's lease lapse; it stepped down, safely) measures no failover: reported apart.
            "took_over_before_kill": took < killed,
            "took_over_round": int(took_match.group(1)) if took_match else None,
            "lapsed_lease_s": float(took_match.group(2)) if took_match and took_match.group(2) else None,
            "takeover_s": took - killed,
            "next_close_s": closed - killed,
            "round_fate": fate.group(2) if fate else None,  # continued (under the followed manifest) or reopened
            "took_over_line": took_line.strip(),
            "next_closed_line": closed_line.strip(),
            "round_seconds_before_kill": before,
        }
    finally:
        try:
            clock.stop.set()
        except NameError:
            pass
        swarm.stop_all()


def run_takeover(args) -> dict:
    load_before = load_average()
    trials = []
    for i in range(2 * args.trials):  # trials that measured no failover are run again, up to as many more
        if sum(not x["took_over_before_kill"] for x in trials) >= args.trials:
            break
        with tempfile.TemporaryDirectory(prefix="swarmloco-failover-") as tmp:
            trial = one_takeover(Path(tmp), args.fail_at)
        print(f"trial {i}: takeover {trial['takeover_s']:.2f}s, next close {trial['next_close_s']:.2f}s, "
              f"round {trial['took_over_round']} {trial['round_fate']}, lapsed lease {trial['lapsed_lease_s']}, "
              f"rounds before {trial['round_seconds_before_kill']}{' (took over before the kill)' if trial['took_over_before_kill'] else ''}",
              flush=True)
        trials.append(trial)
    return {"part": "takeover", "lease_s": LEASE_S, "rounds": ROUNDS, "peers": 2, "fail_at": args.fail_at, "nice": os.nice(0),
            "config": "tests' tiny config (d_model 64, 1 layer, 8 inner steps), codec/outer/aggregator defaults",
            "trials": trials, "load_before": load_before, "load_after": load_average()}


# --- lock: RPC latency while a round closes -----------------------------------------------


def run_lock(args) -> dict:
    import grpc
    import torch

    torch.set_num_threads(1)
    from peer.coordinator.server import build_coordinator_server
    from peer.coordinator.state import Coordinator
    from protocol.envelope import HEARTBEAT_TAG, JOIN_TAG
    from protocol.identity import Identity
    from protocol.signing import sign_body
    from protocol.wire import swarm_pb2, swarm_pb2_grpc
    from tests.conftest import tiny_run_config

    model = {"d_model": args.d_model, "n_layer": args.n_layer, "n_head": 8, "seq_len": 128}
    cfg = tiny_run_config(model=model, data={"val_batches": args.val_batches, "batch_size": 8}, exchange={"mode": "all-to-all"},
                          rounds={"rounds": 3, "min_peers": 1, "min_deadline_s": 1.0, "deadline_s": 1.0, "max_deadline_s": 1.0})
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="swarmloco-lock-") as tmp:
        coordinator = Coordinator(cfg, Identity.generate(), checkpoint_path=Path(tmp) / "c.ckpt")
        built = build_coordinator_server(coordinator, host="127.0.0.1", port=0)
        built.server.start()
        peer = Identity.generate()
        channel = grpc.insecure_channel(coordinator.endpoint)
        stub = swarm_pb2_grpc.CoordinatorStub(channel)
        stub.Join(sign_body(peer, JOIN_TAG, {"run_id": cfg.run_id, "endpoint": "", "client_mode": True, "version": "bench",
                                             "timestamp": time.time()}), timeout=60)  # a known peer: its heartbeats are served
        calls: list[tuple[float, float, str]] = []  # (start, seconds, kind)
        stop = threading.Event()

        def client() -> None:
            while not stop.is_set():
                body = {"peer_id": peer.peer_id, "round": coordinator.round, "param_hash": "", "state": "training", "step": 0,
                        "loss": 0.0, "bytes_sent": 0, "bytes_received": 0, "round_bytes": 0, "utilization": 0.0,
                        "left_out": [], "timestamp": time.time()}
                for kind, call in (("heartbeat", lambda: stub.Heartbeat(sign_body(peer, HEARTBEAT_TAG, body), timeout=60)),
                                   ("run_info", lambda: stub.GetRunInfo(swarm_pb2.RunInfoRequest(), timeout=60))):
                    t0 = time.monotonic()
                    try:
                        call()
                    except grpc.RpcError:
                        pass  # a refusal (unknown peer) is still a served call: its latency counts
                    calls.append((t0, time.monotonic() - t0, kind))
                stop.wait(0.02)

        thread = threading.Thread(target=client, daemon=True)
        thread.start()
        time.sleep(1.0)
        t_close = time.monotonic()
        if hasattr(coordinator, "_apply_closed") or hasattr(coordinator, "clock"):  # after 0acbfb1: close_round takes the lock for the manifest only
            coordinator.close_round("bench")
        else:  # before: tick() held the lock over the whole close (aggregate, evaluate, checkpoint)
            with coordinator.lock:
                coordinator.close_round("bench")
        t_done = time.monotonic()
        time.sleep(0.5)
        stop.set()
        thread.join(5)
        channel.close()
        built.server.stop(0).wait(5)
    during = [s for t0, s, _ in calls if t0 + s >= t_close and t0 <= t_done]
    idle = [s for t0, s, _ in calls if t0 + s < t_close]
    import peer

    return {"part": "lock", "label": args.label, "code": str(Path(peer.__file__).parent.parent), "model": model, "numel": coordinator.numel, "val_batches": args.val_batches,
            "close_s": t_done - t_close, "calls_during_close": len(during), "during": summary(during), "idle": summary(idle),
            "load_before": load_before, "load_after": load_average()}


def summary(xs: list[float]) -> dict:
    if not xs:
        return {"n": 0}
    xs = sorted(xs)
    pick = lambda q: xs[min(len(xs) - 1, int(q * len(xs)))]  # noqa: E731
    return {"n": len(xs), "p50_ms": 1e3 * pick(0.5), "p99_ms": 1e3 * pick(0.99), "max_ms": 1e3 * xs[-1]}


# --- wan: did every peer of a wan_emulation run end on the final hash? -----------------------

FINISHED_RE = re.compile(r"finished: run \S+ ended at round (\d+), final hash (\w+)")


def run_wan_check(args) -> dict:
    """Read a `scripts/wan_emulation.py --workdir DIR` run: each peer's "finished" line against the
    coordinator's last history hash, and any traceback in any log."""
    folder = Path(args.workdir)
    coordinator = json.loads((folder / "coordinator.json").read_text())
    final = coordinator["history"][-1]["param_hash"] if coordinator["history"] else ""
    peers = {}
    for log in sorted(folder.glob("peer*.log")):
        text = log.read_text(errors="replace")
        m = FINISHED_RE.search(text)
        peers[log.stem] = {"finished_round": int(m.group(1)) if m else None, "final_hash": m.group(2) if m else None,
                           "on_final_hash": bool(m) and m.group(2) == final, "traceback": "Traceback" in text}
    return {"part": "wan", "label": args.label, "command": args.command, "rounds": coordinator["rounds"],
            "closed_rounds": len(coordinator["history"]), "coordinator_final_hash": final, "peers": peers,
            "all_finished_on_final_hash": bool(peers) and all(p["on_final_hash"] for p in peers.values()),
            "any_traceback": any(p["traceback"] for p in peers.values()) or "Traceback" in (folder / "coordinator.log").read_text(errors="replace"),
            "load_before": load_average(), "load_after": load_average()}


# --- report ---------------------------------------------------------------------------------


def render(data: dict) -> str:
    lines = ["# Control-plane timings (issue #11)", "",
             f"Written by `scripts/bench_failover.py report` from `failover.json` (same run). 1 torch thread; a part that "
             "records no niceness ran with `nice -n 15`.", ""]
    lines += data.get("machine", [])
    for t in data.get("takeovers", []):
        skipped = [x for x in t["trials"] if x.get("took_over_before_kill")]
        trials = [x for x in t["trials"] if not x.get("took_over_before_kill")]
        take = [x["takeover_s"] for x in trials]
        nxt = [x["next_close_s"] for x in trials]
        rounds = [s for x in trials for s in x["round_seconds_before_kill"][1:]]  # round 1 waits for the peers to start
        round_s = statistics.median(rounds) if rounds else float("nan")
        niceness = "" if t.get("nice") is None else f"; niceness {t['nice']}"
        lines += ["", f"## Time to take over: {FAIL_POINTS.get(t['fail_at'], t['fail_at'])}", "",
                  f"{len(trials)} trials; each: active coordinator (CLI, `--coordinators <standby>`, `[control] lease_s = {t['lease_s']}`, "
                  f"SWARMLOCO_FAIL_AT={t['fail_at']}), 1 standby, {t['peers']} peers; {t['config']}; {t['rounds']} rounds. "
                  f"Clock starts when the parent sees the active's process exit. Load (1/5/15 min) before: {t['load_before']}; after: {t['load_after']}"
                  f"{niceness}.", "",
                  "| measure | median s | min s | max s |", "|---|---|---|---|"]
        lines.append(f"| rounds closed before the kill (after the first, which waits for the peers) | {round_s:.2f} | "
                     f"{min(rounds, default=float('nan')):.2f} | {max(rounds, default=float('nan')):.2f} |")
        own = [float(m.group(3)) for x in trials if (m := CLOSED_RE.search(x["next_closed_line"]))]
        after = [n - k for n, k in zip(nxt, take)]
        for name, xs in (("kill → standby's \"took over\" line", take), ("kill → standby's next \"round N/M closed\" line", nxt),
                         ("standby's \"took over\" line → that close", after),
                         ("that round's own seconds (from the takeover), as the new coordinator's close line states it", own)):
            lines.append(f"| {name} | {statistics.median(xs):.2f} | {min(xs):.2f} | {max(xs):.2f} |")
        lapsed = [x["lapsed_lease_s"] for x in trials if x.get("lapsed_lease_s")]
        if lapsed:
            lines.append(f"| the lapsed lease (adaptive: the active's record announced it) | {statistics.median(lapsed):.2f} | "
                         f"{min(lapsed):.2f} | {max(lapsed):.2f} |")
        held = [x.get("took_over_round") for x in trials]
        if all(r is not None for r in held):
            fates = [x.get("round_fate") or "?" for x in trials]
            lines += ["", f"Round the standby took over at, per trial: {', '.join(f'{r} ({f})' for r, f in zip(held, fates))} "
                      f"(2 = the round in flight; nobody trained it again)."]
        if skipped:
            lines += ["", f"{len(skipped)} more trial(s) measured no failover: the loaded machine let the active's lease lapse before "
                      "the kill, the standby took over and the active stepped down (safely); they were run again and are left out above."]
        lines += ["", f"Reference: lease_s + one round = {t['lease_s']} + {round_s:.2f} (median of the {len(rounds)} rounds closed "
                  f"before the kills) = {t['lease_s'] + round_s:.2f} s. Median time to the next close is "
                  f"{statistics.median(nxt) / (t['lease_s'] + round_s):.2f}x that."]
        if lapsed:
            ref = statistics.median(lapsed) + round_s
            lines.append(f"With the lease the active actually held (median {statistics.median(lapsed):.2f} s): {ref:.2f} s; "
                         f"the median time to the next close is {statistics.median(nxt) / ref:.2f}x that.")
            own_ref = [x["next_close_s"] / (x["lapsed_lease_s"] + round_s) for x in trials if x.get("lapsed_lease_s")]
            lines.append(f"Per trial, kill → next close over (its own lapsed lease + {round_s:.2f} s): "
                         f"{', '.join(f'{v:.2f}x' for v in own_ref)}; within it in {sum(v <= 1.0 for v in own_ref)} of {len(own_ref)}.")
    locks = data.get("lock", [])
    if locks:
        lines += ["", "## RPC latency while a round closes", "",
                  "In-process Coordinator served by build_coordinator_server; a client thread sends a signed Heartbeat and a "
                  "GetRunInfo every 20 ms; `close_round` closes an empty all-to-all round (manifest, evaluation, checkpoint). "
                  "Latency of calls that overlap the close.", "",
                  "| code | model | params | close s | calls during close | p50 ms | p99 ms | max ms | idle p50 ms | load 1-min before → after |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for x in locks:
            d, i, m = x["during"], x["idle"], x["model"]
            lines.append(f"| {x['label']} | d_model {m['d_model']}, {m['n_layer']} layers, seq {m['seq_len']}, val_batches {x['val_batches']} | "
                         f"{x['numel']:,} | {x['close_s']:.2f} | {d['n']} | {d.get('p50_ms', float('nan')):.1f} | "
                         f"{d.get('p99_ms', float('nan')):.1f} | {d.get('max_ms', float('nan')):.1f} | {i.get('p50_ms', float('nan')):.1f} | "
                         f"{x['load_before'].split(' / ')[0]} → {x['load_after'].split(' / ')[0]} |")
    wans = data.get("wan", [])
    if wans:
        lines += ["", "## Run end over an emulated WAN", "",
                  "`scripts/wan_emulation.py` (network namespaces, tbf + delay proxy), read back from its --workdir logs by "
                  "`bench_failover.py wan-check`.", "",
                  "| run | rounds closed | peers | every peer \"finished\" on the coordinator's final hash | traceback in any log |",
                  "|---|---|---|---|---|"]
        for w in wans:
            lines.append(f"| `{w['command']}` | {w['closed_rounds']}/{w['rounds']} | {len(w['peers'])} | "
                         f"{'yes' if w['all_finished_on_final_hash'] else 'NO: ' + str({k: v['final_hash'] for k, v in w['peers'].items()})} | "
                         f"{'YES' if w['any_traceback'] else 'no'} |")
    return "\n".join(lines) + "\n"


def run_report(args) -> None:
    parts = [json.loads(Path(path).read_text()) for path in args.parts]
    # the machine of the first part's run as that part recorded it (not the machine writing the report)
    measured = [p for p in parts if p.get("machine")] or parts  # the parts this report's machine line is about
    data: dict = {"machine": machine_lines(measured[0].get("machine"), measured[0]["load_before"], measured[-1]["load_after"]), "lock": [],
                  "takeovers": []}
    for part in parts:
        if part["part"] == "takeover":
            data.setdefault("takeovers", []).append(part)
        elif part["part"] == "lock":
            data["lock"].append(part)
        elif part["part"] == "wan":
            data.setdefault("wan", []).append(part)
    data["lock"].sort(key=lambda x: x["label"] != "before")  # before, then after
    Path(args.json).write_text(json.dumps(data, indent=2))
    write_keeping_notes(args.md, render(data))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("takeover")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--fail-at", choices=sorted(FAIL_POINTS), default="manifest-followed:2")
    p.add_argument("--json", required=True)
    p = sub.add_parser("lock")
    p.add_argument("--label", required=True)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--val-batches", type=int, default=4)
    p.add_argument("--json", required=True)
    p = sub.add_parser("wan-check")
    p.add_argument("--workdir", required=True, help="a wan_emulation --workdir's codec folder (holds coordinator.json, peer*.log)")
    p.add_argument("--label", required=True)
    p.add_argument("--command", required=True, help="the wan_emulation command line that ran, for the table")
    p.add_argument("--json", required=True)
    p = sub.add_parser("report")
    p.add_argument("--parts", nargs="+", required=True)
    p.add_argument("--json", default="benchmarks/failover.json")
    p.add_argument("--md", default="benchmarks/failover.md")
    args = parser.parse_args(argv)
    if args.verb == "report":
        run_report(args)
        return
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    result = {"takeover": run_takeover, "lock": run_lock, "wan-check": run_wan_check}[args.verb](args)
    result["machine"] = machine_facts()  # the report prints the machine its parts ran on, from here
    Path(args.json).write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k != "trials"}, indent=1))


if __name__ == "__main__":
    main()
