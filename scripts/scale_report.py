"""benchmarks/scale.md from the JSON scripts/measure_scale.py writes: tables, growth, targets, projection.

Imports nothing from the measurement (a report can be rewritten without a swarm):

    .venv/bin/python scripts/measure_scale.py --report-only --write-md
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "scripts") not in sys.path:
    sys.path.insert(0, str(ROOT / "scripts"))

from machine_info import machine_lines, write_keeping_notes  # noqa: E402
from scale_lab_report import byte_targets, control_share, cpu_growth_target, lab_lines  # noqa: E402

FORMULAS = [
    "- sliced, received ≈ r·(n−1)/m·P + (1 − r/m)·A + p·k·((n−1)·P − A)/S, p = min(1, coverage·S/(n·k)), coverage = 2 (0.5 since issue 24's bounded spot checks)",
    "  (p = 1 in every measured run below: n ≤ 64 at S = 32, k = 1)",
    "- sliced, sent ≈ (r − r/m)·P + (n − r + 1)/m·A + p·k·((n−1)·P − A)/S",
    "- all-to-all, received ≈ (n − 1)·P",
    "- coordinator, fetched ≈ A + p·k·(n·P − A)/S (sliced: gathers θ_{r+1}, spot-checks k slices; p = 1 before issue 24's sampling); n·P (all-to-all)",
]


def _kb(x: float) -> str:
    return f"{x / 1e3:,.0f}" if x == x else "-"  # NaN: nothing measured


def growth(runs: list[dict]) -> list[dict]:
    """Per (codec, exchange): the smallest and largest swarm's received bytes, measured and expected."""
    out = []
    for codec in dict.fromkeys(r["codec"] for r in runs):
        for mode in ("sliced", "all-to-all"):
            group = sorted((r for r in runs if r["codec"] == codec and r["mode"] == mode and r["ok"]), key=lambda r: r["peers"])
            if len(group) < 2:
                continue
            lo, hi = group[0], group[-1]
            no_spot = [r["expected_received"] - r.get("expected_spot", 0) for r in (lo, hi)]
            out.append({"codec": codec, "mode": mode, "small": lo["peers"], "large": hi["peers"],
                        "measured": hi["received_mean"] / lo["received_mean"],
                        "measured_median": hi["received_median"] / lo["received_median"],
                        "data": hi["data_received_mean"] / lo["data_received_mean"],
                        "expected": hi["expected_received"] / lo["expected_received"],
                        "expected_no_spot": no_spot[1] / no_spot[0]})
    return out


def target_lines(runs: list[dict]) -> list[str]:
    sliced = [r for r in runs if r["mode"] == "sliced" and r["ok"]]
    lines = ["## Targets (issue 10), from the rows above", ""]
    for g in growth(runs):
        if g["mode"] != "sliced":
            continue
        verdict = "reached" if g["measured"] <= 1.6 else "NOT reached"
        lines.append(f"- **{g['codec']}: received per peer at {g['large']} peers / at {g['small']} peers ≤ 1.6x: {verdict}**, "
                     f"{g['measured']:.2f}x (mean over peers and rounds; medians {g['measured_median']:.2f}x; data only "
                     f"{g['data']:.2f}x). The formula predicts {g['expected']:.2f}x, {g['expected_no_spot']:.2f}x without the spot checks.")
    for g in growth(runs):
        if g["mode"] == "all-to-all":
            lines.append(f"- {g['codec']} all-to-all for comparison: {g['measured']:.2f}x from {g['small']} to {g['large']} peers "
                         f"(formula {g['expected']:.2f}x).")
    if sliced:
        worst_total = max(sliced, key=lambda r: abs(r["received_vs_expected"] - 1))
        worst_data = max(sliced, key=lambda r: abs(r["data_received_vs_expected"] - 1))
        ok_total = abs(worst_total["received_vs_expected"] - 1) <= 0.10
        ok_data = abs(worst_data["data_received_vs_expected"] - 1) <= 0.10
        lines.append(f"- **measured within 10% of the formula: data {'reached' if ok_data else 'NOT reached'}** (worst: "
                     f"{worst_data['data_received_vs_expected']:.3f} at {worst_data['codec']} n = {worst_data['peers']}); "
                     f"**with the control traffic {'reached' if ok_total else 'NOT reached'}** (worst: "
                     f"{worst_total['received_vs_expected']:.3f} at {worst_total['codec']} n = {worst_total['peers']}).")
        worst = max(sliced, key=lambda r: r["coordinator_bytes_per_round"] / (4 * r["numel"]))
        models = worst["coordinator_bytes_per_round"] / (4 * worst["numel"])
        lines.append(f"- **coordinator ≤ ~2 models' worth per round at every n: {'reached' if models <= 2.0 else 'NOT reached'}**, "
                     f"at most {models:.2f} fp32 models = {worst['coordinator_bytes_per_round'] / worst['result_bytes']:.2f} "
                     f"aggregates A ({worst['codec']}, n = {worst['peers']}, {_kb(worst['coordinator_bytes_per_round'])} KB).")
    return lines + [""]


def projection_lines(data: dict) -> list[str]:
    proj = data.get("projection") or []
    if not proj:
        return []
    c0, c1 = data.get("control_fit", (0.0, 0.0))
    lab = [r for r in data.get("lab_runs", []) if r["ok"]]
    t0, t1 = data.get("control_fit_both_ways", (0.0, 0.0))
    cpu0, cpu1 = data.get("coordinator_cpu_fit") or (math.nan, math.nan)
    cpu = (f"Its CPU per round, fitted linearly on the lab's rows: {cpu0:.2f} s + {cpu1 * 1e3:.1f} ms·n (a shared 2-core machine; "
           f"the demo model): {cpu0 + cpu1 * 100:.1f} s at 100 peers, {cpu0 + cpu1 * 1000:.1f} s at 1,000. " if lab and cpu1 == cpu1 else "")
    coordinator = [f"The coordinator: n peers' control both ways (each ≈ {t0 / 1e3:,.1f} KB + {t1 / 1e3:,.3f} KB·n, fitted like the",
                   "control above: O(n) per peer, O(n²) in all: every peer fetches the signed manifest, n entries, from it) plus",
                   "what it fetches (θ_{r+1}'s slices A, and its k spot checks' n inputs: A + p·k·(n·P − A)/S, sampled with the",
                   "peers' probability p since issue 24, and only where control + A + k·(n − 1)·P/S fit 2 fp32 models:",
                   "peer/exchange/spot_budget.py; 'own check' says whether it does).",
                   f"{cpu}Its long-polls hold no thread (protocol/aio_server.py): 1,000 peers waiting for a manifest are",
                   "1,000 parked coroutines.", ""]
    control = ([f"control received per peer per round ≈ {c0 / 1e3:,.1f} KB + {c1 / 1e3:,.3f} KB·n, fitted on the scale lab's rows",
                f"(n = {', '.join(str(r['peers']) for r in lab)}, S = 32): O(n), one Merkle root per header and bitmaps for input sets;",
                "the signed results list (S·r results) is in the constant at S = 32 and not scaled with S here. Every peer"]
               if lab else
               [f"control received per peer per round ≈ {c0 / 1e3:,.1f} KB + {c1 / 1e3:,.2f} KB·n at S = 32, scaled as n·S/32",
                "beyond. The fit is over the formula table's runs, measured before Merkle-rooted headers (2e6b50a), when the",
                "manifest carried S slice hashes per update: an upper bound now that it carries one root (the storm rows",
                "below measure today's control share); signed results list no inputs since 8a8e606. Every peer"])
    lines = ["## Projection: 100 and 1,000 peers, 100 Mbit/s links", "",
             "From the largest sliced run of each codec: P and A per parameter as measured (the codec's payload, the",
             "result format), the formula above, and the control bytes fitted on the measured sliced runs:",
             *control,
             "serves (m = n). The busiest peer owns ceil(S·r/n) slices: it receives their n − 1 inputs and serves their",
             "result to n/r peers; time = the larger of its received and sent bytes at 100 Mbit/s (the mean peer:",
             "received bytes). All-to-all: (n − 1)·P received by every peer. Spot checks run with probability",
             "min(1, coverage·S/(n·k)) per peer and round, the coordinator's too (exchange.spot_check_coverage, default",
             "0.5 since issue 24: the swarm recomputes each slice about every other round), so their share stays below",
             "coverage·P per node however large n grows; the formula table's runs (n ≤ 12 at S = 32) ran with probability 1.", "",
             *coordinator,
             "| codec | model | peers | S | mean peer received | of which spot checks | of which control | mean peer time | busiest peer recv / sent | busiest peer time | all-to-all received | all-to-all time | coordinator | of which control | own check | = fp32 models |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for p in proj:
        lines.append(f"| {p['codec']} | {p['params'] / 1e6:,.0f}M | {p['peers']:,} | {p['slices']:,} | {p['sliced_bytes'] / 1e9:,.2f} GB | "
                     f"{p['spot_bytes'] / 1e9:,.2f} GB | {p['control_bytes'] / 1e6:,.2f} MB | {p['sliced_s']:,.0f} s | "
                     f"{p['busiest_received'] / 1e9:,.2f} / {p['busiest_sent'] / 1e9:,.2f} GB | {p['busiest_s']:,.0f} s | "
                     f"{p['all_to_all_bytes'] / 1e9:,.1f} GB | {p['all_to_all_s']:,.0f} s | "
                     f"{p['coordinator_bytes'] / 1e9:,.2f} GB | {p['coordinator_control_bytes'] / 1e6:,.0f} MB | "
                     f"{'yes' if p['coordinator_checks'] else 'no'} | {p['coordinator_models']:.2f} |")
    return lines + [""]


def storm_lines(data: dict) -> list[str]:
    """The swarms started at once through the DHT (issue 24): did every peer join and stay in sync,
    and how a peer's bytes, the control share and the coordinator's bytes grow with n."""
    runs = sorted(data.get("storm_runs") or [], key=lambda r: (r["codec"], _start(r) != "forked", r["peers"]))
    if not runs:
        return []
    lines = ["## Swarms started at once through the DHT (issue 24)", "",
             "Every peer started at the same instant, as `swarmloco demo` starts them (one process each, all bootstrapping",
             "from the coordinator's DHT node, each retrying its bootstrap, the run lookup and the first connection with",
             "backoff within --connect-timeout's default window); the run waits for all n (expected_peers = min_peers = n).",
             "start = how each process began: `forked` from one process that imported torch and hivemind once (what",
             "`swarmloco demo` does since session 28: the processes share those modules' memory), or `exec`, each a fresh",
             "Python (`--exec-processes`, and every row before session 28).",
             "A row is 'yes' when every peer printed its join, every round closed and every peer was in the manifest and in",
             "sync in every round. control share = a peer's traffic with the coordinator over all its traffic (sent +",
             "received). The machine is shared with other jobs: the load (1/5/15 min) before and after each row is in it.",
             "memory taken = how far the machine's available memory fell during the row (other jobs' swings included); a row",
             "is stopped when it falls below the floor (`--memory-floor`) and says so: that swarm did not fit.",
             "coordinator CPU = user + system CPU seconds of the coordinator process between two round closes, mean over the",
             "counted rounds ('with DHT' adds its DHT process and p2pd; rows before session 28 did not keep it); round s = wall",
             "time between two closes.", ""]
    for inv in sources(data.get("storm_invocations", []), runs):
        lines += [*machine_lines(inv.get("machine"), inv["load_before"], inv["load_after"]), f"- command: `{inv['command']}`", ""]
    lines += ["| codec | exchange | S | r | k | H | rounds | start | n started | joined | rounds closed | received mean (median) KB | vs smallest n | "
              "control share | coordinator KB/round | = fp32 models | coordinator CPU s/round (with DHT) | round s | wall s | memory taken GiB | load before -> after | all joined, every round in sync |",
              "|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---|---|"]
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in runs:
        groups.setdefault((r["codec"], _start(r)), []).append(r)
    for group in groups.values():
        base = next((r for r in group if r["ok"]), None)
        for r in group:
            share = control_share(r)
            vs = f"{r['received_mean'] / base['received_mean']:.2f}x" if base and r["ok"] and r["received_mean"] == r["received_mean"] else "-"
            lines.append(
                f"| {r['codec']} | {r['mode']} | {r['slices'] or '-'} | {r['replicas'] or '-'} | {r['spot_checks']} | {r['inner_steps']} | "
                f"{r['rounds']} | {_start(r)} | {r.get('peers_started', r['peers'])} | {r.get('peers_joined', '?')} | {r.get('rounds_done', '?')} | "
                f"{_kb(r['received_mean'])} ({_kb(r['received_median'])}) | {vs} | {_percent(share)} | "
                f"{_kb(r['coordinator_bytes_per_round'])} | {_ratio(r['coordinator_bytes_per_round'] / (4 * r['numel']))} | {_cpu(r)} | "
                f"{_seconds(r.get('round_wall_s'))} | {r['wall_s']:.0f} | "
                f"{r['memory_taken_gib'] if r.get('memory_taken_gib') is not None else '-'} | {r.get('load_before', '?')} -> {r.get('load_after', '?')} | {'yes' if r['ok'] else 'NO: ' + '; '.join(r['problems'])[:600]} |")
    lines += ["", "Targets (issue 24), from the rows above:", ""]
    for (codec_name, start), group in groups.items():
        codec = f"{codec_name}, {start}"
        ok = [r for r in group if r["ok"]]
        unfit = [r for r in group if not r["ok"] and r.get("stopped_for_memory")]
        failed = [r for r in group if not r["ok"] and not r.get("stopped_for_memory")]
        lines.append(f"- {codec}: every peer joined and every round closed with every peer in sync at n = "
                     f"{', '.join(str(r['peers']) for r in ok) or 'none'}"
                     + (f"; NOT at n = {', '.join(str(r['peers']) for r in failed)}" if failed else "")
                     + (f"; not measured at n = {', '.join(str(r['peers']) for r in unfit)}: the swarm did not fit in this "
                        "machine's memory beside the other jobs (stopped at the floor)" if unfit else ""))
        if ok:
            lines += byte_targets(codec, ok)
            timed = [r for r in ok if _measured(r.get("coordinator_cpu_s_per_round"))]
            lines.append(cpu_growth_target(codec, timed) if len(timed) >= 2 else
                         f"- {codec}: the coordinator's CPU per round: not measured in these rows (the scale lab's below)")
    return lines + [""]


def _measured(x) -> bool:
    return isinstance(x, (int, float)) and x == x and x > 0


def _start(r: dict) -> str:
    return r.get("start") or "exec"  # storm rows before session 28 kept no "start": every process exec'd


def row_key(r: dict) -> tuple:
    """What a stored row stands for, so that a run replaces the row of the same swarm started the
    same way (measure_scale's --merge), and an invocation's "runs" list these keys."""
    return (r["codec"], r["mode"], r["peers"], *(() if r.get("start") is None else (r["start"],)))


def sources(invocations: list[dict], runs: list[dict]) -> list[dict]:
    """The invocations that measured a row still in the table: for each row, the last invocation
    that ran its swarm."""
    last = {tuple(run): i for i, inv in enumerate(invocations) for run in inv.get("runs", [])}
    wanted = {last.get(row_key(r)) for r in runs}
    return [inv for i, inv in enumerate(invocations) if i in wanted]


def _cpu(r: dict) -> str:
    cpu, tree = r.get("coordinator_cpu_s_per_round"), r.get("coordinator_tree_cpu_s_per_round")
    return f"{cpu:.2f} ({tree:.2f})" if _measured(cpu) and _measured(tree) else "-"


def _seconds(x) -> str:
    return f"{x:.1f}" if _measured(x) else "-"


def _percent(x: float) -> str:
    return f"{x * 100:.1f}%" if x == x else "-"


def _ratio(x: float) -> str:
    return f"{x:.2f}" if x == x else "-"


def write_markdown(path: Path, data: dict) -> None:
    runs = data.get("runs", [])
    lines = ["# Bytes per peer per round as the swarm grows (measured)", "",
             "Written by `scripts/measure_scale.py` (method in its docstring; report: `scripts/scale_report.py`) from",
             "`benchmarks/scale.json`. Real local swarms on loopback, a coordinator and n peer processes, default demo model,",
             "rule `median`; bytes are each peer's transport ledger (serialized protobuf sizes of every RPC, by counterpart",
             "and round). Figures are over every (peer, round) after the first round (joins, warm-up): mean, and the median",
             "beside it; the owner draw gives peers different numbers of slices, so the mean is what the formula predicts.",
             "control = a peer's traffic with the coordinator (headers, manifest, signed results, heartbeats); data = the",
             "rest (all-to-all: everything, since its coordinator holds and serves every payload like a peer). The",
             "coordinator's bytes per round are summed from the peers' ledgers. Expected data bytes per peer",
             "per round (P payload, A aggregated result, m = n serving peers, r owners per slice, S slices, k spot checks):", "",
             *FORMULAS, ""]
    for inv in data.get("invocations", []):
        lines += [*machine_lines(inv.get("machine"), inv["load_before"], inv["load_after"]), f"- command: `{inv['command']}`", ""]
    lines += ["| codec | exchange | S | r | k | n | P (KB) | A (KB) | received mean (median; min–max) KB | control KB | data KB | expected KB | data / expected | received / expected | sent mean KB | expected sent KB | coordinator KB/round | = fp32 models | all in sync |",
              "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in runs:
        lines.append(f"| {r['codec']} | {r['mode']} | {r['slices'] or '-'} | {r['replicas'] or '-'} | {r['spot_checks']} | {r['peers']} | "
                     f"{_kb(r['payload_bytes'])} | {_kb(r['result_bytes'])} | {_kb(r['received_mean'])} ({_kb(r['received_median'])}; "
                     f"{_kb(r['received_min'])}–{_kb(r['received_max'])}) | {_kb(r['control_received_mean']) if r['control_received_mean'] is not None else '-'} | "
                     f"{_kb(r['data_received_mean'])} | "
                     f"{_kb(r['expected_received'])} | {r['data_received_vs_expected']:.3f} | {r['received_vs_expected']:.3f} | "
                     f"{_kb(r['sent_mean'])} | {_kb(r['expected_sent'])} | {_kb(r['coordinator_bytes_per_round'])} | "
                     f"{r['coordinator_bytes_per_round'] / (4 * r['numel']):.2f} | {'yes' if r['ok'] else 'NO: ' + '; '.join(r['problems'])} |")
    lines += ["", *(f"Every run: H = {r['inner_steps']} inner steps, {r['rounds']} rounds, the first {r['skip_rounds']} "
                    "left out of the figures." for r in runs[:1]), "",
              "## Growth from the smallest to the largest swarm", "",
              "| codec | exchange | n | received, mean | received, median | data only | formula | formula without spot checks |",
              "|---|---|---|---:|---:|---:|---:|---:|"]
    for g in growth(runs):
        lines.append(f"| {g['codec']} | {g['mode']} | {g['small']} -> {g['large']} | {g['measured']:.2f}x | {g['measured_median']:.2f}x | "
                     f"{g['data']:.2f}x | {g['expected']:.2f}x | {g['expected_no_spot']:.2f}x |")
    lines += ["", *target_lines(runs), *storm_lines(data), *lab_lines(data, machine_lines), *projection_lines(data)]
    write_keeping_notes(path, "\n".join(lines))
