"""`swarmloco sample --checkpoint RUN.ckpt --prompt "def "`: text from a run's model."""

from __future__ import annotations

import argparse


def main(args: argparse.Namespace) -> int:
    import torch

    from peer.cli.checkpoint_model import load_checkpoint_model
    from peer.learn.sampling import generate

    model, cfg, codec = load_checkpoint_model(args.checkpoint, args.config)
    ids = codec.encode(args.prompt) or [0]
    generator = torch.Generator().manual_seed(args.seed)
    out = generate(model, torch.tensor([ids]), args.max_tokens, temperature=args.temperature, top_k=args.top_k, generator=generator)
    print(codec.decode(out[0].tolist()), flush=True)
    return 0
