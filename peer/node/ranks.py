"""A peer of several ranks (GPUs, or CPU processes with gloo): one peer to the swarm.

`swarmloco peer --nproc N ...` re-executes itself under torchrun (or start it as
`torchrun --nproc-per-node N -m peer.cli.main peer ...`). Rank 0 is the PeerNode: it alone joins,
commits and exchanges. The other ranks are followers (follow): they build the same model, optimizer
and data stream from a setup message rank 0 broadcasts after it joined, and then, each round, take
θ from rank 0 (a broadcast: every rank starts the round from the same parameters) and run the same
H inner steps in lockstep under DistributedDataParallel. Each rank trains on its 1/N of the rows of
the peer's batch (data.batch_size, drawn by the same sampler everywhere), DDP averages the
gradients, so every rank takes the step one process would take on the whole batch and rank 0's
parameters give the peer's one pseudo-gradient (tests/test_multirank.py).

Hooks in peer/node/node.py: attach (after the trainer is built), start_round (before the inner
steps), detach (at close); in peer/cli/main.py: before_peer.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Any

import torch
import torch.distributed as dist

from peer.learn.data import DeviceSampler, peer_sampler
from peer.learn.model import build_model, flat_params, load_flat_params
from peer.learn.training import InnerTrainer
from peer.run.config import RunConfig


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def before_peer(args: argparse.Namespace) -> int | None:
    """`--nproc N`: become torchrun with N ranks of this command. Under torchrun: join the process
    group; a follower rank runs here to the end (its exit code), rank 0 goes on as the peer (None)."""
    nproc = getattr(args, "nproc", None) or 1
    if nproc > 1 and world_size() == 1:
        argv = _without_nproc(sys.argv[1:])
        os.execv(sys.executable, [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                                  "-m", "peer.cli.main", *argv])
    if world_size() == 1:
        return None
    device = args.device
    if device.startswith("cuda"):
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend="cpu:gloo,cuda:nccl" if device.startswith("cuda") else "gloo")
    if rank() == 0:
        return None
    try:
        follow()
        return 0
    finally:
        dist.destroy_process_group()


def _device(name: str) -> str:
    return f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if name.startswith("cuda") else name


def _broadcast(obj: Any = None) -> Any:
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class RankSlice:
    """This rank's rows of the peer's batch: rows [r B/N, (r + 1) B/N) of every (B, T) batch."""

    def __init__(self, sampler, rank_: int, world: int, batch_size: int) -> None:
        if batch_size % world:
            raise ValueError(f"data.batch_size={batch_size} does not split over {world} ranks; use a multiple of {world}")
        self.sampler, self.rows = sampler, slice(rank_ * batch_size // world, (rank_ + 1) * batch_size // world)

    def next_batch(self):
        x, y = self.sampler.next_batch()
        return x[self.rows], y[self.rows]

    def state_dict(self):
        return self.sampler.state_dict()

    def load_state_dict(self, state) -> None:
        self.sampler.load_state_dict(state)


def distributed_trainer(model: torch.nn.Module, cfg: RunConfig, sampler, device: str) -> InnerTrainer:
    """An InnerTrainer whose steps run through DDP on this rank's share of each batch."""
    from torch.nn.parallel import DistributedDataParallel

    ddp = DistributedDataParallel(model, device_ids=[torch.device(device).index] if device.startswith("cuda") else None)
    sliced = RankSlice(sampler, dist.get_rank(), dist.get_world_size(), cfg.data.batch_size)
    return InnerTrainer(model, cfg.inner, sliced, train_model=ddp)


def attach(node) -> None:
    """Rank 0, after its trainer is built: tell the followers how to build theirs, go through DDP."""
    if world_size() == 1:
        return
    o = node.options
    _broadcast({"config": node.cfg.to_json(), "data": o.data, "shard": node.sampler.shard, "num_shards": node.sampler.num_shards,
                "device": o.device, "threads": o.threads})
    node.trainer = distributed_trainer(node.model, node.cfg, DeviceSampler(node.sampler, _device(o.device)), _device(o.device))
    node.ranks_synced = False


def start_round(node, steps: int) -> None:
    """Rank 0, before the inner steps: send the followers θ (and, once, the optimizer and data
    position, so a resumed peer's ranks agree), then all ranks train `steps` steps."""
    if world_size() == 1:
        return
    state = None if node.ranks_synced else node.trainer.state_dict()
    _broadcast(("train", steps, state))
    node.ranks_synced = True
    dist.broadcast(flat_params(node.model).to(_device(node.options.device)), src=0)


def detach(node) -> None:
    """Rank 0, at close: release the followers."""
    if world_size() == 1 or not dist.is_initialized():
        return
    if getattr(node, "ranks_synced", None) is not None:
        _broadcast(("stop", 0, None))
    dist.destroy_process_group()


def follow() -> None:
    """A follower rank: build what rank 0 describes, then train in lockstep until it says stop."""
    setup = _broadcast()
    cfg = RunConfig.from_json(setup["config"])
    device = _device(setup["device"])
    if setup["threads"]:
        torch.set_num_threads(setup["threads"])
    model = build_model(cfg.model, cfg.seed).to(device)
    data_cfg = cfg.data if setup["data"] is None else dataclasses.replace(cfg.data, path=setup["data"])
    sampler, _ = peer_sampler(data_cfg, seq_len=cfg.model.seq_len, seed=cfg.seed, peer_id="",  # rank 0's shard, as told
                              shard=setup["shard"], num_shards=setup["num_shards"])
    trainer = distributed_trainer(model, cfg, DeviceSampler(sampler, device), device)
    theta = torch.empty_like(flat_params(model)).to(device)
    while True:
        command, steps, state = _broadcast()
        if command == "stop":
            return
        if state is not None:
            trainer.load_state_dict(state)
        dist.broadcast(theta, src=0)
        load_flat_params(model, theta)
        trainer.run(steps)


def _without_nproc(argv: list[str]) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip or arg.startswith("--nproc="):
            skip = False
            continue
        skip = arg == "--nproc"
        if not skip:
            out.append(arg)
    return out
