"""The formula behind benchmarks/scale.md and its projection to 100 and 1,000 peers: the expected data
bytes per peer and at the coordinator (scripts/measure_scale.py's docstring), the control fit on the
measured rows, and the projection rows built from them. Pure functions of the numbers and the JSON.
"""

from __future__ import annotations

import math
import statistics

LINK_BITS_PER_S = 100e6
COVERAGE = 0.5  # exchange.spot_check_coverage's default (peer/run/config_sections.ExchangeConfig)
BUDGET_MODELS = 2.0  # the coordinator's own spot check runs only within this (peer/exchange/spot_budget.py)


def expected(mode: str, n: int, payload: float, result: float, replicas: int, slices: int = 32, spot_checks: int = 0,
             coverage: float = COVERAGE) -> dict[str, float]:
    """Expected data bytes per peer per round (module docstring), control traffic not included.
    Spot checks run with probability min(1, coverage·S/(n·k)) (exchange.spot_check_coverage)."""
    if mode == "all-to-all":
        return {"received": (n - 1) * payload, "sent": (n - 1) * payload, "spot": 0.0}  # every peer fetches every other update
    from peer.run.slice_plan import expected_traffic

    base = expected_traffic(n, payload, result, replicas, num_slices=slices)
    full = expected_traffic(n, payload, result, replicas, spot_checks=spot_checks, coverage=coverage, num_slices=slices)
    return {"received": full["received"], "sent": full["sent"], "spot": full["received"] - base["received"]}


def expected_coordinator(mode: str, n: int, payload: float, result: float, slices: int, spot_checks: int,
                         coverage: float | None = COVERAGE) -> float:
    """Data the coordinator fetches per round: θ_{r+1}'s slices (and its spot checks' inputs, run with
    probability min(1, coverage·S/(n·k)) like a peer's; coverage None: every round, as before
    issue 24's sampling), or every payload."""
    if mode == "all-to-all":
        return n * payload
    from peer.run.slice_plan import spot_check_probability

    p = 1.0 if coverage is None else spot_check_probability(spot_checks, coverage, slices, n)
    return result + p * spot_checks * (n * payload - result) / slices


def control_fit(results: list[dict], both_ways: bool = False) -> tuple[float, float]:
    """Least-squares control bytes received (both_ways: sent + received) per peer per round =
    c0 + c1·n over the sliced runs."""
    points = [(r["peers"], r["control_received_mean"] + (r["control_sent_mean"] if both_ways else 0.0))
              for r in results if r["mode"] == "sliced" and r["ok"]]
    if len({n for n, _ in points}) < 2:
        return (points[0][1] if points else 0.0), 0.0
    mean_n = statistics.fmean(n for n, _ in points)
    mean_c = statistics.fmean(c for _, c in points)
    c1 = sum((n - mean_n) * (c - mean_c) for n, c in points) / sum((n - mean_n) ** 2 for n, _ in points)
    return mean_c - c1 * mean_n, c1


def control_runs(data: dict) -> list[dict]:
    """The runs the control term is fitted on: the scale lab's (today's control: Merkle-rooted
    headers, bitmaps) when there are any, else the formula table's (measured before them)."""
    return [r for r in data.get("lab_runs", []) if r["ok"]] or data.get("runs", [])


def projection(data: dict, link_bits_per_s: float = LINK_BITS_PER_S) -> list[dict]:
    """Per-peer bytes and transfer time per round for big models and swarms, from measured bytes/param
    (the formula table's largest sliced run per codec) and the control fit (control_runs).

    Sliced at S = 32 (as measured) and S = n (each peer owns ~r slices). Control = c0 + c1·n, fitted
    on the lab's rows (O(n): one Merkle root per header); on the formula table's alone (before Merkle
    roots, S slice hashes per header) c0 + c1·n·S/32. The busiest
    peer owns ceil(S·r/n) slices: it receives their n − 1 inputs and serves their result to n/r peers."""
    results = data.get("runs", [])
    c0, c1 = control_fit(control_runs(data))
    t0, t1 = control_fit(control_runs(data), both_ways=True)  # the coordinator serves n peers that much
    per_slice = not any(r["ok"] for r in data.get("lab_runs", []))
    rows = []
    for codec in dict.fromkeys(r["codec"] for r in results):
        sliced = [r for r in results if r["codec"] == codec and r["mode"] == "sliced" and r["ok"]]
        if not sliced:
            continue
        ref = max(sliced, key=lambda r: r["peers"])
        p, a, k, rep = ref["payload_bytes"] / ref["numel"], ref["result_bytes"] / ref["numel"], ref["spot_checks"], ref["replicas"]
        for params in (125e6, 1e9):
            P, A = p * params, a * params
            for n in (100, 1000):
                a2a = expected("all-to-all", n, P, A, rep)["received"]
                for S in (32, min(4096, n)):
                    exp = expected("sliced", n, P, A, rep, S, k)
                    control = c0 + c1 * n * (S / 32 if per_slice else 1)
                    owned = math.ceil(S * rep / n)
                    busiest_received = owned * (n - 1) * P / S + (S - owned) * A / S + exp["spot"] + control
                    busiest_sent = (rep - rep / n) * P + owned * n / rep * A / S + exp["spot"]
                    mean = exp["received"] + control
                    coordinator_control = n * (t0 + t1 * n * (S / 32 if per_slice else 1))
                    # its own spot check only where it fits 2 fp32 models with the rest (peer/exchange/spot_budget.py)
                    checks = coordinator_control + A + k * (n - 1) * P / S <= BUDGET_MODELS * 4 * params
                    coordinator = coordinator_control + expected_coordinator("sliced", n, P, A, S, k if checks else 0)
                    rows.append({"codec": codec, "params": params, "peers": n, "slices": S, "owned_busiest": owned,
                                 "sliced_bytes": mean, "spot_bytes": exp["spot"], "control_bytes": control,
                                 "busiest_received": busiest_received, "busiest_sent": busiest_sent, "all_to_all_bytes": a2a,
                                 "sliced_s": mean * 8 / link_bits_per_s, "busiest_s": max(busiest_received, busiest_sent) * 8 / link_bits_per_s,
                                 "all_to_all_s": a2a * 8 / link_bits_per_s, "coordinator_bytes": coordinator,
                                 "coordinator_models": coordinator / (4 * params), "coordinator_control_bytes": coordinator_control,
                                 "coordinator_checks": checks})
    return rows


def cpu_fit(data: dict) -> tuple[float, float]:
    """Least-squares coordinator CPU seconds per round = c0 + c1·n over the scale lab's rows."""
    points = [(r["peers"], r["coordinator_cpu_s_per_round"]) for r in data.get("lab_runs", [])
              if r["ok"] and r.get("coordinator_cpu_s_per_round") == r.get("coordinator_cpu_s_per_round")]
    if len({n for n, _ in points}) < 2:
        return (points[0][1] if points else 0.0), 0.0
    mean_n, mean_c = statistics.fmean(n for n, _ in points), statistics.fmean(c for _, c in points)
    c1 = sum((n - mean_n) * (c - mean_c) for n, c in points) / sum((n - mean_n) ** 2 for n, _ in points)
    return mean_c - c1 * mean_n, c1


def with_projection(data: dict) -> dict:
    """The projection is a pure function of the measured runs and the formula: recomputed and
    written back, so the JSON beside the md holds every figure the md shows."""
    data["projection"], data["control_fit"] = projection(data), control_fit(control_runs(data))
    data["control_fit_both_ways"] = control_fit(control_runs(data), both_ways=True)
    data["coordinator_cpu_fit"] = cpu_fit(data)
    return data
