"""benchmarks/gpu.md from the JSON scripts/gpu_smoke.py wrote: a pure function of that JSON.

    .venv/bin/python scripts/gpu_report.py benchmarks/gpu.json                 # -> benchmarks/gpu.md
    .venv/bin/python scripts/gpu_report.py /tmp/cpu.json --md /tmp/cpu.md     # a CPU dry run, elsewhere

benchmarks/gpu.md records CUDA runs only. A JSON from `gpu_smoke.py --device cpu` exercised the
same code path without a device: its report is rendered with a "CPU dry run" banner and may be
written anywhere except benchmarks/gpu.md, which is refused (exit status 2) so that a dry run is
never mistaken for a GPU measurement.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for extra in (str(ROOT), str(ROOT / "scripts")):
    if extra not in sys.path:
        sys.path.insert(0, extra)

GPU_MD = ROOT / "benchmarks/gpu.md"


def is_cuda_run(run: dict) -> bool:
    return run["config"]["device"] == "cuda" and all(p["device"].startswith("cuda") for p in run["peers"])


def _mb(n: float | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:,.0f} MiB"


def _pct(x: float | None) -> str:
    return "n/a (no known peak for this device)" if x is None else f"{100 * x:.1f}%"


def headline(run: dict) -> str:
    """One line per peer, as the smoke prints it when it ends."""
    lines = []
    for p in run["peers"]:
        lines.append(f"gpu_smoke | {p['device_name']} | {run['config']['preset']} ({p['params'] / 1e6:.1f}M params) | "
                     f"{p['rounds_done']}/{run['rounds_asked']} rounds | {p['tokens_per_s']:,.0f} tok/s | MFU {_pct(p['mfu'])} | "
                     f"peak {p['peak_memory_kind']} {_mb(p['peak_memory_bytes'])} | syncs: {p['syncs']['verdict']}"
                     + ("" if p["syncs"]["per_step"] is None else f" ({p['syncs']['per_step']:.3f} per inner step)"))
    lines.append(f"gpu_smoke | peers in sync with the coordinator: {'yes' if run['peers_in_sync'] else 'NO'}")
    return "\n".join(lines)


def render(run: dict, source: str) -> str:
    from machine_info import machine_lines

    cfg, how = run["config"], run["run"]
    cuda = is_cuda_run(run)
    lines = ["# GPU smoke", ""]
    if not cuda:
        lines += ["> **CPU dry run**: no GPU was used. This report exercises the smoke's code path only; its figures are",
                  "> not a GPU measurement, and benchmarks/gpu.md is never written from such a run.", ""]
    lines += [f"Written by `scripts/gpu_report.py` from `{source}`, which `scripts/gpu_smoke.py` wrote: a coordinator and "
              f"{cfg['peers']} peer(s) as processes on loopback, the peers training on `{cfg['device']}`.",
              f"- run: preset {cfg['preset']}, tokenizer {cfg['tokenizer']}, batch {cfg['batch_size']} x seq_len {cfg['seq_len']}, "
              f"H = {cfg['inner_steps']}, {cfg['rounds']} rounds, codec {cfg['codec']}, outer {how['outer']} (lr {how['outer_lr']}), "
              f"aggregator {how['aggregator']}, {how['exchange']} exchange, inner.precision {how['precision']}, "
              f"torch.compile {'on' if cfg['compile'] else 'off'}, seed {how['seed']}, run config {how['config_hash'][:12]}",
              f"- command: `{run['command']}`; commit {run['commit']}; finished {run['finished_at']}; wall {run['wall_s']:.0f} s",
              *machine_lines(run.get("machine"), run.get("load_before"), run.get("load_after")), "",
              "| peer | device | params | autocast | rounds done | tokens/s (rounds 2+) | tokens/s (round 1) | MFU | peak memory "
              "| host syncs in the inner loop | syncs per inner step |",
              "|---|---|---:|---|---:|---:|---:|---:|---|---|---:|"]
    for p in run["peers"]:
        s = p["syncs"]
        syncs = s["verdict"] if not s["applicable"] else f"{s['verdict']}: {s['total']} (allowed {s['allowed']})"
        first = "n/a" if p["first_round_tokens_per_s"] is None else f"{p['first_round_tokens_per_s']:,.0f}"
        lines.append(f"| {p['peer_id'][:8]} | {p['device_name']} | {p['params'] / 1e6:.1f}M | {p['autocast']} | "
                     f"{p['rounds_done']}/{run['rounds_asked']} | {p['tokens_per_s']:,.0f} | {first} | {_pct(p['mfu'])} | "
                     f"{_mb(p['peak_memory_bytes'])} ({p['peak_memory_kind']}) | {syncs} | "
                     f"{'n/a' if s['per_step'] is None else format(s['per_step'], '.3f')} |")
    lines += ["", "Checks:",
              f"- every peer did every round asked ({run['rounds_asked']}): **{'yes' if all(p['rounds_done'] == run['rounds_asked'] for p in run['peers']) else 'NO'}**",
              f"- peers in sync with the coordinator (every round, and the final hash): **{'yes' if run['peers_in_sync'] else 'NO'}**"]
    if cuda:
        clean = all(not p["syncs"]["calls_over_allowance"] for p in run["peers"])
        lines.append(f"- no host sync per inner step (at most one loss read per report + one per round): **{'yes' if clean else 'NO'}**")
    else:
        lines.append("- host syncs: not applicable on CPU (no device to wait for)")
    sites = {where: n for p in run["peers"] for where, n in p["syncs"]["sites"].items()}
    if sites:
        lines += ["", "Where the inner loop synced (from torch.cuda.set_sync_debug_mode warnings, all peers):", ""]
        lines += [f"- `{where}`: {n}" for where, n in sorted(sites.items(), key=lambda kv: -kv[1])]
    lines += ["", "The last progress line of each peer (peer/run/progress.py):", "", "```",
              *[p["progress_line"] for p in run["peers"]], "```"]
    return "\n".join(lines)


def write_report(json_path: Path, md_path: Path) -> int:
    """Render json_path into md_path; 2 (and nothing written) for a CPU run aimed at benchmarks/gpu.md."""
    from machine_info import write_keeping_notes

    run = json.loads(Path(json_path).read_text())
    if not is_cuda_run(run) and Path(md_path).resolve() == GPU_MD.resolve():
        print(f"gpu_report: {json_path} is a CPU dry run (--device {run['config']['device']}); benchmarks/gpu.md records CUDA runs only. "
              "Run scripts/gpu_smoke.py on a machine with a GPU, or pass --md PATH to write the dry run's report elsewhere.",
              file=sys.stderr)
        return 2
    try:
        source = str(Path(json_path).resolve().relative_to(ROOT))
    except ValueError:
        source = Path(json_path).name
    write_keeping_notes(md_path, render(run, source))
    print(f"wrote {md_path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("json", help="a JSON written by scripts/gpu_smoke.py")
    parser.add_argument("--md", default=str(GPU_MD), help="where to write the report (default benchmarks/gpu.md, CUDA runs only)")
    args = parser.parse_args(argv)
    return write_report(Path(args.json), Path(args.md))


if __name__ == "__main__":
    sys.exit(main())
