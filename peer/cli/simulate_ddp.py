"""The reference DiLoCo is compared to: synchronous data-parallel training of the same peers.

Every step, each of the n peers draws a (B, T) batch from its own shard; gradients are averaged
across peers and ONE AdamW step (the run's inner lr, warm-up, clip and weight decay) moves the
shared model. Averaging n per-peer mean losses over equal batch sizes is the same as the mean
loss over the concatenated (n*B, T) batch, so the step is InnerTrainer's own step on a sampler
that concatenates the peers' batches: no second copy of the optimizer code, and bit-for-bit the
same gradient a real all-reduce of per-peer gradients would give (up to float summation order).

Bytes are not measured here (there is no payload): a ring all-reduce of a dense fp32 gradient of
d values makes each peer send 2(n-1)/n * 4d bytes and receive as many, every step.
"""

from __future__ import annotations

import torch

from peer.learn.data import ShardSampler


class ConcatenatedSampler:
    """next_batch() -> x, y of shape (n*B, T): one (B, T) batch from each peer's sampler, in peer order."""

    def __init__(self, samplers: list[ShardSampler]) -> None:
        if not samplers:
            raise ValueError("ConcatenatedSampler needs at least one peer sampler")
        self.samplers = samplers

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        batches = [sampler.next_batch() for sampler in self.samplers]
        return torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches])


def ring_allreduce_bytes(numel: int, peers: int) -> int:
    """Bytes one peer sends plus receives in one ring all-reduce of a dense fp32 (d,) vector:
    reduce-scatter then all-gather, each moving (n-1)/n of the vector out and as much in."""
    if peers < 2:
        return 0
    return round(2 * 2 * (peers - 1) / peers * 4 * numel)
