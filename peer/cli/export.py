"""`swarmloco export --checkpoint RUN.ckpt --out DIR`: a llama run's model as Hugging Face files
(model.safetensors, config.json, tokenizer.json) that transformers loads as LlamaForCausalLM."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path


def main(args: argparse.Namespace) -> int:
    from peer.cli.checkpoint_model import load_checkpoint_model
    from peer.learn.hf_checkpoint import export_model
    from peer.learn.model import num_params

    model, cfg, codec = load_checkpoint_model(args.checkpoint, args.config)
    tokenizer_file = None
    if cfg.data.tokenizer == "bpe":
        tokenizer_file = Path(tempfile.mkdtemp(prefix="swarmloco-export-")) / "tokenizer.json"
        tokenizer_file.write_text(codec.json)
    out = export_model(model, cfg, args.out, tokenizer_file)
    print(f"export | {num_params(model):,} parameters ({cfg.model.preset or cfg.model.arch}) -> {out}/model.safetensors, config.json"
          + (", tokenizer.json" if tokenizer_file else " (byte-level: token ids are UTF-8 bytes, no tokenizer file)"))
    print(f"load it: transformers.LlamaForCausalLM.from_pretrained({str(out)!r})")
    return 0
