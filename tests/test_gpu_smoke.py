"""scripts/gpu_smoke.py and scripts/gpu_report.py: the CPU path of the GPU smoke (a real swarm on
loopback, the peer through the smoke's measuring wrapper), the report made from its JSON, the
refusal to write benchmarks/gpu.md from a CPU run, and the message when CUDA is missing. The sync
check's arithmetic (which only a GPU run exercises end to end) is tested on recorded calls."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from gpu_report import GPU_MD, render  # noqa: E402
from gpu_smoke import summarize_peer  # noqa: E402


def script(name: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / name), *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory) -> tuple[Path, dict]:
    folder = tmp_path_factory.mktemp("gpu_smoke")
    out = folder / "smoke.json"
    done = script("gpu_smoke.py", "--device", "cpu", "--preset", "tiny", "--rounds", "2", "--inner-steps", "3", "--batch-size", "4",
                  "--seq-len", "32", "--max-corpus-bytes", "300000", "--json", str(out), "--workdir", str(folder / "swarm"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "peers in sync with the coordinator: yes" in done.stdout
    return out, json.loads(out.read_text())


def test_cpu_run_records_real_figures(cpu_run):
    _, run = cpu_run
    assert run["rounds_asked"] == 2 and run["coordinator_rounds"] == 2
    assert run["peers_in_sync"] is True
    assert run["machine"]["versions"]["torch"] == torch.__version__
    assert run["run"]["outer"] == "nesterov" and run["run"]["exchange"] == "sliced" and run["run"]["seed"] == 0
    assert run["run"]["aggregator"] and len(run["run"]["config_hash"]) == 64
    (peer,) = run["peers"]
    assert peer["device"] == "cpu" and peer["rounds_done"] == 2 and peer["in_sync_every_round"]
    assert peer["final_hash"] == run["coordinator_hash"] and len(peer["final_hash"]) == 64
    assert peer["inner_calls"] == 2 and peer["inner_steps"] == 6  # H = 3, two rounds
    assert peer["updates_per_round"] == [1, 1]
    assert peer["params"] > 100_000  # the demo's byte GPT
    assert 0 < peer["tokens_per_s"] < 1e8 and 0 < peer["first_round_tokens_per_s"] < 1e8
    assert peer["mfu"] is None  # no peak figure for a CPU
    assert peer["peak_memory_kind"].startswith("process peak RSS") and peer["peak_memory_bytes"] > 50 * 2**20
    assert peer["syncs"]["applicable"] is False and peer["syncs"]["verdict"] == "not applicable on CPU"
    assert "tok/s" in peer["progress_line"] and "round 2/2" in peer["progress_line"]


def test_report_is_made_from_the_json_and_refuses_gpu_md(cpu_run, tmp_path):
    out, run = cpu_run
    md = tmp_path / "dry.md"
    done = script("gpu_report.py", str(out), "--md", str(md), timeout=240)
    assert done.returncode == 0, done.stderr
    text = md.read_text()
    assert "**CPU dry run**" in text
    assert f"{run['peers'][0]['tokens_per_s']:,.0f}" in text and "2/2" in text
    assert "not applicable on CPU" in text
    assert text.startswith(render(run, out.name))  # the same JSON gives the same bytes
    before = GPU_MD.read_bytes() if GPU_MD.exists() else None
    refused = script("gpu_report.py", str(out), timeout=240)
    assert refused.returncode == 2
    assert "CPU dry run" in refused.stderr and "benchmarks/gpu.md records CUDA runs only" in refused.stderr
    assert (GPU_MD.read_bytes() if GPU_MD.exists() else None) == before


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the smoke would run")
def test_without_cuda_it_says_what_it_needs():
    done = script("gpu_smoke.py", "--rounds", "1", timeout=240)
    assert done.returncode == 2
    assert "CUDA is not available here" in done.stderr and "--device cpu" in done.stderr and "Nothing was run" in done.stderr


def recorded(calls: list[dict]) -> dict:
    return {"device": "cuda:0", "device_name": "NVIDIA H200", "params": 10, "flops_per_token": 1e9, "peak_flops": 989e12,
            "autocast": "torch.bfloat16", "calls": calls, "peak_memory_kind": "cuda max_memory_allocated",
            "peak_memory_bytes": 2**30, "peak_reserved_bytes": 2**31}


def call(steps: int, syncs: int, sites: dict[str, int]) -> dict:
    return {"steps": steps, "tokens": steps * 1000, "seconds": steps * 0.01, "tokens_per_s": 1e5, "mfu": 0.1, "reports": 1,
            "syncs": syncs, "sync_sites": sites, "mean_loss": 3.0}


def test_sync_check_passes_a_loop_that_reads_the_loss_only_when_it_reports():
    summary = {"peer_id": "ab" * 16, "history": [{"in_sync": True, "updates": 1, "train_loss": 3.0}] * 2, "final_hash": "h"}
    clean = summarize_peer(summary, recorded([call(50, 2, {"peer/learn/training.py:140": 2})] * 2), "h")
    assert clean["syncs"]["verdict"] == "no per-step host sync" and clean["syncs"]["total"] == 4 and clean["syncs"]["allowed"] == 4
    assert clean["syncs"]["per_step"] == pytest.approx(0.04)
    assert clean["mfu"] == pytest.approx(1e5 * 1e9 / 989e12)  # tokens/s of the rounds after the first x FLOPs per token / peak
    per_step = summarize_peer(summary, recorded([call(50, 102, {"peer/learn/data.py:319": 100, "peer/learn/training.py:140": 2})] * 2), "h")
    assert per_step["syncs"]["verdict"] == "host sync per step" and per_step["syncs"]["calls_over_allowance"] == [0, 1]
    assert per_step["syncs"]["sites"]["peer/learn/data.py:319"] == 200
