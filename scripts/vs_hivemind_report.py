"""benchmarks/vs_hivemind.md from the rows of scripts/bench_vs_hivemind.py (or the JSON it wrote).

Every figure in the generated part comes from the rows; a person's notes below the notes mark are
kept. Rows of older runs (the re-implemented all-to-all harness, before the sliced exchange) lack
the exchange fields and are labelled as such.
"""

from __future__ import annotations

from pathlib import Path

from machine_info import machine_lines, write_keeping_notes

OLD_HARNESS = "all-to-all (re-implemented harness, one fetch at a time)"
SPLIT_COLUMNS = {  # split key -> column title; the old harness split its round differently
    "encode_s": "encode+sign", "manifest_s": "manifest relay", "reduce_s": "reduce (incl. fetches)",
    "results_s": "results relay", "gather_s": "gather + step", "fetch_s": "fetch", "decode_s": "decode",
    "aggregate_s": "aggregate",
}


def wall_time_text(wall_s: float | None, finished: bool | None) -> str:
    """The md's wall-time line: a JSON kept from a run that stopped early has no total to state."""
    if wall_s is None:
        return "not recorded (this JSON was written before its run finished; the run did not reach its end)"
    if finished is False:
        return f"{wall_s:.0f} s until the last configuration written here (the run did not finish)"
    return f"{wall_s:.0f} s"


def how_it_ran(row: dict) -> str:
    """The row's exchange: mode, codec, slices, replicas, spot checks, aggregator."""
    if "mode" not in row:
        return f"{OLD_HARNESS}, {row['codec']}, run's default rule"
    ef = "error feedback" if row.get("error_feedback", True) else "no error feedback"
    if row["codec"] == "fp32":
        ef = "lossless, no error feedback"  # RoundMath keeps error feedback for lossy codecs only
    if row["mode"] == "sliced":
        return (f"sliced S={row['slices']} r={row['replicas']} spot checks {row['spot_checks']}, "
                f"{row['codec']} + {ef}, {row['aggregator']}")
    return f"all-to-all, {row['codec']} + {ef}, {row['aggregator']}"


def _mb(value: float | None) -> str:
    return "" if value is None else f"{value / 1e6:.1f}"


def table_lines(rows: list[dict]) -> list[str]:
    several = len({r.get("_json") for r in rows}) > 1
    lines = [
        "| peers | floats | precision (hivemind) | swarmloco exchange | payload (MB) | swarmloco (s) | hivemind (s) | ratio "
        "| reps | max err swarmloco | max err hivemind | same θ on every peer | load 1 min before/after |" + (" JSON |" if several else ""),
        "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|" + ("---|" if several else ""),
    ]
    for r in rows:
        same = r.get("swarmloco_identical_on_every_peer")
        load = f"{r['load_before'].split(' /')[0]} / {r['load_after'].split(' /')[0]}" if "load_before" in r else ""
        lines.append(
            f"| {r['peers']} | {r['numel']:,} | {r['precision']} ({r['hivemind_compression']}) | {how_it_ran(r)} | "
            f"{_mb(r['payload_bytes'])} | {r['swarmloco_round_s']:.3f} | {r['hivemind_round_s']:.3f} | {r['ratio']:.2f} | "
            f"{r['repeats']} | {r['swarmloco_max_abs_error']:.2g} | {r['hivemind_max_abs_error']:.2g} | "
            f"{'' if same is None else 'yes' if same else 'NO'} | {load} |" + (f" {Path(r['_json']).name} |" if several else "")
        )
    return lines


def split_lines(rows: list[dict]) -> list[str]:
    keys = [k for k in SPLIT_COLUMNS if any(k in r["swarmloco_split_s"] for r in rows)]
    lines = [
        "| peers | floats | swarmloco exchange | " + " | ".join(SPLIT_COLUMNS[k] for k in keys)
        + " | coordinator's manifest | received / sent per peer (MB) | peak RSS per worker (MB) "
        "| CPU s per round, all workers: swarmloco / hivemind |",
        "|---:|---:|---|" + "---:|" * len(keys) + "---:|---:|---:|---:|",
    ]
    for r in rows:
        s = r["swarmloco_split_s"]
        cells = [f"{s[k]:.3f}" if k in s else "" for k in keys]
        coord = f"{r['coordinator_manifest_s']:.3f}" if "coordinator_manifest_s" in r else ""
        traffic = f"{_mb(r['received_bytes_per_peer'])} / {_mb(r['sent_bytes_per_peer'])}" if "received_bytes_per_peer" in r else ""
        rss = f"{r['max_rss_mb']:.0f}" if "max_rss_mb" in r else ""
        cpu = f"{r['swarmloco_cpu_s']:.2f} / {r['hivemind_cpu_s']:.2f}" if "swarmloco_cpu_s" in r else ""
        lines.append(f"| {r['peers']} | {r['numel']:,} | {how_it_ran(r)} | " + " | ".join(cells) + f" | {coord} | {traffic} | {rss} | {cpu} |")
    return lines


def about_lines(saved: dict) -> list[str]:
    """A run's machine, load, wall time and command: what its JSON recorded (never this machine's)."""
    return [*machine_lines(saved, saved.get("load_before"), saved.get("load_after")),
            f"- total wall time: {wall_time_text(saved.get('wall_s'), saved.get('finished'))}",
            f"- command: `{saved.get('command')}`", ""]


def write_markdown(path: Path, runs: list[tuple[str | None, dict]]) -> None:
    """The md from one or more runs, each (the JSON name shown, or None; the run as its JSON holds
    it: rows, machine facts, load, wall time, command); rows in the order given."""
    rows = [row | {"_json": name} for name, saved in runs for row in saved["rows"]]
    if len(runs) > 1:
        source = " from " + ", ".join(f"`{name}`" for name, _ in runs)
        about = [line for name, saved in runs for line in (f"`{name}`:", "", *about_lines(saved))]
    else:
        name, saved = runs[0]
        source, about = (f" from `{name}`" if name else ""), about_lines(saved)
    lines = [
        "# swarmloco exchange round vs hivemind all-reduce",
        "",
        f"Written by `scripts/bench_vs_hivemind.py` (method in its docstring){source}. One row = one (peers, tensor,",
        "precision, swarmloco exchange); both systems ran alternately in the same worker processes on loopback;",
        "medians over the repetitions after one warm-up; round time = the slowest peer's. hivemind is timed from the",
        "trigger after matchmaking (its matchmaking excluded); swarmloco from encode to θ_{r+1}, the header,",
        "manifest and result relays (the coordinator's part) included. ratio = swarmloco / hivemind (< 1:",
        "swarmloco faster). max err = largest |result − exact mean of the N fp32 tensors| over all peers and",
        "repetitions (randn data); swarmloco's outer step is fedavg at lr 1, so θ_{r+1} is minus the aggregate.",
        "",
        *about,
        *table_lines(rows),
        "",
        "swarmloco round split (median over the repetitions of the slowest peer's figures, seconds; relays include",
        "waiting for the slowest peer); the coordinator's manifest = verifying the n headers, the owner draw,",
        "signing, in the parent process; bytes counted by the transport's interceptors, the peer that received most;",
        "CPU = user + system seconds of every process of every worker's session (the worker's threads, hivemind's",
        "DHT and averager processes and p2pd daemons) from the round's start to its end, summed over the workers,",
        "median over the repetitions (runs before this column lack it).",
        "",
        *split_lines(rows),
    ]
    write_keeping_notes(path, "\n".join(lines))
