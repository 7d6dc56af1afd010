"""Rules that span sections of a run config: which aggregator suits a codec, which pairs cannot work.

peer/run/config.py validates each field alone; these rules need the codec and aggregator
registries (optim/), so they live apart from it and run once per load (finalize, called by
peer/cli/run_flags.py).
"""

from __future__ import annotations

import dataclasses

from peer.run.config import ConfigError, RunConfig

SPARSE_CODEC_PREFIXES = ("topk:", "chunk-topk:", "dct-topk:")
COORDINATE_WISE_RULES = ("median", "trimmed-mean")

DEFAULT_AGGREGATOR = "median"
SPARSE_DEFAULT_AGGREGATOR = "centered-clip"


def is_sparse_codec(codec: str) -> bool:
    """Sparsifiers whose kept coordinates differ between peers (randk shares one index set)."""
    return any(stage.strip().startswith(SPARSE_CODEC_PREFIXES) for stage in codec.split("+"))


def with_suitable_aggregator(cfg: RunConfig, *, explicit: bool) -> RunConfig:
    """The default median, on a sparse codec and not asked for explicitly, becomes centered-clip."""
    if explicit or cfg.aggregation.name != DEFAULT_AGGREGATOR or not is_sparse_codec(cfg.compression.codec):
        return cfg
    return dataclasses.replace(cfg, aggregation=dataclasses.replace(cfg.aggregation, name=SPARSE_DEFAULT_AGGREGATOR))


def check_run_config(cfg: RunConfig) -> None:
    """Refuse codec/optimizer/aggregator combinations that cannot work, with what to use instead."""
    from peer.run.round_math import build_aggregator, build_codec  # torch: only once a run is loaded

    build_codec(cfg)
    build_aggregator(cfg)
    if cfg.exchange.support:  # every peer sends the same coordinates: a coordinate-wise rule sees aligned values
        from optim import shared_support

        try:
            shared_support.parse(cfg.exchange.support, cfg.compression.codec, cfg.exchange.result_codec,
                                 cfg.aggregation.num_byzantine)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        return
    check_result_codec(cfg.exchange.result_codec)
    if is_sparse_codec(cfg.compression.codec) and cfg.aggregation.name in COORDINATE_WISE_RULES:
        raise ConfigError(
            f"aggregator {cfg.aggregation.name!r} is coordinate-wise: on {cfg.compression.codec!r} updates whose "
            "supports differ between peers it zeroes out the signal. Use a shared index set (codec randk:F, same "
            "indices on every peer each round) or a norm-based rule (centered-clip, krum, geometric-median)"
        )


def check_result_codec(spec: str) -> None:
    """'' (dense, from the codec), a dense dtype, or a codec every owner encodes to the same bytes."""
    from optim import slicing  # torch

    if not spec or slicing.is_dense_result(spec):
        return
    try:
        slicing.result_codec(spec)
    except ValueError as exc:
        raise ConfigError(f"exchange.result_codec: {exc}") from None


def with_demo_codec(cfg: RunConfig, *, explicit: bool) -> RunConfig:
    """Outer demo with no codec named sends what DeMo transmits, its top-k DCT coefficients per
    chunk, as 1-bit signs (Psyche's DisTrO setting), without error feedback (DeMo's decoupled
    momentum keeps what is not sent). A named codec is kept as is."""
    if explicit or cfg.outer.name != "demo":
        return cfg
    codec = f"dct-topk:{cfg.outer.demo_chunk}:{cfg.outer.demo_topk}+sign"
    return dataclasses.replace(cfg, compression=dataclasses.replace(cfg.compression, codec=codec, error_feedback=False))


def finalize(cfg: RunConfig, *, explicit_aggregator: bool, explicit_codec: bool = True) -> RunConfig:
    """A loaded config made ready to run: DeMo's codec when none is named, the aggregator that
    suits its codec, the outer lr written out (so the served config and every record show the step
    size that ran), all rules checked."""
    cfg = with_demo_codec(cfg, explicit=explicit_codec)
    cfg = with_suitable_aggregator(cfg, explicit=explicit_aggregator)
    if cfg.outer.lr is None:
        cfg = dataclasses.replace(cfg, outer=dataclasses.replace(cfg.outer, lr=cfg.outer.effective_lr))
    check_run_config(cfg)
    if cfg.data.tokenizer == "bpe" and not cfg.data.tokenizer_sha256:
        from peer.learn.data import with_tokenizer_hash  # trains (or loads) the run's BPE once

        cfg = with_tokenizer_hash(cfg)  # every peer must then tokenize alike
    return cfg
