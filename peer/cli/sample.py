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


def print_run_sample(checkpoint_path, config_path=None, prompt: str = "def ", max_tokens: int = 80) -> None:
    """A short sample from a finished run's checkpoint (the demo's last lines); never fails the caller."""
    import torch

    from peer.cli.checkpoint_model import load_checkpoint_model
    from peer.learn.sampling import generate

    try:
        model, cfg, codec = load_checkpoint_model(str(checkpoint_path), str(config_path) if config_path else None)
    except (OSError, ValueError) as exc:
        print(f"(no sample: {exc})", flush=True)
        return
    out = generate(model, torch.tensor([codec.encode(prompt)]), max_tokens, temperature=0.8, top_k=50,
                   generator=torch.Generator().manual_seed(0))
    print(f"sample from the final model (prompt {prompt!r}, temperature 0.8, top-k 50, {max_tokens} tokens; "
          f"swarmloco sample --checkpoint {checkpoint_path} for more):\n{codec.decode(out[0].tolist())}", flush=True)
