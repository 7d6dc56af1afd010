"""The run config: every default of a swarmloco run in one place.

A run config is shared by the whole swarm (the coordinator serves it; peers never override
it), so it fixes the math: model, data split, inner and outer optimizers, codec, aggregator,
and round timing. Defaults are the small demo run that finishes on 2 CPU cores in minutes,
with optimizer defaults from the DiLoCo paper (inner AdamW, outer Nesterov lr 0.7, momentum 0.9).

Files are TOML with one table per section (`[inner]`, `[outer]`, ...); see docs/run.example.toml.
Each section is a dataclass in peer/run/config_sections.py (re-exported here, so
`from peer.run.config import RunConfig, ModelConfig, ConfigError` serves every importer); this
module holds RunConfig, the rules between its sections, and reading it from TOML/JSON.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from peer.run.config_errors import ConfigError, require
from peer.run.config_sections import (
    OUTER_DEFAULT_LR,
    AggregationConfig,
    CompressionConfig,
    ControlConfig,
    DataConfig,
    ExchangeConfig,
    ExchangeMode,
    InnerConfig,
    ModelConfig,
    OuterConfig,
    OuterName,
    OuterSchedule,
    RoundConfig,
    documented,
)

__all__ = [
    "OUTER_DEFAULT_LR", "AggregationConfig", "CompressionConfig", "ConfigError", "ControlConfig", "DataConfig",
    "ExchangeConfig", "ExchangeMode", "InnerConfig", "ModelConfig", "OuterConfig", "OuterName", "OuterSchedule",
    "RoundConfig", "RunConfig", "read_config_file",
]


@dataclass(kw_only=True, slots=True)
class RunConfig:
    run_id: str = "swarmloco-demo"
    seed: int = documented(0, "seed of the model init, the data order and the codecs' shared random choices")
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    inner: InnerConfig = field(default_factory=InnerConfig)
    outer: OuterConfig = field(default_factory=OuterConfig)
    compression: CompressionConfig = field(default_factory=CompressionConfig)
    aggregation: AggregationConfig = field(default_factory=AggregationConfig)
    rounds: RoundConfig = field(default_factory=RoundConfig)
    exchange: ExchangeConfig = field(default_factory=ExchangeConfig)
    control: ControlConfig = field(default_factory=ControlConfig)
    max_payload_bytes: int = 64 * 1024 * 1024  # hard upper bound on one update payload
    allowed_peers: list[str] = field(default_factory=list)  # hex public keys; empty = open run

    def __post_init__(self) -> None:
        require(
            bool(self.run_id) and all(c.isalnum() or c in "-_." for c in self.run_id),
            f"run_id={self.run_id!r}: use letters, digits, '-', '_' or '.'",
        )
        require(self.max_payload_bytes > 0, "max_payload_bytes must be positive")
        for key in self.allowed_peers:
            require(
                len(key) == 64 and all(c in "0123456789abcdef" for c in key.lower()),
                f"allowed_peers entry {key!r} is not a hex Ed25519 public key (64 hex characters)",
            )
        if self.model.init_from:  # the checkpoint's tokenizer.json is the run's (peer/learn/hf_checkpoint.py)
            from peer.learn.hf_checkpoint import init_tokenizer

            self.data = init_tokenizer(self.data, self.model)
        if self.model.vocab_size == 0:  # the tokenizer's default vocabulary
            self.model.vocab_size = 256 if self.data.tokenizer == "bytes" else self.data.bpe_vocab_size
        require(self.data.tokenizer == "bpe" or self.model.vocab_size == 256,
                 f"model.vocab_size={self.model.vocab_size} needs data.tokenizer = \"bpe\" (bytes have 256 symbols)")
        require(self.data.tokenizer == "bytes" or self.model.vocab_size >= self.data.bpe_vocab_size,
                 f"model.vocab_size={self.model.vocab_size} is smaller than data.bpe_vocab_size={self.data.bpe_vocab_size}")
        require(self.data.tokenizer == "bytes" or self.model.arch == "llama",
                 "data.tokenizer = \"bpe\" needs a llama model (model.preset, e.g. llama-20m): the gpt is byte-level")
        micro = self.inner.micro_batch_size
        require(micro == 0 or self.data.batch_size % micro == 0,
                 f"inner.micro_batch_size={micro} must divide data.batch_size={self.data.batch_size}")

    # --- (de)serialization -------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    def config_hash(self) -> str:
        """sha256 of the canonical JSON: two peers with equal hashes run the same math."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunConfig":
        sections = {f.name: f.type for f in dataclasses.fields(cls)}
        section_types = {
            "model": ModelConfig,
            "data": DataConfig,
            "inner": InnerConfig,
            "outer": OuterConfig,
            "compression": CompressionConfig,
            "aggregation": AggregationConfig,
            "rounds": RoundConfig,
            "exchange": ExchangeConfig,
            "control": ControlConfig,
        }
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key not in sections:
                raise ConfigError(f"unknown run config key {key!r}; known keys: {', '.join(sorted(sections))}")
            if key in section_types:
                if not isinstance(value, dict):
                    raise ConfigError(f"[{key}] must be a table, got {type(value).__name__}")
                kwargs[key] = _build_section(section_types[key], key, value)
            else:
                kwargs[key] = value
        try:
            return cls(**kwargs)
        except TypeError as exc:
            raise ConfigError(f"bad run config: {exc}") from None

    @classmethod
    def from_json(cls, text: str) -> "RunConfig":
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_toml(cls, path: str | Path) -> "RunConfig":
        return cls.from_dict(read_config_file(path))


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The raw tables of a run config file (TOML, or the JSON a coordinator writes), unvalidated."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"run config {path} does not exist") from None
    try:
        return json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"run config {path} is not valid {'JSON' if path.suffix == '.json' else 'TOML'}: {exc}") from None


def _build_section(section_type: type, name: str, values: dict[str, Any]) -> Any:
    known = {f.name: f for f in dataclasses.fields(section_type)}
    for key, value in values.items():
        if key not in known:
            raise ConfigError(f"unknown key {name}.{key}; known keys: {', '.join(sorted(known))}")
        default = known[key].default
        if isinstance(default, (int, float)) and not isinstance(default, bool):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{name}.{key}={value!r}: expected a number")
            if isinstance(default, int) and not isinstance(value, int):
                raise ConfigError(f"{name}.{key}={value!r}: expected an integer")
    return section_type(**values)
