"""`swarmloco export --checkpoint RUN.ckpt --out DIR`: a llama run's model as Hugging Face files
(model.safetensors, config.json, tokenizer.json) that transformers loads as LlamaForCausalLM."""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path


def refuse_unexportable(checkpoint_path: str):
    """check(cfg) for load_checkpoint_model: a run that is not a llama is refused before anything
    else is said about its checkpoint."""
    from peer.learn.hf_checkpoint import ExportError

    def check(cfg) -> None:
        if cfg.model.arch != "llama":
            raise ExportError(f"{checkpoint_path} is a {cfg.model.arch} run (model.arch = {cfg.model.arch!r}): only llama runs export "
                              "to transformers (a run with model.preset, e.g. llama-20m); sample it instead with "
                              f"swarmloco sample --checkpoint {checkpoint_path}")
    return check


def readable_by_all(out: Path, names: list[str]) -> None:
    """safetensors writes its file with mode 0600 (a private temporary file renamed into place):
    give the exported files the mode any new file gets (0666 less the umask), as config.json has."""
    umask = os.umask(0)
    os.umask(umask)
    for name in names:
        (out / name).chmod(0o666 & ~umask)


def main(args: argparse.Namespace) -> int:
    from peer.cli.checkpoint_model import load_checkpoint_model
    from peer.learn.hf_checkpoint import WEIGHTS_FILE, export_model
    from peer.learn.model import num_params

    model, cfg, codec = load_checkpoint_model(args.checkpoint, args.config, check=refuse_unexportable(args.checkpoint))
    tokenizer_file = None
    if cfg.data.tokenizer == "bpe":
        tokenizer_file = Path(tempfile.mkdtemp(prefix="swarmloco-export-")) / "tokenizer.json"
        tokenizer_file.write_text(codec.json)
    out = export_model(model, cfg, args.out, tokenizer_file)
    readable_by_all(out, [WEIGHTS_FILE])
    print(f"export | {num_params(model):,} parameters ({cfg.model.preset or cfg.model.arch}) -> {out}/model.safetensors, config.json"
          + (", tokenizer.json" if tokenizer_file else " (byte-level: token ids are UTF-8 bytes, no tokenizer file)"))
    print(f"load it: transformers.LlamaForCausalLM.from_pretrained({str(out)!r})")
    return 0
