"""The verdicts of a chaos record (scripts/chaos.py's JSON) and benchmarks/chaos.md, both pure
functions of it: the same JSON gives the same verdicts and the same bytes on any machine.

Invariants (DESIGN.md "Chaos"):
- every round closed, and no round number closed with two different hashes (both coordinators'
  run logs together);
- the longest gap between two consecutive round closes is within the lease (the largest any
  active coordinator's status reported, it adapts; the configured floor beside it) plus two
  median gaps;
- every peer's reported hash for a round (Status: its last round and the hash it holds after it)
  is the coordinator's hash of that round; and every honest peer running at the end finished on
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


def off_hash_reports(run: dict) -> list[dict]:
    """Peer reports whose hash is not the coordinator's for that round."""
    hashes = {r["round"]: r["hashes"][0] for r in run["rounds"] if r.get("hashes")}
    return [x for x in run["reports"] if x["round"] in hashes and x["param_hash"] != hashes[x["round"]]]


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
    lease = max(run.get("leases") or [result["config"]["lease_s"]])
    bound = lease + 2 * median
    worst = max(gaps, key=lambda x: x[1]) if gaps else (None, 0.0)
    checks.append(_check("longest gap between round closes", bool(gaps) and worst[1] <= bound,
                         f"{worst[1]:.1f} s before round {worst[0]} vs lease {lease:.1f} s (floor {result['config']['lease_s']:g} s) "
                         f"+ 2 x median gap {median:.2f} s = {bound:.1f} s"))

    off = off_hash_reports(run)
    reporting = {x["round"] for x in run["reports"]}
    checks.append(_check("every peer on the coordinator's hash after every round", not off and bool(reporting),
                         f"{len(run['reports'])} peer reports over {len(reporting)} rounds; off the coordinator's hash: "
                         + (", ".join(f"{x['peer']} round {x['round']}" for x in off[:8]) or "none")))
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
    return {"ok": all(c["ok"] for c in checks), "checks": checks, "median_gap_s": median, "gap_bound_s": bound}


def round_rows(result: dict) -> list[str]:
    run = result["chaos"]
    planned: dict[int, list[str]] = {}
    for r, what in result["schedule"].get("events", []):
        planned.setdefault(r, []).append(what)
    reports: dict[int, list[dict]] = {}
    for x in run["reports"]:
        reports.setdefault(x["round"], []).append(x)
    gaps = dict(round_gaps(run["rounds"]))
    rows = ["| round | closed at (s) | gap (s) | hash | updates | excluded | peer reports on / off hash | planned fault |",
            "|---:|---:|---:|---|---:|---|---|---|"]
    for r in sorted(run["rounds"], key=lambda x: x["round"]):
        got = reports.get(r["round"], [])
        on = sum(x["param_hash"] == r["hashes"][0] for x in got)
        hashes = " / ".join(h[:12] for h in r["hashes"])
        gap = f"{gaps[r['round']]:.1f}" if r["round"] in gaps else ""
        closed = f"{r['time']:.1f}" if r.get("time") is not None else "?"
        rows.append(f"| {r['round']} | {closed} | {gap} | `{hashes}` | {r.get('updates', '')} | {len(r.get('excluded') or [])} | "
                    f"{on} / {len(got) - on} | {'; '.join(planned.get(r['round'], []))} |")
    return rows


def event_line(event: dict) -> str:
    when = "" if event["round"] is None or event["round"] < 0 else f" (round {event['round']} the last closed)"
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
             f"6 peers ({', '.join(run['peer_ids'])}), an active coordinator and one standby, lease floor {c['lease_s']:g} s, "
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
    lines += [""] + [event_line(e) for e in run["events"]]
    lines += ["", "## Every round", "", *round_rows(result)]
    return "\n".join(lines) + "\n"
