"""The verdicts of a chaos record (scripts/chaos.py's JSON) and benchmarks/chaos.md, both pure
functions of it: the same JSON gives the same verdicts and the same bytes on any machine.

Invariants (DESIGN.md "Chaos"):
- every round closed, and no round number closed with two different hashes (both coordinators'
  run logs together);
- the longest gap between two consecutive round closes is within the lease (the largest any
  active coordinator's status reported, it adapts; the configured floor beside it) plus two
  median gaps;
- after every round every honest peer holds the coordinator's hash: each peer's own record of
  the round (its hash after applying it against the coordinator's signed one, `in_sync`) agrees,
  except where the peer's own fault lets it fall behind and resync (`excused_rounds`), and no
  Status report shows a hash no coordinator held; every honest peer's last process finished on
  the final hash;
- every liar banned with evidence, no honest peer banned;
- the final validation loss within 5% of the same run without faults;
- nothing left running, no port still listened on, the namespace and the cgroup gone.
"""

from __future__ import annotations

import statistics

LOSS_TOLERANCE = 0.05


def _check(name: str, ok: bool, detail: str) -> dict:
    return {"name": name, "ok": bool(ok), "detail": detail}


def round_gaps(rounds: list[dict]) -> list[tuple[int, float]]:
    """(round, seconds since the previous round closed) for each round after the first."""
    closed = sorted((r["round"], r["time"]) for r in rounds if r.get("time") is not None)
    return [(b[0], b[1] - a[1]) for a, b in zip(closed, closed[1:])]


def unknown_hash_reports(run: dict) -> list[dict]:
    """Peer reports (Status) of a hash no coordinator ever held: a peer off the run's history. (A
    report may lag: Status pairs the round a peer's update last counted in with the hash of its
    last heartbeat, so an older hash of the run is no fault.)"""
    known = {h for r in run["rounds"] for h in r.get("hashes", [])} | set(run.get("coordinator_hashes", []))
    return [x for x in run["reports"] if x["param_hash"] not in known]


def excused_rounds(result: dict, process: str, history: list[list]) -> set[int]:
    """Rounds in which a peer's own fault lets it be behind the coordinator (then it resyncs):
    a restarted process's first two rounds, the partitioned peer's window and the straggler's
    throttle window (each plus 2 rounds to catch up)."""
    schedule, base = result.get("schedule", {}), incarnation_of(process)
    rounds = [r for r, _ in history]
    out: set[int] = set(rounds[:2]) if process != base else set()
    window = {"partitioned": schedule.get("partition"), "straggler": schedule.get("throttle")}.get(base)
    if window:
        out |= set(range(window[0], window[1] + 3))
    return out


def out_of_sync(result: dict) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """(excused, not excused): (process, round) of the honest peers' own records whose hash after
    the round differed from the coordinator's signed one (the peer then resyncs)."""
    who = roles(result)
    excused, not_excused = [], []
    for name, p in result["chaos"]["final"].get("peers", {}).items():
        if who.get(incarnation_of(name)) != "honest":
            continue
        allowed = excused_rounds(result, name, p.get("in_sync", []))
        for r, ok in p.get("in_sync", []):
            if not ok:
                (excused if r in allowed else not_excused).append((name, r))
    return excused, not_excused


def roles(result: dict) -> dict[str, str]:
    from_schedule = result.get("schedule", {})
    out = {}
    for name in result["chaos"]["peer_ids"]:
        role = {"attacker": "attacker" if from_schedule.get("attacker") else "honest",
                "liar": "liar" if from_schedule.get("liar") else "honest"}.get(name, "honest")
        out[name] = role
    return out


def exit_text(rc: int | None) -> str:
    return "still running a minute after the run ended" if rc is None else f"exit status {rc}"


def lease_at(run: dict, t: float, floor: float) -> float:
    """The lease an active coordinator's status reported last at or before `t` (s since start)."""
    seen = [lease for when, lease, _ in run.get("leases", []) if when <= t]
    return seen[-1] if seen else floor


def incarnation_of(name: str) -> str:
    """'churner-r2' -> 'churner': the peer a restarted process is."""
    return name.split("-r")[0]


def final_loss(run: dict) -> float | None:
    if run.get("finished", {}).get("val_loss") is not None:
        return run["finished"]["val_loss"]
    losses = [r.get("val_loss") for r in sorted(run["rounds"], key=lambda r: r["round"]) if r.get("val_loss") is not None]
    return losses[-1] if losses else None


def verdicts(result: dict) -> dict:
    run, rounds_wanted = result["chaos"], result["config"]["rounds"]
    by_round = {r["round"]: r for r in run["rounds"]}
    checks = []
    missing = [r for r in range(rounds_wanted) if r not in by_round]
    forked = sorted(r for r, x in by_round.items() if len(x["hashes"]) > 1)
    checks.append(_check("every round closed", not missing and not forked,
                         f"{len(by_round)}/{rounds_wanted} closed; missing {missing or 'none'}; closed with two hashes {forked or 'none'}"))

    gaps = round_gaps(run["rounds"])
    median = statistics.median(g for _, g in gaps) if gaps else 0.0
    floor = result["config"]["lease_s"]
    over = [(r, g, lease_at(run, by_round[r - 1]["time"], floor)) for r, g in gaps]
    over = [(r, g, lease) for r, g, lease in over if g > lease + 2 * median]
    worst = max(gaps, key=lambda x: x[1]) if gaps else (None, 0.0)
    worst_lease = lease_at(run, by_round[worst[0] - 1]["time"], floor) if gaps else floor
    checks.append(_check("longest gap between round closes", bool(gaps) and not over,
                         f"{worst[1]:.1f} s before round {worst[0]} vs lease {worst_lease:.1f} s (in force then; floor {floor:g} s) "
                         f"+ 2 x median gap {median:.2f} s = {worst_lease + 2 * median:.1f} s; over their bound: "
                         + (", ".join(f"round {r} ({g:.1f} s vs {lease + 2 * median:.1f} s)" for r, g, lease in over) or "none")))

    unknown = unknown_hash_reports(run)
    excused, not_excused = out_of_sync(result)
    records = sum(len(p.get("in_sync", [])) for p in run["final"].get("peers", {}).values())
    checks.append(_check("every peer on the coordinator's hash after every round", not unknown and not not_excused and records > 0,
                         f"{records} per-round records of the peers' own hash check, out of sync outside their fault window: "
                         + (", ".join(f"{n} round {r}" for n, r in not_excused[:10]) or "none")
                         + f"; inside it (then resynced): {len(excused)}; {len(run['reports'])} Status reports, of a hash no coordinator held: "
                         + (", ".join(f"{x['peer']} round {x['round']}" for x in unknown[:8]) or "none")))
    final_hash = run["final"].get("final_hash")
    who = roles(result)
    last: dict[str, tuple[str, dict]] = {}  # each peer's last process (a restarted one's earlier ones were killed)
    for n, p in run["final"].get("peers", {}).items():
        last[incarnation_of(n)] = (n, p)
    honest_last = {base: x for base, x in last.items() if who.get(base) == "honest"}
    not_clean = sorted(n for n, p in honest_last.values() if p.get("rc") != 0)
    wrong_end = sorted(n for n, p in honest_last.values() if p.get("rc") == 0 and p.get("param_hash") != final_hash)
    checks.append(_check("every honest peer finished on the final hash", bool(honest_last) and not not_clean and not wrong_end and final_hash,
                         f"{len(honest_last) - len(not_clean) - len(wrong_end)}/{len(honest_last)} honest peers' last processes exited 0 "
                         f"on {str(final_hash)[:12]}; on another hash: {wrong_end or 'none'}; did not finish: "
                         + (", ".join(f"{n} ({exit_text(honest_last[incarnation_of(n)][1].get('rc'))})" for n in not_clean) or "none")))

    bans = run["final"].get("bans", {})
    ids = run["peer_ids"]
    liars = [n for n, role in who.items() if role == "liar"]
    unbanned = [n for n in liars if not (bans.get(ids[n], {}).get("reason") and bans.get(ids[n], {}).get("evidence"))]
    honest_banned = [n for n, role in who.items() if role == "honest" and ids[n] in bans]
    checks.append(_check("every liar banned with evidence, no honest peer banned", not unbanned and not honest_banned,
                         f"liars {liars or 'none'}: not banned with evidence {unbanned or 'none'}; honest banned {honest_banned or 'none'}; "
                         + "; ".join(f"{n}: {bans[ids[n]]['reason']} ({', '.join(bans[ids[n]]['evidence'])})" for n in liars if ids[n] in bans)))

    base = result.get("baseline")
    chaos_loss, base_loss = final_loss(run), final_loss(base) if base else None
    if chaos_loss is None or base_loss is None:
        checks.append(_check("final loss within 5% of the fault-free run", False, f"chaos {chaos_loss}, fault-free {base_loss}: not both measured"))
    else:
        rel = (chaos_loss - base_loss) / base_loss
        checks.append(_check("final loss within 5% of the fault-free run", abs(rel) <= LOSS_TOLERANCE,
                             f"{chaos_loss:.4f} vs {base_loss:.4f} ({rel:+.2%})"))

    for label, r in (("chaos", run), ("fault-free", base)):
        if not r:
            continue
        f = r["final"]
        clean = not f.get("left_running") and not f.get("ports_left") and not f.get("netns_left") and not f.get("cgroup_left")
        checks.append(_check(f"nothing left running or listening ({label} run)", clean,
                             f"{len(f.get('left_running', {}))} processes left {list(f.get('left_running', {}).values())[:3]}; "
                             f"{f.get('ports_seen', 0)} ports seen, still listened on: {f.get('ports_left') or 'none'}; "
                             f"namespace left: {bool(f.get('netns_left'))}; cgroup left: {bool(f.get('cgroup_left'))}"))
    return {"ok": all(c["ok"] for c in checks), "checks": checks, "median_gap_s": median}


def round_rows(result: dict) -> list[str]:
    run = result["chaos"]
    planned: dict[int, list[str]] = {}
    for r, what in result["schedule"].get("events", []):
        planned.setdefault(r, []).append(what)
    who = roles(result)
    synced: dict[int, list[bool]] = {}
    for name, p in run["final"].get("peers", {}).items():
        if who.get(incarnation_of(name)) == "honest":
            for r, ok in p.get("in_sync", []):
                synced.setdefault(r, []).append(ok)
    gaps = dict(round_gaps(run["rounds"]))
    rows = ["| round | closed at (s) | gap (s) | hash | updates | excluded | honest peers in / out of sync | planned fault |",
            "|---:|---:|---:|---|---:|---|---|---|"]
    for r in sorted(run["rounds"], key=lambda x: x["round"]):
        got = synced.get(r["round"], [])
        on = sum(got)
        hashes = " / ".join(h[:12] for h in r["hashes"])
        gap = f"{gaps[r['round']]:.1f}" if r["round"] in gaps else ""
        closed = f"{r['time']:.1f}" if r.get("time") is not None else "?"
        rows.append(f"| {r['round']} | {closed} | {gap} | `{hashes}` | {r.get('updates', '')} | {len(r.get('excluded') or [])} | "
                    f"{on} / {len(got) - on} | {'; '.join(planned.get(r['round'], []))} |")
    return rows


def event_line(event: dict) -> str:
    when = "" if event["round"] is None or event["round"] < 0 else f" (the watcher had read round {event['round']}'s close)"
    return f"- +{event['time']:.1f} s{when}: {event['what']}"


def render(result: dict) -> str:
    from scripts.machine_info import machine_lines

    v = verdicts(result)
    c = result["config"]
    run = result["chaos"]
    lines = ["# Chaos: churn, a straggler, a partition, an attacker, a liar and a dying coordinator in one run", "",
             f"Written by `scripts/chaos.py` from its JSON (`{result.get('command', '')}`); regenerate with "
             "`scripts/chaos.py report --json benchmarks/chaos.json --md benchmarks/chaos.md`.", "",
             f"How it ran: tiny byte-level GPT (tests/helpers.py TINY_SECTIONS), {c['rounds']} rounds of H = {c['inner_steps']}, "
             f"seed {c['seed']}, codec fp16, outer nesterov, aggregator median, sliced exchange (the run defaults); "
             f"{len(run['peer_ids'])} peers ({', '.join(run['peer_ids'])}), an active coordinator{' and one standby' if c.get('standby', True) else ' (no standby)'}, lease floor {c['lease_s']:g} s, "
             f"peer timeout {c['peer_timeout_s']:g} s, straggler quota {c['throttle_fraction']:.0%} of a core; "
             f"partition {'through a network namespace link' if result.get('netns') else 'NOT run (--no-netns)'}. "
             "The fault-free run: the same seed and topology, every peer honest, no schedule.", "",
             "## Machine", "", *machine_lines(result.get("machine"), result.get("load_before"), result.get("load_after")), "",
             "## Verdicts", "", "| invariant | verdict | measured |", "|---|---|---|"]
    lines += [f"| {x['name']} | {'pass' if x['ok'] else '**FAIL**'} | {x['detail'].replace('|', '/')} |" for x in v["checks"]]
    lines += ["", f"Wall time: chaos run {run.get('wall_s', '?')} s"
              + (f", fault-free run {result['baseline'].get('wall_s', '?')} s" if result.get("baseline") else "") + ".", "",
              "## Schedule (seeded) and what happened", ""]
    lines += [f"- planned, round {r}: {what}" for r, what in result["schedule"].get("events", [])]
    kills = sum(e["what"].startswith("churner was SIGKILLed") for e in run["events"])
    planned = len(result["schedule"].get("churn_kills", []))
    lines += [f"- churn kills done: {kills} of {planned} planned (a restarted churner not yet back in the swarm at a planned "
              "round passes it by: its kill is a fault hook on that round's training)"]
    lines += [f"- takeover: {t['line']}" for t in run.get("takeovers", [])]
    lines += [""] + [event_line(e) for e in run["events"]]
    lines += ["", "## Every round", "", *round_rows(result)]
    return "\n".join(lines) + "\n"
