"""benchmarks/heterogeneous.md from benchmarks/heterogeneous.json (scripts/bench_heterogeneous.py):
a pure function of the JSON, figures and verdicts on the issue's targets (issue 23)."""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for extra in (str(ROOT), str(ROOT / "scripts")):
    if extra not in sys.path:
        sys.path.insert(0, extra)

from machine_info import machine_lines  # noqa: E402

UTILIZATION_TARGET = 0.90  # the fast peers' utilization under the window
SHARE_TOLERANCE = 0.10  # each peer's counted share within 10% (relative) of its compute share
EQUAL_TOKENS_TOLERANCE = 0.01  # window-run loss within 1% of the homogeneous run's at equal tokens
ISSUE_BEFORE = "27-29%"  # the fast peers' utilization the issue measured with fixed H (H = 20, one peer at 15%)


def utilization(peer: dict[str, Any]) -> float:
    """Inner-step seconds over round wall seconds, rounds 1 on."""
    rounds = [r for r in peer["history"] if r["round"] >= 1]
    return sum(r["compute_s"] for r in rounds) / max(1e-9, sum(r["round_s"] for r in rounds))


def measured_speeds(row: dict[str, Any]) -> list[float]:
    """Each peer's steps per compute second (rounds 1 on), over the fastest's."""
    rates = []
    for peer in row["peers"]:
        rounds = [r for r in peer["history"] if r["round"] >= 1]
        rates.append(sum(r["inner_steps"] for r in rounds) / max(1e-9, sum(r["compute_s"] for r in rounds)))
    return [r / max(rates) for r in rates]


def period_ms(row: dict[str, Any]) -> float:
    """The row's cgroup CFS period in ms (rows from before it was recorded ran at 100 ms)."""
    return row.get("period_us", 100_000) / 1000


def seed_of(name: str) -> tuple[str, int]:
    """A row's plan and seed from its name: "window" -> ("window", 0), "window-s2" -> ("window", 2)."""
    match = re.fullmatch(r"(.+)-s(\d+)", name)
    return (match[1], int(match[2])) if match else (name, 0)


def quota_cores(row: dict[str, Any]) -> list[float]:
    """Each peer's CPU quota (cores): the calibrated ones where the row records them, else speed x base core."""
    return row.get("cores") or [s * row["base_core"] for s in row["speeds"]]


def speeds_matched(row: dict[str, Any]) -> bool | None:
    """Whether the row's quotas made its speed probes train at the row's speeds (within the
    calibration's tolerance: bench_heterogeneous.SPEED_TOLERANCE); None: the row did not try."""
    return (row.get("calibration") or {}).get("matched")


def _quota_label(row: dict[str, Any]) -> str:
    return {True: " (matched)", False: " (not matched)", None: ""}[speeds_matched(row)]


def calibrated_shares(row: dict[str, Any]) -> list[float] | None:
    """Each peer's share of the compute its quota bought alone (the speed probes' training rates), or None."""
    calibration = row.get("calibration")
    if not calibration:
        return None
    return [r / sum(calibration["rates"]) for r in calibration["rates"]]


def counted_shares(row: dict[str, Any]) -> list[float]:
    """Each peer's share of the work the aggregates counted, rounds 1 on: per round the capped
    weights the owners used (WorkLedger over the signed claims, the history carried round to
    round as the coordinator signs it), times the round's tokens."""
    from peer.run.config import RunConfig
    from peer.run.round_math import RoundMath
    from peer.run.work_math import WorkLedger

    cfg = RunConfig.from_dict(row["config"])
    ledger = WorkLedger(RoundMath(cfg, 1000))
    ids = [p["peer_id"] for p in row["peers"]]
    by_round: dict[int, dict[str, tuple[int, int]]] = {}
    for peer in row["peers"]:
        for r in peer["history"]:
            by_round.setdefault(r["round"], {})[peer["peer_id"]] = (r["inner_steps"], r["tokens"])
    counted = dict.fromkeys(ids, 0.0)
    for round_ in sorted(by_round):
        claims = dict(sorted(by_round[round_].items()))
        history = ledger.history(list(claims))
        shares = ledger.close(claims, history, 0)
        if round_ >= 1:
            tokens = sum(t for _, t in claims.values())
            for peer_id, entry in shares.items():
                counted[peer_id] += entry["weight"] * tokens
    total = sum(counted.values())
    return [counted[p] / total for p in ids]


def timeline(row: dict[str, Any]) -> list[tuple[float, int, float]]:
    """(seconds since round 1 opened, cumulative tokens, val loss) after each round from round 1."""
    tokens_by_round: dict[int, int] = {}
    for peer in row["peers"]:
        for r in peer["history"]:
            tokens_by_round[r["round"]] = tokens_by_round.get(r["round"], 0) + r["tokens"]
    out, t, tokens = [], 0.0, tokens_by_round.get(0, 0)
    for r in row["coordinator"]["history"]:
        if r["round"] < 1:
            continue
        t += r["seconds"]
        tokens += tokens_by_round.get(r["round"], 0)
        out.append((t, tokens, r["val_loss"]))
    return out


def loss_at_time(row: dict[str, Any], seconds: float) -> tuple[float, int]:
    """The val loss after the last round closed by `seconds`, and that round's index."""
    points = [(i, loss) for i, (t, _, loss) in enumerate(timeline(row)) if t <= seconds + 1e-9]
    i, loss = points[-1]
    return loss, i + 1


def loss_at_tokens(row: dict[str, Any], tokens: float) -> float | None:
    """Val loss linearly interpolated at `tokens` (None outside the run's range)."""
    points = [(0, row["coordinator"]["history"][0]["val_loss"])] + [(k, loss) for _, k, loss in timeline(row)]
    for (k0, l0), (k1, l1) in zip(points, points[1:]):
        if k0 <= tokens <= k1:
            return l0 + (l1 - l0) * (tokens - k0) / max(1, k1 - k0)
    return None


def in_sync(row: dict[str, Any]) -> bool:
    """Every peer ended on the coordinator's final hash, and was in sync after every round it applied."""
    final = row["coordinator"]["param_hash"]
    return all(p["param_hash"] == final and all(r["in_sync"] for r in p["history"]) for p in row["peers"])


def verdict(ok: bool) -> str:
    return "reached" if ok else "NOT reached"


def render(record: dict[str, Any]) -> str:
    rows = record["rows"]
    lines = ["# Heterogeneous volunteers: a compute window against a fixed H (issue 23)", "",
             "Generated by `scripts/bench_heterogeneous.py` from `benchmarks/heterogeneous.json`; regenerate with `--report-only`.", ""]
    lines += machine_lines(record.get("machine"), next(iter(rows.values()), {}).get("load_before"),
                           list(rows.values())[-1].get("load_after") if rows else None)
    for name, row in rows.items():
        lines.append(f"- {name}: `{row.get('command', record.get('command', 'not recorded'))}`")
    lines.append("")
    lines += ["| row | speeds (x base core) | schedule | rounds | wall s | peer utilization, rounds 1+ | measured speed | "
              "tokens trained share | counted share | compute share (speeds) | quota (cores) | calibrated compute share | final val loss | "
              "every peer on the final hash | load before/after |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, row in rows.items():
        most = row.get("config", {}).get("rounds", {}).get("max_steps")
        steps = f"min 1, max {most} steps" if most else "min 1 step"
        schedule = f"window {row['window_s']:g} s ({steps})" if row["window_s"] else f"fixed H = {row['inner_steps']}"
        tokens = [sum(r["tokens"] for r in p["history"] if r["round"] >= 1) for p in row["peers"]]
        compute = [s / sum(row["speeds"]) for s in row["speeds"]]
        lines.append(
            f"| {name} | {', '.join(f'{s:g}' for s in row['speeds'])} (base {row['base_core']:g} core, period {period_ms(row):g} ms) | {schedule} | {row['rounds']} | "
            f"{row['wall_s']:.0f} | {_pcts(utilization(p) for p in row['peers'])} | {_list(measured_speeds(row))} | "
            f"{_pcts(t / sum(tokens) for t in tokens)} | {_pcts(counted_shares(row))} | {_pcts(compute)} | {', '.join(f'{c:.3g}' for c in quota_cores(row))}"
            f"{_quota_label(row)} | {_pcts(calibrated_shares(row) or []) or '-'} | "
            f"{row['coordinator']['history'][-1]['val_loss']:.4f} | {'yes' if in_sync(row) else 'NO'} | "
            f"{row['load_before']} / {row['load_after']} |")
    how = next(iter(rows.values()))["config"] if rows else {}
    if how:
        lines += ["", f"Every row: sliced exchange, aggregator {how['aggregation']['name']} (num_byzantine "
                  f"{how['aggregation']['num_byzantine']}), codec {how['compression']['codec']}, outer {how['outer']['name']}, "
                  f"min deadline {how['rounds']['min_deadline_s']:g} s, model d_model {how['model']['d_model']} x {how['model']['n_layer']} layers, "
                  f"batch {how['data']['batch_size']} x {how['model']['seq_len']} tokens, seed 0 (`-sN` rows: seed N), one thread per peer, "
                  f"each peer in its own cgroup (quota speed x base core of every CFS period, the row's period, cpu.shares 16384) once joined; "
                  f"in a row whose quotas say (matched), the quotas were scaled before the swarm started until each one's speed probe "
                  f"trained at the row's speed (within 5%) relative to the speed-1 probes; (not matched): the closest attempt's quotas, outside 5%."]
    lines += ["", "## Targets", ""] + _targets(rows)
    return "\n".join(lines) + "\n"


def _targets(rows: dict[str, Any]) -> list[str]:
    out = []
    fixed, window, homogeneous = rows.get("fixed-h"), rows.get("window"), rows.get("homogeneous")
    if window:
        fast = [utilization(p) for p, s in zip(window["peers"], window["speeds"]) if s == max(window["speeds"])]
        before = ([utilization(p) for p, s in zip(fixed["peers"], fixed["speeds"]) if s == max(fixed["speeds"])]
                  if fixed else [])
        out.append(f"- fast peers' utilization >= {UTILIZATION_TARGET:.0%}: {_pcts(fast)} with the window "
                   f"({_pcts(before) or 'not run'} with fixed H here; the issue measured {ISSUE_BEFORE}): "
                   f"**{verdict(min(fast) >= UTILIZATION_TARGET)}**")
        compute = [s / sum(window["speeds"]) for s in window["speeds"]]
        slow = [i for i, s in enumerate(window["speeds"]) if s < max(window["speeds"])]
        windows = {seed: row for name, row in rows.items() for plan, seed in [seed_of(name)] if plan == "window"}
        counted = _mean_lists([counted_shares(row) for row in windows.values()])
        many = f" (mean of {len(windows)} seeds)" if len(windows) > 1 else ""
        off = [(c - k) / k for c, k in zip(counted, compute)]
        out.append(f"- slow peers' counted share within {SHARE_TOLERANCE:.0%} of their compute share (the row's speeds){many}: "
                   + ", ".join(f"speed {window['speeds'][i]:g}: {counted[i]:.1%} vs {compute[i]:.1%} ({off[i]:+.0%})" for i in slow)
                   + f": **{verdict(all(abs(off[i]) <= SHARE_TOLERANCE for i in slow))}**"
                   + (f" (fixed H: {_pcts(counted_shares(fixed))})" if fixed else ""))
        # A cgroup's quota does not buy training exactly in proportion to it (each throttled period
        # costs ~3 ms of CPU that trains nothing, a larger part of a small quota; at 100 ms the
        # speed-0.25 quota trained at 0.19 of speed 1, at 1 s at 0.24): against the rate each quota
        # trained at alone (the speed probes) and the rate each peer reached in the swarm.
        calibrated = [c for c in (calibrated_shares(row) for row in windows.values()) if c]
        if calibrated:
            mean = _mean_lists(calibrated)
            offs = {i: (counted[i] - mean[i]) / mean[i] for i in slow}
            out.append(f"  - against the calibrated compute share (each quota's training rate alone, the speed probes){many}: "
                       + ", ".join(f"speed {window['speeds'][i]:g}: {counted[i]:.1%} vs {mean[i]:.1%} ({offs[i]:+.0%})" for i in slow)
                       + f": **{verdict(all(abs(o) <= SHARE_TOLERANCE for o in offs.values()))}**")
        rate_share = _mean_lists([[r / sum(m) for r in m] for m in (measured_speeds(row) for row in windows.values())])
        out.append("  - against each peer's measured training rate in the swarm: "
                   + ", ".join(f"speed {window['speeds'][i]:g}: {counted[i]:.1%} vs {rate_share[i]:.1%} "
                               f"({(counted[i] - rate_share[i]) / rate_share[i]:+.0%})" for i in slow))
        for seed, row in sorted(windows.items()):
            mine, cal = counted_shares(row), calibrated_shares(row)
            out.append(f"  - seed {seed}{' (quotas matched)' if speeds_matched(row) else ''}: counted vs speeds " + ", ".join(f"{(mine[i] - compute[i]) / compute[i]:+.0%}" for i in slow)
                       + ("" if not cal else "; vs calibrated " + ", ".join(f"{(mine[i] - cal[i]) / cal[i]:+.0%}" for i in slow)))
    if window and fixed:
        budget = min(timeline(window)[-1][0], timeline(fixed)[-1][0])
        w_loss, w_rounds = loss_at_time(window, budget)
        f_loss, f_rounds = loss_at_time(fixed, budget)
        out.append(f"- val loss at equal wall time ({budget:.0f} s from round 1): window {w_loss:.4f} ({w_rounds} rounds) vs "
                   f"fixed H {f_loss:.4f} ({f_rounds} rounds), {100 * (w_loss / f_loss - 1):+.2f}%: **{verdict(w_loss < f_loss)}**")
    pairs = []
    for name, row in rows.items():
        plan, seed = seed_of(name)
        partner = rows.get("homogeneous" if not seed else f"homogeneous-s{seed}")
        if plan == "window" and partner:  # at the tokens both runs reached: the shorter one's end
            tokens = min(timeline(row)[-1][1], timeline(partner)[-1][1])
            pairs.append((seed, tokens, loss_at_tokens(row, tokens), loss_at_tokens(partner, tokens)))
    measured = [(seed, tokens, final, ref, final / ref - 1) for seed, tokens, final, ref in pairs]
    if measured:
        gaps = [g for *_, g in measured]
        mean = statistics.fmean(gaps)
        spread = f", seed-to-seed sd {100 * statistics.stdev(gaps):.2f} points" if len(gaps) > 1 else ""
        out.append(f"- loss at equal tokens (window, mixed speeds, vs homogeneous, at the tokens the shorter of the two reached, "
                   f"the other interpolated linearly in tokens between its rounds), "
                   f"{len(gaps)} seed{'s' if len(gaps) > 1 else ''}: mean {100 * mean:+.2f}%{spread}: "
                   f"**{verdict(abs(mean) <= EQUAL_TOKENS_TOLERANCE)}** (within 1%, either way); read one-sided, no more "
                   f"than 1% worse than homogeneous: **{verdict(mean <= EQUAL_TOKENS_TOLERANCE)}**")
        for seed, tokens, final, reference, g in measured:
            out.append(f"  - seed {seed}: at {tokens:,} tokens {final:.4f} vs {reference:.4f}, {100 * g:+.2f}%")
    return out


def _mean_lists(lists: list[list[float]]) -> list[float]:
    return [statistics.fmean(column) for column in zip(*lists)]


def _pcts(values) -> str:
    return ", ".join(f"{v:.0%}" for v in values)


def _list(values) -> str:
    return ", ".join(f"{v:.2f}" for v in values)
