"""Chaos: one swarm run through a seeded schedule of the faults a public swarm has at once, its
invariants checked after every round (DESIGN.md "Chaos"; issue 22).

    .venv/bin/python scripts/chaos.py --rounds 100 --seed 0 --json benchmarks/chaos.json --md benchmarks/chaos.md
    .venv/bin/python scripts/chaos.py report --json benchmarks/chaos.json --md benchmarks/chaos.md

A coordinator (listing a standby's key), a standby and six peers of the tiny model. The schedule
(`draw_schedule`, from the seed): the `churner` SIGKILLs itself after training the rounds it names
(a fault hook, SWARMLOCO_FAIL_AT=trained:R) and is restarted at once with `--resume` (same
identity, the swarm's live DHT addresses); the `straggler` is CPU-throttled by a cgroup for a
window of rounds; the `partitioned` peer lives in a network namespace (scripts/netns_testbed.py
HostLink) whose link is taken down for a window of rounds, right after it committed the window's
first round (it stops itself there, SWARMLOCO_FAIL_AT=committed:R:stop, and runs on once cut off:
listed in that round's manifest, its slices not fetched), or as that round closes if it never
committed it; an `attacker` sign-flips its update
from round 0 (tests/byzantine_peer.py --attack); a `liar` signs false slice results
(tests/byzantine_peer.py --lie lone); the active coordinator SIGKILLs itself in one round and is
never restarted: once the standby holds that round's signed manifest (manifest-followed:R, the
default: the standby continues the round) or, with --coordinator-fault manifest-signed, while
signing it (nobody saw it: the standby reopens the round). Then the same run (same seed, same
topology, every peer honest, no schedule) gives the fault-free loss.

The run is watched through the coordinators' run logs (round closes, wall-clock) and their Status
RPC (each peer's reported round and hash, leases, bans); scripts/chaos_report.py turns the JSON
into verdicts and benchmarks/chaos.md, a pure function of it. Every process, the namespace and
the cgroup are removed at the end, also on an error or Ctrl-C; what is left (processes from
/proc, listening ports) is part of the record.
"""

from __future__ import annotations

import os
import sys

NETNS_ENV = "SWARMLOCO_CHAOS_NETNS"  # set for one child: `python -m scripts.chaos ARGS` enters that namespace,
TARGET_ENV = "SWARMLOCO_CHAOS_TARGET"  # then runs this module (peer.cli.main) with ARGS


def _run_in_namespace() -> None:
    """The partitioned peer's entry: join the namespace while single-threaded, then be the peer."""
    import runpy

    from scripts.netns_testbed import enter_namespace

    enter_namespace(os.environ.pop(NETNS_ENV))
    target = os.environ.pop(TARGET_ENV, "peer.cli.main")
    sys.argv = [target, *sys.argv[1:]]
    runpy.run_module(target, run_name="__main__", alter_sys=True)


if __name__ == "__main__" and os.environ.get(NETNS_ENV):
    _run_in_namespace()
    sys.exit(0)

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict  # noqa: E402
from datetime import timedelta  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from scripts.chaos_cgroup import CpuThrottle  # noqa: E402
from scripts.chaos_plan import COORDINATOR_PHASES, PEERS, ChaosConfig, Schedule, draw_schedule  # noqa: E402,F401 (re-exported)
from scripts.chaos_record import RunRecord  # noqa: E402
from scripts.chaos_report import render, verdicts  # noqa: E402
from scripts.machine_info import command_line, load_average, machine_facts, write_keeping_notes  # noqa: E402
from scripts.stop_signals import unwind_on_stop_signals  # noqa: E402

BYZANTINE = "tests.byzantine_peer"
STATUS_TIMEOUT = timedelta(seconds=2)
TOOK_OVER_RE = re.compile(r"took over run \S+ with term \d+ at round (\d+)[^\n]*?(?:the lapsed lease was ([\d.]+)s)?\)")


def host_flags(ip: str) -> list[str]:
    return ["--host", ip, "--announce-host", ip, "--host-maddrs", f"/ip4/{ip}/tcp/0"]


@contextlib.contextmanager
def environment(**values: str):
    """os.environ with `values` for the `with` block (a child copies it when it starts)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class ChaosRun:
    """One swarm through a schedule (None: the fault-free run, every peer honest)."""

    def __init__(self, config: ChaosConfig, schedule: Schedule | None, workdir: Path, *, netns: bool = True) -> None:
        from peer.cli.launcher import Swarm
        from tests.helpers import write_run_config

        self.config, self.schedule = config, schedule or Schedule()
        self.faulty = schedule is not None
        self.workdir = workdir
        self.swarm = Swarm(workdir)
        self.record = RunRecord("chaos" if self.faulty else "baseline")
        self.run_config = write_run_config(workdir / "run.json", **config.run_sections())
        self.link = None
        if netns:
            from scripts.netns_testbed import HostLink

            self.link = HostLink(f"swlF{os.getpid() % 100000}{'c' if self.faulty else 'b'}")
        self.host_ip = self.link.HOST_IP if self.link else "127.0.0.1"
        self.throttle = CpuThrottle(f"swlF{os.getpid()}{self.record.label}")
        self.trees: dict[int, int] = {}
        self.ports: set[tuple[str, int]] = set()
        self.peers: dict[str, object] = {}
        self.log_offsets: dict[Path, int] = {}
        self.churn_restarts = 0
        self.standby_endpoint = ""
        self.coordinator_exit_noted = False
        self.cut = False  # the partitioned peer's link went down
        self.gate = None
        if config.gate_round is not None:
            from tests.helpers import Gate

            self.gate = Gate(workdir / "gate", "trained", config.gate_round)
        self.t0 = time.time()

    def note(self, what: str, round_: int | None = None) -> None:
        self.record.events.append({"time": round(time.time() - self.t0, 2), "round": round_, "what": what})
        print(f"chaos[{self.record.label}] +{time.time() - self.t0:6.1f}s {what}", flush=True)

    # --- starting -------------------------------------------------------------------------
    def start(self) -> None:
        from protocol.identity import Identity

        if self.link:
            self.link.up()
        keys = [Identity.load_or_create(self.workdir / "standby.pem").peer_id] if self.config.standby else []
        kill = self.schedule.coordinator_kill
        fail = {"SWARMLOCO_FAIL_AT": f"{self.schedule.coordinator_phase}:{kill}"} if kill is not None else {}
        with environment(**fail):
            self.coordinator = self.swarm.start_coordinator(["--config", str(self.run_config), *(["--coordinators", *keys] if keys else []),
                                                             "--run-log", str(self.workdir / "coordinator.jsonl"), *host_flags(self.host_ip)])
        from tests.helpers import free_port

        port = free_port()
        self.standby_endpoint = f"{self.host_ip}:{port}"
        self.standby = None if not keys else self.swarm.start_standby(
            "standby", ["--port", str(port), "--run-log", str(self.workdir / "standby.jsonl"), *host_flags(self.host_ip)])
        for i, name in enumerate(self.config.peers):
            self.record.peer_ids[name] = Identity.load_or_create(self.workdir / f"{name}.pem").peer_id
            self.peers[name] = self._start_peer(name, i)
        self.note(f"started coordinator{', standby' if self.standby else ''} and {len(self.config.peers)} peers ({'with' if self.faulty else 'without'} faults)")

    def _start_peer(self, name: str, i: int, *, resume: bool = False, after_round: int = -1):
        args = ["--shard", f"{i}/{len(self.config.peers)}", "--log-every", "1000", "--identity-path", str(self.workdir / f"{name}.pem")]
        module, env = "peer.cli.main", {}
        child_name = name if not resume else f"{name}-r{self.churn_restarts}"
        if resume:
            args.append("--resume")
        if name == "attacker" and self.schedule.attacker:
            module, args = BYZANTINE, ["--attack", "sign-flip", *args]
        if name == "liar" and self.schedule.liar:
            module, args = BYZANTINE, ["--lie", "lone", *args]
        fail = [f"trained:{r}" for r in self.schedule.churn_kills if r > after_round] if name == "churner" else []
        if name == "partitioned" and self.link and self.schedule.partition and after_round < self.schedule.partition[0]:
            fail.append(f"committed:{self.schedule.partition[0]}:stop")  # the cut comes there: _cut_after_commit
        if self.gate is not None:
            fail.append(self.gate.fault)
        if fail:
            env["SWARMLOCO_FAIL_AT"] = ",".join(fail)
        if name == "partitioned" and self.link:
            env.update({NETNS_ENV: self.link.ns, TARGET_ENV: module})
            module, args = "scripts.chaos", [*args, *host_flags(self.link.NODE_IP)]
        else:
            args += host_flags(self.host_ip)
        with environment(**env):
            return self.swarm.start_peer(child_name, args, module=module)

    # --- watching -------------------------------------------------------------------------
    def _read_logs(self) -> list[int]:
        """New round closes from both coordinators' run logs (earliest time per round)."""
        new = []
        for name in ("coordinator", "standby"):
            path = self.workdir / f"{name}.jsonl"
            if not path.exists():
                continue
            with path.open() as f:
                f.seek(self.log_offsets.get(path, 0))
                text = f.read()
            cut = text.rfind("\n") + 1
            self.log_offsets[path] = self.log_offsets.get(path, 0) + len(text[:cut].encode())
            for line in text[:cut].splitlines():
                event = json.loads(line)
                if self.record.add_log_event(name, event, self.t0):
                    new.append(event["round"])
        return sorted(new)

    def _poll_status(self) -> None:
        from peer.cli.status import fetch_status

        endpoints = [self.swarm.coordinator_endpoint] if self.coordinator.alive() else []
        if self.standby is not None and "took over" in "".join(self.standby.lines):
            endpoints.append(self.standby_endpoint)
        for endpoint in endpoints:
            try:
                status = fetch_status(endpoint, STATUS_TIMEOUT)
            except Exception:  # noqa: BLE001 - a dead or not yet serving coordinator
                continue
            if status.get("coordinator", {}).get("role") != "active":
                continue
            self.record.add_status(status, endpoint, round(time.time() - self.t0, 2))

    def _track(self) -> None:
        from tests.helpers import listening_ports, process_tree

        for child in list(self.swarm.children):
            if child.alive():
                tree = process_tree(child.process.pid)
                self.trees.update(tree)
                for pid in tree:
                    if not child.name.startswith("partitioned"):  # its ports are in its namespace, gone with it
                        self.ports |= listening_ports(pid)

    def _after_round(self, r: int) -> None:
        s = self.schedule
        if "straggler" not in self.peers:
            s = Schedule(churn_kills=s.churn_kills, partition=s.partition)
        if "partitioned" not in self.peers:
            s = Schedule(churn_kills=s.churn_kills, throttle=s.throttle)
        if s.throttle and r == s.throttle[0] - 1:
            from tests.helpers import process_tree

            self.throttle.limit(list(process_tree(self.peers["straggler"].process.pid)), self.config.throttle_fraction)
            self.note(f"straggler throttled to {self.config.throttle_fraction:.0%} of a core ({self.throttle.kind})", r)
        if s.throttle and r == s.throttle[1]:
            self.throttle.lift()
            self.note("straggler unthrottled", r)
        if self.link and s.partition and r == s.partition[0] and not self.cut:  # it never committed that round
            self.link.cut()
            self.cut = True
            self.note(f"partitioned peer's link down (it had not committed round {r})", r)
        if self.link and s.partition and r == s.partition[1]:
            self.link.heal()
            self.note("partitioned peer's link up", r)
            if not self.peers["partitioned"].alive():  # it gave up while cut off: a volunteer starts it again
                self.churn_restarts += 1
                self.peers["partitioned"] = self._start_peer("partitioned", self.config.peers.index("partitioned"), resume=True, after_round=r)
                self.note("partitioned peer had exited: restarted with --resume", r)

    def _cut_after_commit(self, current: int) -> None:
        """The worst moment for a partition (issue 22): the peer stopped itself right after its
        commitment of the partition's first round was accepted (a fault hook), so that round's
        manifest lists it and nobody has fetched its slices yet; its link goes down, then it runs on."""
        from tests.helpers import _stat

        peer = self.peers.get("partitioned")
        if self.cut or not self.link or not self.schedule.partition or peer is None:
            return
        if (stat := _stat(peer.process.pid)) is not None and stat[1] == "T":
            self.link.cut()
            self.cut = True
            os.killpg(peer.process.pid, signal.SIGCONT)
            self.note(f"partitioned peer's link down right after it committed round {self.schedule.partition[0]}", current)

    def _handle_exits(self, current: int) -> None:
        from peer.cli.launcher import MADDR_RE

        churner = self.peers.get("churner")
        if churner is not None and not churner.alive() and churner.process.returncode == -signal.SIGKILL:
            live = [c for c in self.swarm.children if c.alive() and not c.name.startswith("partitioned")]
            maddrs = sorted({m for c in live for m in MADDR_RE.findall("".join(c.lines))})
            self.swarm.initial_peers = maddrs or self.swarm.initial_peers
            self.churn_restarts += 1
            self.peers["churner"] = self._start_peer("churner", self.config.peers.index("churner"), resume=True, after_round=current)
            self.note(f"churner was SIGKILLed: restarted with --resume ({len(maddrs)} live DHT addresses)", current)
        if not self.coordinator.alive() and not self.coordinator_exit_noted:
            self.coordinator_exit_noted = True
            self.note(f"active coordinator exited (rc {self.coordinator.process.returncode})", current)

    def _open_gate(self, current: int) -> None:
        """Tests: once every running peer waits at the gate (a restarted one included), open it."""
        if self.gate is None or self.gate.path.exists():
            return
        waiting = f"reached {self.gate.phase}:{self.gate.round}, waiting for {self.gate.path}"
        running = [c for c in self.peers.values() if c.alive()]
        if running and all(waiting in "".join(c.lines) for c in running):
            self.gate.open()
            self.note(f"{len(running)} peers at the gate after training round {self.gate.round}: opened", current)

    def watch(self) -> None:
        timeout = self.config.timeout_s or 30.0 * self.config.rounds + 300.0
        deadline, last_poll, last_track, current = time.monotonic() + timeout, 0.0, 0.0, -1
        while time.monotonic() < deadline:
            for r in self._read_logs():
                current = max(current, r)
                self._after_round(r)
                self._poll_status()
                last_poll = time.monotonic()
            if time.monotonic() - last_poll > 1.0:
                self._poll_status()
                last_poll = time.monotonic()
            if time.monotonic() - last_track > 2.0:
                self._track()
                last_track = time.monotonic()
            self._handle_exits(current)
            self._cut_after_commit(current)
            self._open_gate(current)
            if self.record.finished:
                self.note(f"run finished at round {self.record.finished['round']}", current)
                return
            if not self.coordinator.alive() and not (self.standby and self.standby.alive()):
                ended = "no coordinator left running"
            elif not any(c.alive() for c in self.peers.values()):
                ended = "every peer has exited: " + ", ".join(f"{c.name} rc {c.process.returncode}" for c in self.peers.values())
            else:
                ended = ""
            if ended:
                self._last_lines()
                self.note(ended, current)
                return
            time.sleep(0.25)
        self.note(f"gave up after {timeout:.0f} s", current)

    def _last_lines(self) -> None:
        """The run log's last round and `finished`, which a coordinator logs as it stops (after its peers left)."""
        for child in filter(None, (self.coordinator, self.standby)):
            with contextlib.suppress(Exception):  # finish() stops what is still running
                self.swarm.wait(child, 60.0)
        self._read_logs()

    # --- ending ---------------------------------------------------------------------------
    def finish(self) -> None:
        """Peers leave with the run; then whatever is left is stopped, the fixtures removed, and
        what is still running or listening recorded."""
        from tests.helpers import host_listening, read_summary, still_running

        deadline = time.monotonic() + (60.0 if self.record.finished else 0.0)  # peers leave with a finished run
        for child in [self.coordinator, *([self.standby] if self.standby else []), *self.peers.values()]:
            try:
                self.swarm.wait(child, max(0.1, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - stop_all below ends it
                pass
        self._track_exit_codes()
        final = {}
        for name in ("standby", "coordinator"):
            try:
                summary = read_summary(self.swarm, name)
            except (OSError, ValueError):
                continue
            if summary.get("coordinator", {}).get("role") == "active" or summary.get("history"):
                final = summary
                break
        self.record.final["bans"] = {p["peer_id"]: {"reason": p.get("banned_reason", ""), "evidence": [e.get("kind") for e in p.get("evidence") or []]}
                                     for p in final.get("peers", []) if p.get("banned_reason")}
        self.record.final["history_rounds"] = [h["round"] for h in final.get("history", [])]
        self.record.final["final_hash"] = final.get("history", [{}])[-1].get("param_hash") if final.get("history") else None
        self.record.final["coordinator_term"] = final.get("coordinator", {}).get("term")
        peers = {}
        for child in self.swarm.children:
            if child.name in ("coordinator", "standby"):
                continue
            try:
                s = read_summary(self.swarm, child.name)
            except (OSError, ValueError):
                s = {}
            peers[child.name] = {"rc": child.process.returncode, "param_hash": s.get("param_hash"), "round": s.get("round"),
                                 "in_sync": [[h["round"], bool(h.get("in_sync"))] for h in s.get("history", [])]}
        self.record.final["peers"] = peers
        if self.standby is not None:
            self.record.takeovers = [{"round": int(m.group(1)), "lapsed_lease_s": float(m.group(2)) if m.group(2) else None,
                                      "line": m.group(0)} for m in TOOK_OVER_RE.finditer("".join(self.standby.lines))]
        self.stop()
        left = still_running(self.trees, within_s=10.0)
        self.record.final["left_running"] = {str(pid): cmd[:200] for pid, cmd in left.items()}
        self.record.final["ports_seen"] = len(self.ports)
        self.record.final["ports_left"] = host_listening(self.ports)
        self.record.final["netns_left"] = bool(self.link) and self.link.ns in os.popen("ip netns list").read()
        self.record.final["cgroup_left"] = self.throttle.exists()

    def _track_exit_codes(self) -> None:
        self.record.final["exits"] = {c.name: c.process.returncode for c in self.swarm.children}

    def stop(self) -> None:
        """Never raises: every child's group, the namespace and the cgroup go."""
        try:
            self.swarm.stop_all()
        finally:
            if self.link:
                self.link.close()
            self.throttle.close()


def run_one(config: ChaosConfig, schedule: Schedule | None, workdir: Path, *, netns: bool = True) -> dict:
    run = ChaosRun(config, schedule, workdir, netns=netns)
    try:
        run.start()
        run.watch()
        run.finish()
    finally:
        run.stop()
    record = asdict(run.record)
    record["rounds"] = [record["rounds"][r] for r in sorted(record["rounds"])]
    record["reports"] = sorted(record["reports"].values(), key=lambda x: (x["round"], x["peer"]))
    return record


def run_chaos(config: ChaosConfig, workdir: Path, *, netns: bool = True, schedule: Schedule | None = None,
              baseline: bool = True) -> dict:
    """The chaos run, then (baseline) the same run without faults; the JSON the report reads."""
    schedule = schedule or draw_schedule(config.rounds, config.seed)
    if netns:
        from scripts.netns_testbed import namespaces_permitted

        why = namespaces_permitted()
        if why:
            raise SystemExit(f"scripts/chaos.py: the partition needs a network namespace: {why} (or pass --no-netns)")
    result = {"config": asdict(config), "schedule": {**asdict(schedule), "events": schedule.events()}, "netns": netns,
              "machine": machine_facts(), "load_before": load_average(), "command": command_line()}
    t = time.monotonic()
    result["chaos"] = run_one(config, schedule, workdir / "chaos", netns=netns)
    result["chaos"]["wall_s"] = round(time.monotonic() - t, 1)
    if baseline:
        t = time.monotonic()
        result["baseline"] = run_one(config, None, workdir / "baseline", netns=netns)
        result["baseline"]["wall_s"] = round(time.monotonic() - t, 1)
    result["load_after"] = load_average()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("mode", nargs="?", default="run", choices=("run", "report"), help="run (default) or report an existing JSON")
    parser.add_argument("--rounds", type=int, default=ChaosConfig.rounds)
    parser.add_argument("--seed", type=int, default=ChaosConfig.seed)
    parser.add_argument("--inner-steps", type=int, default=ChaosConfig.inner_steps)
    parser.add_argument("--lease-s", type=float, default=ChaosConfig.lease_s)
    parser.add_argument("--coordinator-fault", choices=COORDINATOR_PHASES, default=COORDINATOR_PHASES[0],
                        help="where the active coordinator dies: once the standby holds the round's manifest (continued), "
                             "or while signing it (reopened)")
    parser.add_argument("--no-netns", action="store_true", help="no partition (no root): every node on loopback")
    parser.add_argument("--no-baseline", action="store_true", help="skip the fault-free run (no loss verdict)")
    parser.add_argument("--workdir", default="/tmp/swarmloco-chaos", help="logs, keys, summaries of both runs")
    parser.add_argument("--json", required=True, help="write (run) or read (report) the record here")
    parser.add_argument("--md", help="write the markdown report here")
    args = parser.parse_args(argv)
    if args.mode == "report":
        result = json.loads(Path(args.json).read_text())
    else:
        config = ChaosConfig(rounds=args.rounds, seed=args.seed, inner_steps=args.inner_steps, lease_s=args.lease_s)
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        unwind_on_stop_signals()  # SIGTERM and Ctrl-C unwind: the finally blocks clean up
        try:
            result = run_chaos(config, Path(args.workdir), netns=not args.no_netns, baseline=not args.no_baseline,
                               schedule=draw_schedule(config.rounds, config.seed, args.coordinator_fault))
        except KeyboardInterrupt:  # the runs' finally blocks have stopped every process, the namespace and the cgroup
            print(f"scripts/chaos.py: interrupted; every process it started is stopped (logs in {args.workdir})", file=sys.stderr)
            return 130
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    v = verdicts(result)
    for check in v["checks"]:
        print(f"{'PASS' if check['ok'] else 'FAIL'}  {check['name']}: {check['detail']}")
    if args.md:
        write_keeping_notes(args.md, render(result))
    return 0 if v["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
