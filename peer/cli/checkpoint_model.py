"""A run's model from a checkpoint file and its run config, for `export` and `sample`.

A checkpoint (the coordinator's --checkpoint, or a peer's state) holds the flat parameters and the
hash of the run config that made them, not the config itself: --config names it, and a config
whose hash differs is refused (it would put the numbers into the wrong shapes).
"""

from __future__ import annotations

from pathlib import Path


def load_checkpoint_model(checkpoint_path: str, config_path: str | None):
    """(model in eval mode, RunConfig, tokenizer codec) for a checkpoint."""
    from peer.learn.model import build_model, load_flat_params
    from peer.learn.tokenizer import ByteCodec, BpeCodec
    from peer.run import checkpoint
    from peer.run.config import ConfigError, RunConfig

    ckpt = checkpoint.load(checkpoint_path)
    if config_path is None:
        beside = Path(checkpoint_path).with_name("run.json")
        if not beside.exists():
            raise ConfigError(f"give --config: the run config that wrote {checkpoint_path} (no run.json beside it)")
        config_path = str(beside)
    cfg = RunConfig.from_toml(config_path)
    if cfg.config_hash() != ckpt.config_hash:
        raise ConfigError(f"{checkpoint_path} was written by run config {ckpt.config_hash[:12]}, but {config_path} is "
                          f"{cfg.config_hash()[:12]}: pass the run's own config (the coordinator serves it; the demo writes run.json)")
    model = build_model(cfg.model, cfg.seed)
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
