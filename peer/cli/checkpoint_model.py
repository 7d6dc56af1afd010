"""A run's model from a checkpoint file and its run config, for `export` and `sample`.

A checkpoint (the coordinator's --checkpoint, or a peer's state) holds the flat parameters and the
hash of the run config that made them, not the config itself: --config names it. A config whose
model has another parameter count is refused; one whose hash alone differs (the coordinator adds its
own key to [control]) gets a note.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path


def load_checkpoint_model(checkpoint_path: str, config_path: str | None, check: Callable | None = None):
    """(model in eval mode, RunConfig, tokenizer codec) for a checkpoint. `check(cfg)` runs as soon
    as the run config is known, before the model is built or anything printed (export refuses a
    model it cannot write there)."""
    from peer.learn.model import build_model, load_flat_params, num_params
    from peer.learn.tokenizer import ByteCodec, BpeCodec
    from peer.run import checkpoint
    from peer.run.config import ConfigError, RunConfig

    ckpt = checkpoint.load(checkpoint_path)
    embedded = (ckpt.extra or {}).get("config")  # the coordinator's checkpoints carry their run config
    if config_path is None and embedded is not None:
        cfg = RunConfig.from_dict(embedded)
        if cfg.config_hash() != ckpt.config_hash:
            raise ConfigError(f"{checkpoint_path}: its embedded run config does not match its config hash; the file is damaged")
        config_path = checkpoint_path
    elif config_path is None:
        beside = Path(checkpoint_path).with_name("run.json")
        if not beside.exists():
            raise ConfigError(f"give --config: the run config that wrote {checkpoint_path} (no run.json beside it)")
        config_path = str(beside)
    if config_path != checkpoint_path:
        cfg = RunConfig.from_toml(config_path)
    if check is not None:
        check(cfg)
    model = build_model(cfg.model, cfg.seed)
    if cfg.config_hash() != ckpt.config_hash:
        if ckpt.params.numel() != num_params(model):
            raise ConfigError(f"{checkpoint_path} holds {ckpt.params.numel():,} parameters, but the model of run config {config_path} "
                              f"has {num_params(model):,}: pass the run's own config (the coordinator serves it; the demo writes run.json)")
        # The coordinator adds fields of its own (its key in [control]); the parameters fit this model.
        print(f"note: {checkpoint_path} was written under run config {ckpt.config_hash[:12]}, {config_path} hashes to "
              f"{cfg.config_hash()[:12]}; its model has the checkpoint's {num_params(model):,} parameters", file=sys.stderr)
    load_flat_params(model, ckpt.params)
    model.eval()
    codec = ByteCodec()
    if cfg.data.tokenizer == "bpe":
        codec = tokenizer_of(cfg)
        if not isinstance(codec, BpeCodec):
            raise ConfigError("the run's BPE tokenizer could not be loaded")
    return model, cfg, codec


def tokenizer_of(cfg):
    """The run's BPE: from its shards folder, its tokenizer_path, or trained again on its corpus (hash checked)."""
    from peer.learn.data import load_corpus

    return load_corpus(cfg.data).tokenizer
