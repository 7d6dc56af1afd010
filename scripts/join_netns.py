"""The README's "Join a swarm from another machine", tried as a volunteer would, across two network
namespaces (scripts/netns_testbed.py's bridge: two "machines" at 10.77.0.1 and 10.77.0.2).

    sudo .venv/bin/python scripts/join_netns.py                         # clone, install, trial -> docs/join-trial.json
    sudo .venv/bin/python scripts/join_netns.py --clone /tmp/A_fresh    # an installed clone: the trial only
    .venv/bin/python scripts/join_netns.py --report-only docs/join-trial.json   # the doc's section again

1. A fresh clone of this repository (`git clone` of the committed HEAD) and the README's install
   line in it, `python3 -m venv .venv && .venv/bin/pip install .`, preceded by the CPU torch the
   README tells a CPU-only machine to install first (`.venv/bin/pip install torch==VERSION`, the
   Makefile's TORCH_VERSION).
2. Machine 1 runs the README's "Start a swarm" command with its example address replaced by
   10.77.0.1 (HOME is a folder of its own, so `~/.swarmloco` is that machine's).
3. Machine 2 runs the README's join line, read out of README.md, with only its placeholders filled
   in: the `--initial-peers` address the coordinator printed, and 10.77.0.2 for `--announce-host`.
   It runs from the clone with PYTHONPATH unset, so the code is the installed package's.
4. `swarmloco status --coordinator 10.77.0.1:31338 --json` (from machine 2) is polled: the peer
   must be listed, not excluded or banned, its last_round advancing and its hash the coordinator's.
5. The peer is stopped with Ctrl+C (SIGINT) after --rounds-before rounds, and the same line is run
   again: it must come back as the same peer id, say that it resumed, and count again for
   --rounds-after more rounds. Then everything is stopped and the namespaces deleted.

It writes a JSON of what ran and what was seen, and the "Last trial" section of docs/join-trial.md
from that JSON (a pure function of it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for extra in (str(ROOT), str(ROOT / "scripts")):
    if extra not in sys.path:
        sys.path.insert(0, extra)

COORD_EXAMPLE_IP, PEER_EXAMPLE_IP = "203.0.113.7", "203.0.113.9"
MADDR_EXAMPLE = re.compile(r"/ip4/203\.0\.113\.7/tcp/31337/p2p/12D3KooW\.\.\.")
DOC = ROOT / "docs/join-trial.md"
TRIAL_MARK = "<!-- trial: written by scripts/join_netns.py -->"


class TrialError(RuntimeError):
    pass


def readme_block(readme: str, section: str, needle: str) -> str:
    """The first fenced code block of README section `section` that contains `needle`."""
    match = re.search(rf"^## {re.escape(section)}\n(.*?)(?=^## )", readme, re.S | re.M)
    if match is None:
        raise TrialError(f"README.md has no section '## {section}'")
    for block in re.findall(r"```\n(.*?)```", match.group(1), re.S):
        if needle in block:
            return block.strip()
    raise TrialError(f"README.md's section '{section}' has no code block with {needle!r}")


def readme_commands(readme: str) -> dict[str, str]:
    return {"install": readme_block(readme, "Join a swarm from another machine", "pip install ."),
            "join": readme_block(readme, "Join a swarm from another machine", "swarmloco peer"),
            "coordinator": readme_block(readme, "Start a swarm", "swarmloco coordinator")}


def torch_version() -> str:
    match = re.search(r"^TORCH_VERSION \?= (\S+)", (ROOT / "Makefile").read_text(), re.M)
    if match is None:
        raise TrialError("Makefile sets no TORCH_VERSION")
    return match.group(1)


def run_logged(argv: list[str] | str, log: Path, *, cwd: Path, shell: bool = False, timeout: float = 1800) -> None:
    with open(log, "a") as out:
        out.write(f"$ {argv if shell else ' '.join(argv)}\n")
        out.flush()
        done = subprocess.run(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, shell=shell, timeout=timeout,
                              executable="/bin/bash" if shell else None)
    if done.returncode != 0:
        raise TrialError(f"{argv} failed ({done.returncode}); see {log}")


def fresh_install(workdir: Path, install_line: str) -> tuple[Path, float]:
    """git clone of HEAD, then the CPU torch and the README's install line in it: (clone, seconds)."""
    clone, log, started = workdir / "clone", workdir / "install.log", time.monotonic()
    run_logged(["git", "clone", "-q", str(ROOT), str(clone)], log, cwd=workdir)
    run_logged("python3 -m venv .venv", log, cwd=clone, shell=True)
    run_logged(f".venv/bin/pip install -q torch=={torch_version()}", log, cwd=clone, shell=True)
    run_logged(install_line.replace("python3 -m venv .venv && ", ""), log, cwd=clone, shell=True)
    return clone, time.monotonic() - started


class Machine:
    """One namespace of the testbed as a volunteer's machine: its IP, its HOME, its processes."""

    def __init__(self, bed, index: int, clone: Path, home: Path) -> None:
        self.bed, self.ns, self.ip, self.clone, self.home = bed, bed.names[index], bed.ip_of(index), clone, home
        home.mkdir(parents=True, exist_ok=True)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        return env | {"HOME": str(self.home), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}

    def start(self, command: str, log: Path) -> subprocess.Popen:
        out = open(log, "a")
        process = subprocess.Popen(["ip", "netns", "exec", self.ns, "/bin/bash", "-c", command], cwd=self.clone, env=self.env(),
                                   stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.bed.processes.append(process)  # Testbed.close() stops its group
        return process

    def status(self, endpoint: str) -> dict | None:
        done = subprocess.run(["ip", "netns", "exec", self.ns, str(self.clone / ".venv/bin/swarmloco"), "status", "--coordinator", endpoint,
                               "--json"], cwd=self.clone, env=self.env(), capture_output=True, text=True, timeout=60)
        try:
            return json.loads(done.stdout) if done.returncode == 0 else None
        except json.JSONDecodeError:
            return None


def peer_row(status: dict | None, peer_id: str) -> dict | None:
    return next((p for p in (status or {}).get("peers", []) if p["peer_id"] == peer_id), None)


def snapshot(status: dict, row: dict, t0: float) -> dict:
    return {"t_s": round(time.monotonic() - t0, 1), "round": status["round"], "last_round": row["last_round"], "state": row["state"],
            "excluded": row.get("excluded") or row.get("excluded_reason") or "", "banned": row.get("banned") or "",
            "hash_matches": row.get("param_hash") == status["param_hash"]}


def peer_id_from(log: Path, timeout_s: float, process: subprocess.Popen) -> str:
    """The full peer id from the peer's own log (`--identity-path` key): its summary line or status."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = log.read_text()
        match = re.search(r"peer id ([0-9a-f]{32})", text) or re.search(r"peer ([0-9a-f]{8}) \|", text)
        if match:
            return match.group(1)
        if process.poll() is not None:
            raise TrialError(f"the peer exited ({process.returncode}) before training:\n{text[-3000:]}")
        time.sleep(0.5)
    raise TrialError(f"the peer printed no peer id within {timeout_s:.0f}s:\n{log.read_text()[-3000:]}")


def saved_state(machine: Machine, coordinator_round: int | None) -> dict:
    """The --resume state file beside the volunteer's key, as the restarted peer will find it: its
    name and the round it holds (read with the clone's own checkpoint module), and the swarm's round."""
    files = sorted((machine.home / ".swarmloco").glob("peer-*.state"))
    if not files:
        return {"file": None, "round": None, "coordinator_round": coordinator_round}
    read = subprocess.run([str(machine.clone / ".venv/bin/python"), "-c", "import sys; from peer.run import checkpoint; "
                           "print(checkpoint.load(sys.argv[1]).round)", str(files[0])], cwd=machine.home, env=machine.env(),
                          capture_output=True, text=True, timeout=120)
    held = int(read.stdout.strip()) if read.returncode == 0 and read.stdout.strip().isdigit() else None
    return {"file": f"~/.swarmloco/{files[0].name}", "round": held, "coordinator_round": coordinator_round}


def watch(machine: Machine, endpoint: str, short_id: str, until_round: int, timeout_s: float, t0: float,
          process: subprocess.Popen, log: Path) -> tuple[str, list[dict]]:
    """Poll status until the peer's last_round reaches until_round; (full peer id, snapshots)."""
    seen: list[dict] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = machine.status(endpoint)
        rows = [p for p in (status or {}).get("peers", []) if p["peer_id"].startswith(short_id)]
        if rows:
            seen.append(snapshot(status, rows[0], t0))
            if rows[0]["last_round"] >= until_round:
                return rows[0]["peer_id"], seen
        if process.poll() is not None:
            raise TrialError(f"the peer exited ({process.returncode}):\n{log.read_text()[-3000:]}")
        time.sleep(2)
    raise TrialError(f"the peer did not reach round {until_round} within {timeout_s:.0f}s; last seen {seen[-1:]}")


def trial(clone: Path, workdir: Path, commands: dict[str, str], *, rounds_before: int, rounds_after: int) -> dict:
    from netns_testbed import Testbed

    bed = Testbed(2, rate_mbit=0, rtt_ms=0)
    t0 = time.monotonic()
    try:
        bed.up()
        coord = Machine(bed, 0, clone, workdir / "home-coordinator")
        volunteer = Machine(bed, 1, clone, workdir / "home-volunteer")
        coordinator_line = commands["coordinator"].replace(COORD_EXAMPLE_IP, coord.ip)
        coordinator = coord.start(coordinator_line, workdir / "coordinator.log")
        from wan_emulation import wait_for_maddr

        maddr = wait_for_maddr(workdir / "coordinator.log", coordinator, coord.ip, 180)
        endpoint = f"{coord.ip}:31338"
        join_line = MADDR_EXAMPLE.sub(maddr, commands["join"]).replace(PEER_EXAMPLE_IP, volunteer.ip)
        if maddr not in join_line or volunteer.ip not in join_line:
            raise TrialError(f"the README's join line no longer has the placeholders this trial fills in:\n{commands['join']}")
        runs = []
        for attempt, rounds in enumerate((rounds_before, rounds_after)):
            log = workdir / f"peer-{attempt + 1}.log"
            start_status = coord.status(endpoint) or {}
            base = (peer_row(start_status, runs[0]["peer_id"]) or {}).get("last_round", -1) if runs else -1
            saved = saved_state(volunteer, start_status.get("round"))
            process = volunteer.start(join_line, log)
            short = peer_id_from(log, 300, process)
            peer_id, seen = watch(volunteer, endpoint, short, base + rounds, 600, t0, process, log)
            process.send_signal(signal.SIGINT)  # the volunteer's Ctrl+C (bash -c execs the one command)
            try:
                code = process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                code = None
            text = log.read_text()
            runs.append({"peer_id": peer_id, "snapshots": seen, "exit_code": code, "last_round_before": base, "saved_state": saved,
                         "started_fresh": "starting fresh" in text, "resync_lines": [line for line in text.splitlines() if "RESYNC" in line],
                         "log_tail": text.splitlines()[-6:]})
        final = coord.status(endpoint) or {}
        return {"coordinator_command": coordinator_line, "join_command": join_line, "initial_peers": maddr,
                "coordinator_ip": coord.ip, "volunteer_ip": volunteer.ip, "runs": runs,
                "coordinator_round_at_end": final.get("round"), "coordinator_log_tail": (workdir / "coordinator.log").read_text().splitlines()[-4:],
                "trial_s": round(time.monotonic() - t0, 1)}
    finally:
        bed.close()


def verdicts(result: dict) -> dict[str, bool]:
    first, again = result["runs"]
    counted = [s for run in result["runs"] for s in run["snapshots"] if s["last_round"] >= 0]
    return {
        "the peer trained and counted (listed, last_round advancing)": len({s["last_round"] for s in first["snapshots"]}) >= 2,
        "never excluded or banned while listed": all(not s["excluded"] and not s["banned"] for s in counted),
        "its hash was the coordinator's at the last look of each run": all(run["snapshots"][-1]["hash_matches"] for run in result["runs"]),
        "the re-run of the same line is the same peer id": first["peer_id"] == again["peer_id"],
        "the re-run found its saved state at the swarm's round (no 'starting fresh', no RESYNC)": (
            again["saved_state"]["file"] is not None and again["saved_state"]["round"] == again["saved_state"]["coordinator_round"]
            and not again["started_fresh"] and not again["resync_lines"]),
        "the re-run counted again (last_round past where it stopped)": again["snapshots"][-1]["last_round"] > again["last_round_before"] >= 0,
        "Ctrl+C stopped the peer cleanly (exit 0 or 130)": all(run["exit_code"] in (0, 130) for run in result["runs"]),
    }


def render(run: dict, source: str) -> str:
    r = run["trial"]
    lines = [TRIAL_MARK, "## Last trial", "",
             f"Written by `scripts/join_netns.py` from `{source}` (commit {run['commit']}, {run['finished_at']}; "
             f"install {run['install_s']:.0f} s, trial {r['trial_s']:.0f} s). Two namespaces on one bridge, no shaping: "
             f"coordinator at {r['coordinator_ip']}, volunteer at {r['volunteer_ip']}; torch {run['torch']} (CPU) installed first.", "",
             "What ran, from the fresh clone (the README's lines, placeholders filled in):", "", "```",
             *run["install_commands"], "", "# machine 1", r["coordinator_command"], "", "# machine 2, twice (the second after Ctrl+C)",
             r["join_command"], "```", "", "What `swarmloco status --json` showed of the volunteer (round = the coordinator's):", "",
             "| run | peer id | t (s) | coordinator round | peer last_round | state | excluded / banned | hash = coordinator's |",
             "|---|---|---:|---:|---:|---|---|---|"]
    for i, one in enumerate(r["runs"]):
        for s in one["snapshots"]:
            lines.append(f"| {i + 1} | {one['peer_id'][:8]} | {s['t_s']:.0f} | {s['round']} | {s['last_round']} | {s['state']} | "
                         f"{s['excluded'] or s['banned'] or '-'} | {'yes' if s['hash_matches'] else 'no'} |")
    lines += ["", "Checks:"] + [f"- {name}: **{'yes' if ok else 'NO'}**" for name, ok in run["verdicts"].items()]
    for i, one in enumerate(r["runs"]):
        st = one["saved_state"]
        state = (f"state file {st['file']} holding round {st['round']} (coordinator at round {st['coordinator_round']})" if st["file"]
                 else "no state file yet")
        lines += ["", f"Run {i + 1}: {state} at its start; {len(one['resync_lines'])} RESYNC lines"
                  f"{'; warned starting fresh' if one['started_fresh'] else ''}; exit code {one['exit_code']} after Ctrl+C. Its last lines:",
                  "", "```", *one["log_tail"], "```"]
    return "\n".join(lines) + "\n"


def write_doc(run: dict, source: str, path: Path = DOC) -> None:
    """Replace the doc's trial section (from TRIAL_MARK on) with the one made from `run`."""
    text = path.read_text() if path.exists() else ""
    head = text.split(TRIAL_MARK, 1)[0].rstrip("\n") if text else "# Joining from another machine"
    path.write_text(head + "\n\n" + render(run, source))


def source_name(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return path.name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clone", help="an installed clone to use (its .venv has swarmloco) instead of a fresh one")
    parser.add_argument("--rounds-before", type=int, default=2, help="rounds the peer counts before Ctrl+C")
    parser.add_argument("--rounds-after", type=int, default=2, help="rounds it counts after the same line is run again")
    parser.add_argument("--keep-clone", action="store_true", help="keep the fresh clone and its .venv (about 1 GB) after the trial")
    parser.add_argument("--json", default=str(ROOT / "docs/join-trial.json"))
    parser.add_argument("--report-only", metavar="JSON", help="rewrite docs/join-trial.md's trial section from a JSON; run nothing")
    args = parser.parse_args(argv)
    if args.report_only:
        write_doc(json.loads(Path(args.report_only).read_text()), source_name(Path(args.report_only)))
        return 0
    from netns_testbed import namespaces_permitted

    reason = namespaces_permitted()
    if reason:
        print(f"join_netns: cannot build the two machines here: {reason}. Nothing was run.", file=sys.stderr)
        return 2
    commands = readme_commands((ROOT / "README.md").read_text())
    workdir = Path(tempfile.mkdtemp(prefix="swarmloco-join-"))
    if args.clone:
        clone, install_s = Path(args.clone).resolve(), 0.0
    else:
        print(f"join_netns: cloning and installing into {workdir / 'clone'} ...", flush=True)
        clone, install_s = fresh_install(workdir, commands["install"])
    if not (clone / ".venv/bin/swarmloco").exists():
        print(f"join_netns: {clone}/.venv/bin/swarmloco is missing: install the clone first (README) or drop --clone", file=sys.stderr)
        return 2
    result = trial(clone, workdir, commands, rounds_before=args.rounds_before, rounds_after=args.rounds_after)
    head = subprocess.run(["git", "-C", str(clone), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    torch = subprocess.run([str(clone / ".venv/bin/python"), "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True).stdout.strip()
    run = {"trial": result, "commit": head, "torch": torch, "install_s": install_s, "fresh_clone": not args.clone,
           "install_commands": [f"git clone -q {ROOT} clone && cd clone", "python3 -m venv .venv",
                                f".venv/bin/pip install -q torch=={torch_version()}   # the CPU build, before the project (CPU-only machine)",
                                commands["install"].replace("python3 -m venv .venv && ", "")] if not args.clone else [f"# an installed clone: {clone}"],
           "finished_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    run["verdicts"] = verdicts(result)
    Path(args.json).write_text(json.dumps(run, indent=2))
    write_doc(run, source_name(Path(args.json)))
    if not args.clone and not args.keep_clone:
        shutil.rmtree(clone, ignore_errors=True)
    for name, ok in run["verdicts"].items():
        print(f"join_netns | {name}: {'yes' if ok else 'NO'}")
    print(f"wrote {args.json} and {DOC} (logs in {workdir})")
    return 0 if all(run["verdicts"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
