"""How fast a peer trains where it runs, with nothing else of the swarm running: the run config's
model and inner AdamW on shard 0 of its corpus, one torch thread, for a given number of seconds
after a warm-up; prints one JSON line {"steps": n, "seconds": s, "cpu_s": c} (c: the CPU seconds
this process used meanwhile, all threads: steps / c is what a CPU-second of it trains).

scripts/bench_heterogeneous.py starts one in each peer's cgroup at once (the same quotas the
swarm's peers get) to calibrate what each quota buys: a CPU quota's training rate is not exactly
proportional to it (each throttled period resumes with cold caches), so the compute a peer
offers is this measured rate, not its quota.

    .venv/bin/python scripts/speed_probe.py RUN.json SECONDS [--wait-go]

--wait-go: once set up and warmed up, print {"ready": true} and wait for a line on stdin before
timing: the caller can then throttle it (its set-up, ~7 CPU-seconds of imports and corpus, would
take minutes under a small quota) and start every probe's timing at once.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

WARMUP_STEPS = 5


def main(argv: list[str]) -> int:
    import torch

    from peer.learn.data import ShardSampler, load_corpus
    from peer.learn.model import build_model
    from peer.learn.training import InnerTrainer
    from peer.run.config import RunConfig

    wait_go = "--wait-go" in argv
    argv = [a for a in argv if a != "--wait-go"]
    if len(argv) != 2:
        print("usage: speed_probe.py RUN.json SECONDS [--wait-go]", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    cfg = RunConfig.from_dict(json.loads(Path(argv[0]).read_text()))
    corpus = load_corpus(cfg.data, seq_len=cfg.model.seq_len)
    sampler = ShardSampler(corpus.train, shard=0, num_shards=1, batch_size=cfg.data.batch_size, seq_len=cfg.model.seq_len, seed=cfg.seed)
    trainer = InnerTrainer(build_model(cfg.model, cfg.seed), cfg.inner, sampler)
    trainer.run(WARMUP_STEPS, lambda step, loss: None, log_every=10**9)
    seconds = float(argv[1])
    if wait_go:
        print(json.dumps({"ready": True}), flush=True)
        if not sys.stdin.readline():
            return 1  # the caller went away
    start, cpu_start = time.monotonic(), time.process_time()
    closes = start + seconds
    stats = trainer.run(10**9, lambda step, loss: None, log_every=10**9, stop=lambda: time.monotonic() >= closes)
    print(json.dumps({"steps": stats.steps, "seconds": time.monotonic() - start, "cpu_s": time.process_time() - cpu_start}), flush=True)
    # Skip the interpreter's teardown: under a small CPU quota its collection of torch's objects ran
    # for minutes (gc_collect_main; 30 CPU-seconds seen at 0.1 core), holding the caller's calibration.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
