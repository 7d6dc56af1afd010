"""benchmarks/scale.md's scale-lab section (issue 24), from the "lab_runs" scripts/scale_lab.py stores:
the table, the targets, the coordinator's CPU per round against n, and what a peer's received bytes
are made of at each n (by RPC from its ledger, and the FetchPayload part by purpose).

A pure function of the JSON (scripts/scale_report.py calls it); imports nothing from the measurement.
"""

from __future__ import annotations

import math
import statistics

CONTROL_RPCS = ("GetManifest", "GetSliceResults", "GetRunInfo", "Heartbeat", "Join", "SubmitCommitment",
                "SubmitSliceResult", "ReportGathered")


def _kb(x: float) -> str:
    return f"{x / 1e3:,.0f}" if x == x else "-"


def control_share(r: dict) -> float:
    control = (r.get("control_received_mean") or 0.0) + (r.get("control_sent_mean") or 0.0)
    total = r["received_mean"] + r["sent_mean"]
    return control / total if total == total and total > 0 else float("nan")


def _counted(r: dict) -> list[dict]:
    return [row for row in r.get("rows", []) if row["round"] >= r["skip_rounds"]]


def coordinator_worst_round(r: dict) -> float:
    """The coordinator's bytes in its heaviest counted round, in fp32 models (summed from the peers'
    ledgers as the mean is: every peer's control both ways and what it served the coordinator)."""
    per_round: dict[int, float] = {}
    for row in _counted(r):
        per_round[row["round"]] = per_round.get(row["round"], 0.0) + (
            row["control_sent"] + row["control_received"] + row["to_coordinator_sent"] + row["to_coordinator_received"])
    return max(per_round.values()) / (4 * r["numel"]) if per_round else math.nan


def received_by_rpc(r: dict) -> dict[str, float]:
    """Mean bytes a peer received per counted round, by the RPC it called (its ledger)."""
    rows = _counted(r)
    out: dict[str, float] = {}
    for row in rows:
        for rpc, (_, received) in row["by_method"].items():
            if not rpc.startswith("served:"):
                out[rpc] = out.get(rpc, 0.0) + received / len(rows)
    return out


def fetched_by_purpose(r: dict) -> dict[str, float]:
    """A peer's FetchPayload bytes per round split by what they were for, from its history's slice
    counts (slices are near-equal, P/S and A/S each): the inputs of the slices it owns ((n−1)·P/S
    each), the inputs of those it recomputed (spot checks, disputes: (n−1)·P/S each) and the
    results it gathered (A/S for each slice it neither owns nor recomputed)."""
    rows, n, S = _counted(r), r["peers"], r["slices"]
    P, A = r["payload_bytes"], r["result_bytes"]

    def mean(f) -> float:
        return statistics.fmean(f(row) for row in rows) if rows else math.nan

    return {"owned inputs": mean(lambda row: row["owned"] * (n - 1) * P / S),
            "recomputed inputs": mean(lambda row: row["recomputed"] * (n - 1) * P / S),
            "gathered results": mean(lambda row: (S - row["owned"] - row["recomputed"]) * A / S)}


def cpu_exponent(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of log(CPU per round) against log(n): 1 = linear."""
    pts = [(math.log(n), math.log(c)) for n, c in points if c > 0]
    if len(pts) < 2:
        return math.nan
    mx, my = statistics.fmean(x for x, _ in pts), statistics.fmean(y for _, y in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)


def lab_lines(data: dict, machine_lines) -> list[str]:
    runs = sorted(data.get("lab_runs") or [], key=lambda r: (r["codec"], r["peers"]))
    if not runs:
        return []
    lines = ["## Scale lab: dozens of real peers, several peer nodes per process (issue 24)", "",
             "Written by `scripts/scale_lab.py` (method in its docstring). A coordinator process (with its DHT node, as always)",
             "and ceil(n / nodes-per-process) lab processes, each running its nodes one thread each through the peer's own",
             "entry point (`swarmloco peer`'s options, join, rounds, summary): every node has its own identity, gRPC server,",
             "channels and transport ledger. The nodes dial the coordinator directly (`--coordinator HOST:PORT",
             "--coordinator-key FINGERPRINT`): the DHT is left out, since it is not what the lab measures (the storm rows",
             "above measure joins through it). Figures are over every (peer, round) after the first round, as above.",
             "coordinator CPU = user + system CPU seconds of the coordinator process between two round closes (read from",
             "/proc when it prints the close), mean over the counted rounds; 'with DHT' adds its DHT process and p2pd.",
             "round s = wall time between two closes. The machine's cores are shared with other jobs (load in each row):",
             "bytes do not depend on it, CPU seconds little, wall times do.", ""]
    for inv in data.get("lab_invocations", []):
        lines += [*machine_lines(inv.get("machine"), inv["load_before"], inv["load_after"]), f"- command: `{inv['command']}`", ""]
    lines += ["| codec | S | r | k (coverage) | H | rounds | n | processes x nodes | joined | rounds closed | received mean (median) KB | "
              "vs smallest n | control share | coordinator KB/round | = fp32 models | heaviest round, fp32 models | coordinator CPU s/round (with DHT) | "
              "CPU ms per peer | round s | memory taken GiB | load before -> after | every peer joined, every round in sync |",
              "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---|---|"]
    for codec in dict.fromkeys(r["codec"] for r in runs):
        group = [r for r in runs if r["codec"] == codec]
        base = next((r for r in group if r["ok"]), None)
        for r in group:
            k = r["nodes_per_process"]
            processes = math.ceil(r["peers"] / k)
            vs = f"{r['received_mean'] / base['received_mean']:.2f}x" if base and r["ok"] else "-"
            cpu, tree = r.get("coordinator_cpu_s_per_round", math.nan), r.get("coordinator_tree_cpu_s_per_round", math.nan)
            lines.append(
                f"| {codec} | {r['slices']} | {r['replicas']} | {r['spot_checks']} ({r.get('spot_check_coverage', 2.0):g}) | {r['inner_steps']} | {r['rounds']} | {r['peers']} | "
                f"{processes} x {min(k, r['peers'])} | {r['peers_joined']} | {r['rounds_done']} | {_kb(r['received_mean'])} "
                f"({_kb(r['received_median'])}) | {vs} | {control_share(r) * 100:.1f}% | {_kb(r['coordinator_bytes_per_round'])} | "
                f"{r['coordinator_bytes_per_round'] / (4 * r['numel']):.2f} | {coordinator_worst_round(r):.2f} | {cpu:.2f} ({tree:.2f}) | {cpu / r['peers'] * 1e3:.0f} | "
                f"{r.get('round_wall_s', math.nan):.1f} | {r['memory_taken_gib']} | {r['load_before']} -> {r['load_after']} | "
                f"{'yes' if r['ok'] else 'NO: ' + '; '.join(r['problems'])[:600]} |")
    lines += ["", *_what_grows(runs), *_targets(runs)]
    return lines + [""]


def _what_grows(runs: list[dict]) -> list[str]:
    ok = [r for r in runs if r["ok"]]
    if not ok:
        return []
    rpcs = sorted({rpc for r in ok for rpc in received_by_rpc(r)}, key=lambda rpc: (rpc in CONTROL_RPCS, rpc))
    lines = ["What a peer receives per round, KB (mean over peers and counted rounds), by the RPC it called (its ledger),",
             "and its FetchPayload bytes by purpose (from its slice counts: owned slices' n − 1 inputs, recomputed slices'",
             "n − 1 inputs (spot checks, disputes), the other slices' results):", "",
             "| codec | n | " + " | ".join(rpcs) + " | owned inputs | recomputed inputs | gathered results | recomputed slices per peer |",
             "|---|---:|" + "---:|" * (len(rpcs) + 4)]
    for r in ok:
        by_rpc, purpose = received_by_rpc(r), fetched_by_purpose(r)
        recomputed = statistics.fmean(row["recomputed"] for row in _counted(r))
        lines.append(f"| {r['codec']} | {r['peers']} | " + " | ".join(_kb(by_rpc.get(rpc, 0.0)) for rpc in rpcs) + " | "
                     + " | ".join(_kb(purpose[p]) for p in ("owned inputs", "recomputed inputs", "gathered results"))
                     + f" | {recomputed:.2f} |")
    return lines + [""]


def byte_targets(codec: str, ok: list[dict]) -> list[str]:
    """Issue 24's byte targets over the rows that ended in sync (smallest n first): received per
    peer at 48 (and at the largest n) against the smallest n, the control share, the coordinator's bytes."""
    lines, lo = [], ok[0]
    at48 = next((r for r in ok[1:] if r["peers"] == 48), None)
    for r in ([at48] if at48 else []) + ([ok[-1]] if len(ok) > 1 and ok[-1] is not at48 else []):
        ratio = r["received_mean"] / lo["received_mean"]
        lines.append(f"- {codec}: received per peer at {r['peers']} / at {lo['peers']} peers ≤ 1.8x: "
                     f"**{'reached' if ratio <= 1.8 else 'NOT reached'}**, {ratio:.2f}x")
    worst = max(ok, key=control_share)
    lines.append(f"- {codec}: control ≤ 5% of a peer's bytes at every n: **{'reached' if control_share(worst) <= 0.05 else 'NOT reached'}** "
                 f"(largest {control_share(worst) * 100:.1f}% at n = {worst['peers']})")
    heavy = max(ok, key=lambda r: r["coordinator_bytes_per_round"] / (4 * r["numel"]))
    models = heavy["coordinator_bytes_per_round"] / (4 * heavy["numel"])
    lines.append(f"- {codec}: the coordinator's bytes per round ≤ 2 fp32 models: **{'reached' if models <= 2 else 'NOT reached'}** "
                 f"(largest {models:.2f} at n = {heavy['peers']})")
    worst = max(ok, key=coordinator_worst_round)
    lines.append(f"- {codec}: ... and in every round (the heaviest counted round of each row, the coordinator's own spot-check rounds "
                 f"included): **{'reached' if coordinator_worst_round(worst) <= 2 else 'NOT reached'}** (largest "
                 f"{coordinator_worst_round(worst):.2f} at n = {worst['peers']}; within 2 at n = "
                 f"{', '.join(str(r['peers']) for r in ok if coordinator_worst_round(r) <= 2) or 'none'})")
    return lines


def _targets(runs: list[dict]) -> list[str]:
    lines = ["Targets (issue 24), from the lab rows:", ""]
    for codec in dict.fromkeys(r["codec"] for r in runs):
        group = [r for r in runs if r["codec"] == codec]
        ok = [r for r in group if r["ok"]]
        failed = [r for r in group if not r["ok"]]
        lines.append(f"- {codec}: every peer joined and every round closed with every peer in sync at n = "
                     f"{', '.join(str(r['peers']) for r in ok) or 'none'}"
                     + (f"; NOT at n = {', '.join(str(r['peers']) for r in failed)} (see the row)" if failed else ""))
        if len(ok) < 2:
            continue
        lines += byte_targets(codec, ok)
        lines.append(cpu_growth_target(codec, ok))
    return lines


def cpu_growth_target(codec: str, ok: list[dict]) -> str:
    """The target line 'the coordinator's CPU per round grows at most linearly in n' over the rows
    `ok` (sorted by n, at least two, each with its coordinator_cpu_s_per_round)."""
    lo = ok[0]
    points = [(r["peers"], r["coordinator_cpu_s_per_round"]) for r in ok]
    worst_growth = max(ok[1:], key=lambda r: (r["coordinator_cpu_s_per_round"] / lo["coordinator_cpu_s_per_round"]) / (r["peers"] / lo["peers"]))
    growth = worst_growth["coordinator_cpu_s_per_round"] / lo["coordinator_cpu_s_per_round"]
    linear = all(r["coordinator_cpu_s_per_round"] / lo["coordinator_cpu_s_per_round"] <= r["peers"] / lo["peers"] for r in ok[1:])
    return (f"- {codec}: the coordinator's CPU per round grows at most linearly in n: **{'reached' if linear else 'NOT reached'}** "
            f"({', '.join(f'{c:.2f} s at n = {n}' for n, c in points)}; closest to linear: {growth:.2f}x from "
            f"{lo['peers']} to {worst_growth['peers']} peers, {worst_growth['peers'] / lo['peers']:.0f}x the peers; "
            f"log-log slope {cpu_exponent(points):.2f})")
