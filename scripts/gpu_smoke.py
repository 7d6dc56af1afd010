"""GPU smoke: a local swarm whose peers train a llama preset on CUDA; tokens/s, MFU, peak memory
and the host syncs of the inner loop, written to a JSON (benchmarks/gpu.md is made from it by
scripts/gpu_report.py).

    .venv/bin/python scripts/gpu_smoke.py --json benchmarks/gpu.json --write-md          # CUDA, llama-60m
    .venv/bin/python scripts/gpu_smoke.py --preset llama-150m --peers 2 --rounds 4 --inner-steps 100
    .venv/bin/python scripts/gpu_smoke.py --device cpu --preset tiny --rounds 2 --inner-steps 4  # the same path on CPU
    .venv/bin/python scripts/gpu_report.py benchmarks/gpu.json                          # the md again from the JSON

The swarm is the real one: a coordinator and 1-2 peers started as processes on loopback by
peer.cli.launcher.Swarm (as `swarmloco demo` starts them), the peers with `--device cuda`. Each
peer runs through this module (`python -m gpu_smoke peer ...`, the `swarmloco peer` command line
unchanged) so that its inner loop can be observed from inside the process without a line of
measurement code in peer/: `InnerTrainer.run` is wrapped, and each call's steps, tokens, seconds,
the trainer's own MFU (peer/learn/throughput.py, the figure the progress line prints) and the host
syncs are appended to PEER.json.inner.json next to the peer's --summary-json.

Counting host syncs. Inside each `InnerTrainer.run` call `torch.cuda.set_sync_debug_mode("warn")`
is on, and the warnings it raises are recorded (`warnings.catch_warnings(record=True)`). PyTorch's
CUDA code then warns at every operation that blocks the host on the device: `.item()`,
`.tolist()`, `.cpu()` of a CUDA tensor, a blocking copy (host -> device from pageable memory
too), `nonzero`, ... Each warning carries the Python line that caused it, so the JSON
lists the sites with their counts. This is chosen over a profiler trace (counting
`cudaStreamSynchronize` / `cudaMemcpy*` events) because it needs no CUPTI, costs nothing when no
sync happens, and names the line to fix; it does not see a sync that a C++ extension makes on its
own stream. The inner loop is allowed to read the loss when it reports (`on_step`, every
--log-every steps and after the last) and once per call (the losses, stacked: one `.tolist()`),
so a call of S steps with R reports may sync R + 1 times; the check passes when every call stays
within that, i.e. nothing syncs per step. The peers here log once per call (--log-every is the
round's H), so a clean loop syncs twice per round whatever H is. On CPU no operation syncs with a
device and the count is "not applicable on CPU".

Throughput: tokens / seconds of each call (InnerStats, the trainer's own count); the first round is
reported apart (CUDA context, allocator warm-up, torch.compile when on) and the steady figure is
over the rounds after it. Peak memory: torch.cuda.max_memory_allocated / max_memory_reserved of
the peer process on CUDA; on CPU the peak resident set (ru_maxrss), labelled so.

Without CUDA, `--device cuda` (the default) stops at once with exit status 2 and says what it
needs; `--device cpu` runs the same code path on CPU.

On a lent nvidia-h200 (the `device` tool; /work/.library/device/README.md): its image's python3
(3.12) has torch, grpcio, protobuf, tokenizers, safetensors, prometheus-client, but not hivemind
nor the small packages hivemind and this project need beside it (as of 2026-11: hivemind,
cryptography, base58, varint, netaddr, py-multihash, py-cid, prefetch-generator, configargparse,
pydantic and its core; check with `python3 -m pip show` there first). Download those as cp312
manylinux wheels into an ignored .whl/ here, carry it, install them with --target and PYTHONPATH
as that README says, and run `python3 scripts/gpu_smoke.py --write-md` (as root: the swarm binds
loopback ports only). One run of the defaults is 3 rounds of H = 50 at batch 16 x 512 on
llama-60m: start-up and the coordinator's CPU evaluation dominate its wall time, not the GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for extra in (str(ROOT), str(ROOT / "scripts")):
    if extra not in sys.path:
        sys.path.insert(0, extra)

TINY = "tiny"  # the demo's byte-level GPT (~0.5M parameters): the CPU dry run
INNER_SUFFIX = ".inner.json"


@dataclass(kw_only=True, slots=True)
class SmokeConfig:
    """One smoke run. Model size and batch are the run's (served by the coordinator to every peer)."""

    preset: str = "llama-60m"  # a peer/run/presets.py name, or "tiny"
    device: str = "cuda"  # cuda or cpu
    peers: int = 1
    rounds: int = 3
    inner_steps: int = 50  # H
    batch_size: int = 16
    seq_len: int = 512
    tokenizer: str = "bytes"  # bytes (no tokenizer to train) or bpe (trained on the corpus at start)
    codec: str = "int8"
    compile: bool = False
    val_batches: int = 2  # the coordinator's val loss per round (on its CPU): kept small, it is not measured here
    max_corpus_bytes: int = 8_000_000  # data.max_corpus_bytes: what each process reads of the corpus at start

    def __post_init__(self) -> None:
        from peer.run.presets import PRESETS

        if self.preset != TINY and self.preset not in PRESETS:
            raise ValueError(f"--preset {self.preset!r}: choose {TINY} or one of {', '.join(PRESETS)}")
        if self.device not in ("cuda", "cpu"):
            raise ValueError(f"--device {self.device!r}: choose cuda or cpu")
        if not 1 <= self.peers <= 2:
            raise ValueError(f"--peers {self.peers}: the smoke runs 1 or 2 peers (one device each would share it)")
        for name in ("rounds", "inner_steps", "batch_size", "seq_len", "val_batches", "max_corpus_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} {getattr(self, name)}: use at least 1")
        if self.tokenizer not in ("bytes", "bpe"):
            raise ValueError(f"--tokenizer {self.tokenizer!r}: choose bytes or bpe")
        if self.preset == TINY and self.tokenizer == "bpe":
            raise ValueError("--preset tiny is the byte-level GPT: use --tokenizer bytes, or a llama preset for bpe")


def cuda_missing(device: str) -> str:
    """'' when `device` can be used, else what is missing and what to do."""
    if device != "cuda":
        return ""
    import torch

    if torch.cuda.is_available():
        return ""
    build = f"torch {torch.__version__}" + ("" if torch.version.cuda else " (a CPU-only build)")
    return (f"CUDA is not available here ({build}, {torch.cuda.device_count()} devices visible). This smoke needs an NVIDIA GPU "
            "and a CUDA build of torch in .venv (`.venv/bin/pip install torch` on Linux x86 installs one); "
            "or pass --device cpu to run the same code path on CPU (no sync counts, no MFU)")


def write_smoke_config(cfg: SmokeConfig, workdir: Path) -> Path:
    """The run config the coordinator serves: the demo run (scripts/measure_bandwidth.py's) with this
    model, batch and H, every peer required in every round."""
    from measure_bandwidth import write_run_config
    from peer.cli.run_flags import resolve_run_config

    path = write_run_config(workdir, peers=cfg.peers, rounds=cfg.rounds, inner_steps=cfg.inner_steps, codec=cfg.codec)
    overrides = {"data.batch_size": cfg.batch_size, "model.seq_len": cfg.seq_len, "data.val_batches": cfg.val_batches,
                 "data.max_corpus_bytes": cfg.max_corpus_bytes,
                 "inner.compile": cfg.compile, "rounds.min_peers": cfg.peers, "rounds.expected_peers": cfg.peers,
                 "max_payload_bytes": 1 << 30}
    if cfg.preset != TINY:
        overrides |= {"model.preset": cfg.preset, "data.tokenizer": cfg.tokenizer}
    path.write_text(resolve_run_config(path, overrides).to_json())
    return path


# ---- inside a peer process: `python -m gpu_smoke peer ...` -------------------------------------


def measured_peer() -> int:
    """`swarmloco peer` (sys.argv[1:] is its command line), with every InnerTrainer.run call recorded."""
    import warnings

    import torch

    from peer.cli.main import main as cli_main
    from peer.learn.training import InnerTrainer

    argv = sys.argv[1:]
    record_path = Path(argv[argv.index("--summary-json") + 1] + INNER_SUFFIX)
    calls: list[dict] = []
    original = InnerTrainer.run

    def recorded_run(self, steps, on_step=None, *, log_every=1, stop=None):
        reports = [0]

        def counting_on_step(step: int, loss: float) -> None:
            reports[0] += 1
            if on_step is not None:
                on_step(step, loss)

        cuda = self.device.type == "cuda"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if cuda:
                torch.cuda.set_sync_debug_mode("warn")
            try:
                stats = original(self, steps, counting_on_step if on_step is not None else None, log_every=log_every, stop=stop)
            finally:
                if cuda:
                    torch.cuda.set_sync_debug_mode("default")
        syncs = [w for w in caught if "synchroniz" in str(w.message)]
        for w in caught:
            if w not in syncs:
                warnings.showwarning(w.message, w.category, w.filename, w.lineno)
        sites: dict[str, int] = {}
        for w in syncs:
            where = f"{os.path.relpath(w.filename, ROOT)}:{w.lineno}"
            sites[where] = sites.get(where, 0) + 1
        tps = stats.tokens / max(stats.seconds, 1e-9)
        calls.append({"steps": stats.steps, "tokens": stats.tokens, "seconds": stats.seconds, "tokens_per_s": tps,
                      "mfu": self.mfu(tps), "reports": reports[0], "syncs": len(syncs) if cuda else None, "sync_sites": sites,
                      "mean_loss": stats.mean_loss})
        record = {"device": str(self.device), "device_name": torch.cuda.get_device_name(self.device) if cuda else "cpu",
                  "params": sum(p.numel() for p in self.model.parameters()), "flops_per_token": self.flops_per_token,
                  "peak_flops": self.peak_flops, "autocast": str(self.autocast_dtype), "calls": calls, **peak_memory(self.device)}
        record_path.write_text(json.dumps(record, indent=2))
        return stats

    InnerTrainer.run = recorded_run
    return cli_main()


def peak_memory(device) -> dict:
    import resource

    import torch

    if device.type == "cuda":
        return {"peak_memory_kind": "cuda max_memory_allocated", "peak_memory_bytes": torch.cuda.max_memory_allocated(device),
                "peak_reserved_bytes": torch.cuda.max_memory_reserved(device)}
    return {"peak_memory_kind": "process peak RSS (ru_maxrss)", "peak_memory_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "peak_reserved_bytes": None}


# ---- the smoke run -------------------------------------------------------------------------------


def summarize_peer(summary: dict, inner: dict, coordinator_hash: str) -> dict:
    """One peer's figures from its --summary-json and its recorded inner calls."""
    calls = inner["calls"]
    steady = calls[1:] or calls  # the first call carries the warm-up
    tokens, seconds = sum(c["tokens"] for c in steady), sum(c["seconds"] for c in steady)
    tps = tokens / max(seconds, 1e-9)
    cuda = inner["device"].startswith("cuda")
    per_token, peak = inner["flops_per_token"], inner["peak_flops"]
    over = [i for i, c in enumerate(calls) if cuda and c["syncs"] > c["reports"] + 1]
    sites: dict[str, int] = {}
    for c in calls:
        for where, n in c["sync_sites"].items():
            sites[where] = sites.get(where, 0) + n
    history = summary.get("history", [])
    return {
        "peer_id": summary.get("peer_id", "?"), "device": inner["device"], "device_name": inner["device_name"],
        "params": inner["params"], "autocast": inner["autocast"], "rounds_done": len(history),
        "in_sync_every_round": bool(history) and all(r["in_sync"] for r in history),
        "final_hash": summary.get("param_hash") or summary.get("final_hash"), "coordinator_hash": coordinator_hash,
        "updates_per_round": [r["updates"] for r in history], "train_loss_per_round": [r["train_loss"] for r in history],
        "inner_calls": len(calls), "inner_steps": sum(c["steps"] for c in calls),
        "first_round_tokens_per_s": calls[0]["tokens_per_s"] if calls else None,
        "tokens_per_s": tps, "mfu": None if peak is None else tps * per_token / peak, "peak_flops": peak,
        "peak_memory_kind": inner["peak_memory_kind"], "peak_memory_bytes": inner["peak_memory_bytes"],
        "peak_reserved_bytes": inner["peak_reserved_bytes"],
        "syncs": {"applicable": cuda, "total": sum(c["syncs"] for c in calls) if cuda else None,
                  "allowed": sum(c["reports"] + 1 for c in calls) if cuda else None,
                  "per_step": (sum(c["syncs"] for c in calls) / max(1, sum(c["steps"] for c in calls))) if cuda else None,
                  "calls_over_allowance": over, "sites": sites,
                  "verdict": ("no per-step host sync" if not over else "host sync per step") if cuda else "not applicable on CPU"},
    }


def wait_for_swarm(swarm, coordinator, peers: list, timeout_s: float) -> dict[str, int | None]:
    """Every child's exit code once all have exited, or as soon as one fails (a failed peer's error
    is the news: the coordinator would wait on for it); None for one still running then."""
    deadline = time.monotonic() + timeout_s
    children = [coordinator, *peers]
    while time.monotonic() < deadline and any(c.alive() for c in children):
        if any(not c.alive() and c.process.returncode != 0 for c in children):
            break
        time.sleep(0.2)
    return {c.name: c.process.poll() for c in children}


def run_smoke(cfg: SmokeConfig, workdir: Path, *, echo: bool = False) -> dict:
    from machine_info import command_line, load_average, machine_facts
    from peer.cli.launcher import Swarm
    from peer.run.config import RunConfig

    workdir.mkdir(parents=True, exist_ok=True)
    config_path = write_smoke_config(cfg, workdir)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "scripts"), str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    load_before, started = load_average(), time.monotonic()
    timeout_s = 300 + 120 * cfg.rounds
    with Swarm(workdir, echo=echo) as swarm:
        coordinator = swarm.start_coordinator(["--config", str(config_path)])
        peers = [swarm.start_peer(f"peer{i}", ["--shard", f"{i}/{cfg.peers}", "--device", cfg.device,
                                               "--log-every", str(cfg.inner_steps)], module="gpu_smoke")
                 for i in range(cfg.peers)]
        codes = wait_for_swarm(swarm, coordinator, peers, timeout_s)
    if any(code != 0 for code in codes.values()):
        logs = "\n".join(f"--- {name}.log\n{(workdir / f'{name}.log').read_text()[-2500:]}" for name in codes)
        raise RuntimeError(f"the smoke swarm failed (exit codes {codes}):\n{logs}")
    coordinator_summary = json.loads((workdir / "coordinator.json").read_text())
    coordinator_hash = coordinator_summary.get("param_hash", "")
    rows = []
    for child in peers:
        summary = json.loads((workdir / f"{child.name}.json").read_text())
        finished = [line for line in child.lines if "finished at round" in line]
        summary.setdefault("final_hash", finished[-1].rsplit("hash ", 1)[-1].strip() if finished else None)
        row = summarize_peer(summary, json.loads((workdir / f"{child.name}.json{INNER_SUFFIX}").read_text()), coordinator_hash)
        row["progress_line"] = next((line.strip() for line in reversed(child.lines) if "tok/s" in line), "")
        rows.append(row)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    served = json.loads(config_path.read_text())
    how = {"outer": served["outer"]["name"], "outer_lr": served["outer"]["lr"], "aggregator": served["aggregation"]["name"],
           "exchange": served["exchange"]["mode"], "seed": served["seed"], "precision": served["inner"]["precision"],
           "config_hash": RunConfig.from_json(config_path.read_text()).config_hash()}
    return {"config": asdict(cfg), "run": how, "rounds_asked": cfg.rounds, "coordinator_rounds": len(coordinator_summary.get("history", [])),
            "coordinator_hash": coordinator_hash, "peers": rows,
            "peers_in_sync": all(r["in_sync_every_round"] and r["final_hash"] and coordinator_hash.startswith(r["final_hash"]) for r in rows),
            "wall_s": time.monotonic() - started, "machine": machine_facts(), "load_before": load_before, "load_after": load_average(),
            "command": command_line(), "commit": head or "unknown", "finished_at": time.strftime("%Y-%m-%d %H:%M:%S")}


def main(argv: list[str] | None = None) -> int:
    if (argv if argv is not None else sys.argv[1:])[:1] == ["peer"]:
        return measured_peer()
    defaults = SmokeConfig()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default=defaults.preset, help=f"a llama preset (llama-20m ... llama-1b) or {TINY} (the demo GPT)")
    parser.add_argument("--device", default=defaults.device, help="cuda (default) or cpu (the same path, no sync counts)")
    parser.add_argument("--peers", type=int, default=defaults.peers)
    parser.add_argument("--rounds", type=int, default=defaults.rounds)
    parser.add_argument("--inner-steps", type=int, default=defaults.inner_steps, help="H")
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--seq-len", type=int, default=defaults.seq_len)
    parser.add_argument("--tokenizer", default=defaults.tokenizer, help="bytes (default) or bpe")
    parser.add_argument("--codec", default=defaults.codec)
    parser.add_argument("--max-corpus-bytes", type=int, default=defaults.max_corpus_bytes, help="data.max_corpus_bytes")
    parser.add_argument("--compile", action="store_true", help="inner.compile: torch.compile the model")
    parser.add_argument("--workdir", help="where the swarm's logs go (default: a new temporary folder)")
    parser.add_argument("--json", default=str(ROOT / "benchmarks/gpu.json"))
    parser.add_argument("--write-md", nargs="?", const=str(ROOT / "benchmarks/gpu.md"), metavar="PATH",
                        help="also write the report (scripts/gpu_report.py; a CPU run only to a path other than benchmarks/gpu.md)")
    parser.add_argument("--echo", action="store_true", help="print the swarm's progress lines")
    args = parser.parse_args(argv)
    try:
        cfg = SmokeConfig(preset=args.preset, device=args.device, peers=args.peers, rounds=args.rounds, inner_steps=args.inner_steps,
                          batch_size=args.batch_size, seq_len=args.seq_len, tokenizer=args.tokenizer, codec=args.codec, compile=args.compile,
                          max_corpus_bytes=args.max_corpus_bytes)
    except ValueError as exc:
        parser.error(str(exc))
    missing = cuda_missing(cfg.device)
    if missing:
        print(f"gpu_smoke: {missing}. Nothing was run.", file=sys.stderr)
        return 2
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="swarmloco-gpu-smoke-"))
    run = run_smoke(cfg, workdir, echo=args.echo)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(run, indent=2))
    from gpu_report import headline

    print(headline(run))
    print(f"wrote {args.json} (logs in {workdir})")
    if args.write_md:
        from gpu_report import write_report

        return write_report(Path(args.json), Path(args.write_md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
