"""Run under torchrun by tests/test_multirank.py: H inner steps of the tiny model through
peer/node/ranks.py's DDP trainer on each rank's share of the batch; rank 0 saves θ_local."""

import os
import sys

import torch
import torch.distributed as dist

from peer.learn.data import ShardSampler, load_corpus
from peer.learn.model import build_model, flat_params
from peer.node.ranks import distributed_trainer
from peer.run.config import RunConfig

torch.set_num_threads(1)
cfg = RunConfig.from_json(open(sys.argv[1]).read())
dist.init_process_group("gloo")
model = build_model(cfg.model, cfg.seed)
corpus = load_corpus(cfg.data, seq_len=cfg.model.seq_len)
sampler = ShardSampler(corpus.train, shard=0, num_shards=2, batch_size=cfg.data.batch_size, seq_len=cfg.model.seq_len, seed=cfg.seed)
trainer = distributed_trainer(model, cfg, sampler, "cpu")
trainer.run(cfg.inner.steps)
if dist.get_rank() == 0:
    torch.save(flat_params(model), sys.argv[2])
# Both ranks leave together: a rank tearing gloo down while the other still holds the connection
# aborted the other one ("terminate called without an active exception") under load.
dist.barrier()
dist.destroy_process_group()
# And end without finalizing the interpreter, as the peer CLI does (peer/cli/interrupts.py
# skip_finalization): a rank still aborted there once beside a CPU hog, after the barrier and the
# destroy ("terminate called without an active exception": a C++ thread object torn down joinable).
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
