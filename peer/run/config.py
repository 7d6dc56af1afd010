"""The run config: every default of a swarmloco run in one place.

A run config is shared by the whole swarm (the coordinator serves it; peers never override
it), so it fixes the math: model, data split, inner and outer optimizers, codec, aggregator,
and round timing. Defaults are the small demo run that finishes on 2 CPU cores in minutes,
with optimizer defaults from the DiLoCo paper (inner AdamW, outer Nesterov lr 0.7, momentum 0.9).

Files are TOML with one table per section (`[inner]`, `[outer]`, ...); see docs/run.example.toml.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

OuterName = Literal["nesterov", "demo", "fedavg"]
OuterSchedule = Literal["constant", "cosine", "linear"]

# Outer learning rate when outer.lr is unset: DiLoCo's Nesterov 0.7; 1.0 makes fedavg plain
# averaging (θ_{r+1} = θ_r − mean Δ); DeMo's sign step is outer.demo_lr.
OUTER_DEFAULT_LR: dict[str, float] = {"nesterov": 0.7, "fedavg": 1.0}


class ConfigError(ValueError):
    """A run config value that cannot work; the message says what to change."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def _documented(default: Any, help: str) -> Any:
    """A field whose `help` is also its CLI help (peer/cli/run_flags.py maps flags onto fields)."""
    return field(default=default, metadata={"help": help})


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    """A small GPT over bytes (vocab 256): ~0.5M parameters by default.

    arch = "llama" is a Llama-style decoder (RMSNorm, RoPE, SwiGLU; peer/learn/llama.py);
    `preset` names one of its sizes (peer/learn/presets.py: llama-20m ... llama-1b) and then
    sets arch, d_model, n_layer, n_head and ffn_hidden. vocab_size 0 means the tokenizer's
    default (256 for bytes, data.bpe_vocab_size for BPE)."""

    seq_len: int = 128
    d_model: int = 128
    n_layer: int = 2
    n_head: int = 4
    dropout: float = 0.0
    arch: str = "gpt"  # gpt (byte-level, the default) or llama
    preset: str = ""  # e.g. llama-20m; overrides arch and the dimensions above
    vocab_size: int = 0  # 0: 256 with data.tokenizer bytes, data.bpe_vocab_size with bpe
    ffn_hidden: int = 0  # llama: SwiGLU hidden width (0: 8/3 d_model rounded up to 64)
    tie_embeddings: bool = False  # llama: lm head shares the embedding matrix (gpt always ties)
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        if self.preset:
            from peer.learn.presets import apply_preset  # torch-free table

            apply_preset(self)
        _require(self.arch in ("gpt", "llama"), f"model.arch={self.arch!r}: choose gpt or llama")
        _require(self.vocab_size >= 0 and self.ffn_hidden >= 0, "model.vocab_size and model.ffn_hidden must be >= 0")
        _require(self.arch == "llama" or self.vocab_size in (0, 256),
                 f"model.vocab_size={self.vocab_size}: the byte-level gpt has 256; use arch llama (or a preset) for a BPE vocabulary")
        _require(self.rope_theta > 0, f"model.rope_theta={self.rope_theta}: use a positive base")
        _require(self.seq_len >= 8, f"model.seq_len={self.seq_len}: use at least 8")
        _require(self.d_model > 0 and self.n_layer > 0, "model.d_model and model.n_layer must be positive")
        _require(
            self.n_head > 0 and self.d_model % self.n_head == 0,
            f"model.d_model={self.d_model} must be divisible by model.n_head={self.n_head}",
        )
        _require(0.0 <= self.dropout < 1.0, f"model.dropout={self.dropout}: use a value in [0, 1)")


@dataclass(kw_only=True, slots=True)
class DataConfig:
    """Where training text comes from. path=None means the Python standard library's sources."""

    path: str | None = None
    batch_size: int = 8
    val_fraction: float = 0.1  # share of files held out, chosen by a stable hash of the path
    val_batches: int = 16  # batches of the fixed validation set used for every val-loss figure
    max_corpus_bytes: int = 8_000_000  # cap on bytes read, so startup stays fast
    tokenizer: str = "bytes"  # bytes (no tokenizer) or bpe (peer/learn/tokenizer.py)
    tokenizer_path: str | None = None  # bpe: a tokenizer.json shipped by the run owner (default: trained on the corpus)
    tokenizer_sha256: str = ""  # bpe: filled in when the run config is loaded; every peer's tokenizer must match
    bpe_vocab_size: int = 8192  # bpe: tokens the tokenizer is trained to (model.vocab_size follows it)
    shards: str | None = None  # a folder written by `swarmloco prepare-data` (memory-mapped tokens; replaces path)

    def __post_init__(self) -> None:
        _require(self.tokenizer in ("bytes", "bpe"), f"data.tokenizer={self.tokenizer!r}: choose bytes or bpe")
        _require(512 <= self.bpe_vocab_size <= 1 << 20, f"data.bpe_vocab_size={self.bpe_vocab_size}: use 512 to 1048576")
        _require(self.batch_size > 0, f"data.batch_size={self.batch_size}: use a positive batch size")
        _require(0.0 < self.val_fraction < 1.0, f"data.val_fraction={self.val_fraction}: use a value in (0, 1)")
        _require(self.val_batches > 0, "data.val_batches must be positive")
        _require(self.max_corpus_bytes >= 100_000, "data.max_corpus_bytes: use at least 100000")


@dataclass(kw_only=True, slots=True)
class InnerConfig:
    """Inner AdamW, run for `steps` (DiLoCo's H) between synchronizations; its state persists."""

    steps: int = _documented(25, "inner AdamW steps per round (DiLoCo's H)")
    lr: float = 1e-3
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    warmup_steps: int = 50  # linear warm-up of the inner lr over the first steps of the run
    grad_clip: float = 1.0
    micro_batch_size: int = 0  # rows per forward/backward; data.batch_size / this = gradient accumulation (0: no accumulation)
    precision: str = "auto"  # auto (bf16 autocast on CUDA, fp32 on CPU), bf16, fp32
    compile: bool = False  # torch.compile the model (CUDA runs; the first steps compile)

    def __post_init__(self) -> None:
        _require(self.steps > 0, f"inner.steps={self.steps}: use at least 1 inner step per round")
        _require(self.lr > 0, f"inner.lr={self.lr}: use a positive learning rate")
        _require(0 <= self.beta1 < 1 and 0 <= self.beta2 < 1, "inner.beta1/beta2 must be in [0, 1)")
        _require(self.warmup_steps >= 0 and self.grad_clip >= 0, "inner.warmup_steps and inner.grad_clip must be >= 0")
        _require(self.micro_batch_size >= 0, f"inner.micro_batch_size={self.micro_batch_size}: use 0 (no accumulation) or more")
        _require(self.precision in ("auto", "bf16", "fp32"), f"inner.precision={self.precision!r}: choose auto, bf16 or fp32")


@dataclass(kw_only=True, slots=True)
class OuterConfig:
    """Outer optimizer applied to the aggregated pseudo-gradient once per round."""

    name: OuterName = _documented("nesterov", "outer optimizer: nesterov (DiLoCo), demo (DeMo's sign step), fedavg (averaging)")
    lr: float | None = _documented(
        None,
        "learning rate of the chosen outer optimizer (unset: "
        + ", ".join(f"{name} {lr:g}" for name, lr in OUTER_DEFAULT_LR.items()) + ", demo outer.demo_lr)",
    )
    momentum: float = 0.9  # nesterov
    demo_decay: float = 0.999  # DeMo: local momentum decay
    demo_chunk: int = 64  # DeMo: DCT chunk size
    demo_topk: int = 4  # DeMo: components kept per chunk
    # DeMo's sign step when outer.lr is unset. (Its own key, as stored benchmark configs have it.)
    demo_lr: float = 1e-3
    # The outer step size per round: a linear warm-up over the first `lr_warmup_rounds` rounds,
    # then `lr_schedule` from the full step down towards lr_final x it at the end of rounds.rounds.
    # DeMo's paper decays its sign step with the run (a constant sign step keeps its noise to the end).
    lr_warmup_rounds: int = _documented(0, "outer step warm-up: ramp linearly over this many rounds (0 = none)")
    lr_schedule: OuterSchedule = _documented(
        "constant", "outer step after the warm-up: constant, or cosine/linear decay towards outer.lr_final x it at the end of the run"
    )
    lr_final: float = 0.0  # cosine/linear: the last round's step as a fraction of the full one

    def __post_init__(self) -> None:
        _require(
            self.name in ("nesterov", "demo", "fedavg"),
            f"outer.name={self.name!r}: choose one of nesterov, demo, fedavg",
        )
        _require(self.lr is None or _is_number(self.lr), f"outer.lr={self.lr!r}: expected a number")
        _require(self.lr is None or self.lr > 0, f"outer.lr={self.lr}: use a positive learning rate")
        _require(0 <= self.momentum < 1, f"outer.momentum={self.momentum}: use a value in [0, 1)")
        _require(0 < self.demo_decay <= 1, "outer.demo_decay must be in (0, 1]")
        _require(1 <= self.demo_topk <= self.demo_chunk <= 4096, "outer: need 1 <= demo_topk <= demo_chunk <= 4096")
        _require(isinstance(self.lr_warmup_rounds, int) and self.lr_warmup_rounds >= 0,
                 f"outer.lr_warmup_rounds={self.lr_warmup_rounds!r}: use 0 (no warm-up) or a number of rounds")
        _require(self.lr_schedule in ("constant", "cosine", "linear"),
                 f"outer.lr_schedule={self.lr_schedule!r}: choose constant, cosine or linear")
        _require(_is_number(self.lr_final) and 0 <= self.lr_final <= 1,
                 f"outer.lr_final={self.lr_final!r}: use a fraction of the step in [0, 1]")

    @property
    def effective_lr(self) -> float:
        """The step size the outer optimizer runs with: `lr`, or the chosen optimizer's default."""
        if self.lr is not None:
            return self.lr
        return self.demo_lr if self.name == "demo" else OUTER_DEFAULT_LR[self.name]

    def lr_at(self, round_: int, rounds: int) -> float:
        """The step size of round `round_` (0-based) in a run of `rounds` rounds: effective_lr
        ramped up over the warm-up rounds ((r+1)/(warm-up+1) of it), then the schedule's shape
        at progress (r - warm-up)/(rounds - warm-up), which would reach lr_final one round
        after the last; rounds past the end keep lr_final."""
        lr = self.effective_lr
        if round_ < self.lr_warmup_rounds:
            return lr * (round_ + 1) / (self.lr_warmup_rounds + 1)
        if self.lr_schedule == "constant":
            return lr
        span = rounds - self.lr_warmup_rounds  # the last round still steps: progress (span-1)/span
        progress = 1.0 if span <= 0 else min(1.0, (round_ - self.lr_warmup_rounds) / span)
        shape = (1 + math.cos(math.pi * progress)) / 2 if self.lr_schedule == "cosine" else 1 - progress
        return lr * (self.lr_final + (1 - self.lr_final) * shape)


@dataclass(kw_only=True, slots=True)
class CompressionConfig:
    """Codec spec string (optim/codecs.py), e.g. `fp16`, `int8`, `topk:0.01+int8`, `dct-topk:64:4`."""

    codec: str = _documented(
        "fp16",
        "pseudo-gradient codec: fp32, fp16, bf16, int8, int4, int2, sign, topk:F, randk:F, chunk-topk:C:K, "
        "dct-topk:C:K, chained with + (e.g. topk:0.01+int8)",
    )
    error_feedback: bool = True  # the sender keeps what the codec dropped and adds it next round
    # Error-feedback decay β (SparseLoCo): e <- β·e + Δ, send codec(e), e <- e - sent. 1.0 keeps
    # every dropped value in full (classic error feedback); SparseLoCo uses 0.95.
    error_feedback_decay: float = 1.0

    def __post_init__(self) -> None:
        _require(bool(self.codec.strip()), "compression.codec is empty: use e.g. fp16, int8, topk:0.01+int8")
        _require(0 < self.error_feedback_decay <= 1, f"compression.error_feedback_decay={self.error_feedback_decay}: use a value in (0, 1]")


@dataclass(kw_only=True, slots=True)
class AggregationConfig:
    """Robust aggregator (optim/aggregate.py) and the number of Byzantine peers it must tolerate.

    Default: coordinate-wise median — in benchmarks/byzantine.md it had the best worst case over
    every attack with 2 of 8 peers Byzantine (+1.5%) and cost +0.3% with no attacker (see
    docs/robustness.md). On sparse codecs (top-k) the run uses centered-clip instead unless an
    aggregator is named explicitly: median zeroes out coordinates that only some peers sent.
    """

    name: str = _documented(
        "median",
        "robust aggregator: mean, median, trimmed-mean, krum, multi-krum, geometric-median, centered-clip, dnc "
        "(default median; centered-clip on sparse codecs unless named)",
    )
    num_byzantine: int = _documented(0, "Byzantine peers the aggregator must tolerate (f)")
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _require(self.num_byzantine >= 0, f"aggregation.num_byzantine={self.num_byzantine}: use 0 or more")


@dataclass(kw_only=True, slots=True)
class RoundConfig:
    """Round clock: how many rounds, how long to wait, how many peers make a quorum."""

    rounds: int = _documented(20, "number of outer rounds")
    min_peers: int = _documented(1, "quorum: a round closes only with at least this many valid updates")
    expected_peers: int = _documented(0, "wait for this many peers before round 0 starts (0 = no wait; bounded by rounds.start_timeout_s)")
    start_timeout_s: float = 120.0  # give up waiting for expected_peers after this long
    deadline_s: float = 120.0  # initial deadline after the first commitment of a round
    min_deadline_s: float = 5.0
    max_deadline_s: float = 600.0
    deadline_slack: float = 2.0  # adaptive deadline = slack x the slowest recent arrival gap
    peer_timeout_s: float = 30.0  # a peer silent this long is considered gone
    # Overlap communication with computation: a peer starts round r+1's inner steps as soon as it
    # has committed round r, and folds θ_{r+1} in when the exchange finishes (a one-round-delayed
    # outer update, as in streaming/eager DiLoCo variants). Hides the exchange behind compute.
    overlap_communication: bool = _documented(
        False, "overlap the exchange with the next round's inner steps (one-round-delayed outer update)"
    )
    # Eager updates (Kale et al. 2025) for overlapped rounds: the next inner phase starts from an
    # outer step taken at once on this peer's own fresh pseudo-gradient standing in for its share
    # of the average still in flight (the others' shares from the last known average), instead of
    # from the peer's own local model. Only the local starting point changes: θ_{r+1} is the same.
    eager_updates: bool = True
    # What stands in for the average in flight (optim/eager.py): "own" (this peer's fresh Δ, the
    # default: the start points average to θ_{r+1}); "share" (the paper's mixture), "own-share",
    # "fit" and "drift" are the diagnostics of benchmarks/fidelity.md (all worse here).
    eager_estimate: str = "own"

    def __post_init__(self) -> None:
        _require(self.rounds > 0, f"rounds.rounds={self.rounds}: use at least 1 round")
        _require(self.min_peers >= 1, f"rounds.min_peers={self.min_peers}: a quorum needs at least 1 peer")
        _require(
            0 < self.min_deadline_s <= self.deadline_s <= self.max_deadline_s,
            "rounds: need 0 < min_deadline_s <= deadline_s <= max_deadline_s",
        )
        _require(self.deadline_slack >= 1.0, "rounds.deadline_slack must be >= 1")
        _require(self.peer_timeout_s > 0, "rounds.peer_timeout_s must be positive")
        _require(self.eager_estimate in ("own", "drift", "share", "fit", "own-share"),
                 f"rounds.eager_estimate={self.eager_estimate!r}: choose own, drift, own-share, fit or share")


ExchangeMode = Literal["sliced", "all-to-all"]


@dataclass(kw_only=True, slots=True)
class ExchangeConfig:
    """How updates meet: sliced (reduce-scatter to r owners per slice, then all-gather of the
    signed aggregated slices; per-peer bytes bounded in the swarm's size) or all-to-all (every
    node fetches and aggregates every update; O(n·d) per peer, for tiny swarms and comparison).
    See docs/sliced-exchange.md."""

    mode: ExchangeMode = "sliced"
    slices: int = 32  # S: slices of the flat parameter vector (on codec block boundaries)
    replicas: int = 2  # r: owners per slice; a lone lying owner is outvoted by recomputation
    spot_checks: int = 1  # slices each peer recomputes per round from signed inputs (catches colluding owners)
    # Expected recomputations of each slice per round across the whole swarm: a peer runs its spot
    # checks with probability min(1, coverage·S / (n·spot_checks)), so a large swarm still checks
    # every slice about this often while each peer's spot-check traffic stays bounded in n.
    spot_check_coverage: float = 2.0
    result_timeout_s: float = 60.0  # after the manifest: wait this long for slice results, then recompute what is missing
    result_grace_s: float = 2.0  # once every slice has a result: wait this long for the other owners' results

    def __post_init__(self) -> None:
        _require(self.mode in ("sliced", "all-to-all"), f"exchange.mode={self.mode!r}: choose sliced or all-to-all")
        _require(1 <= self.slices <= 4096, f"exchange.slices={self.slices}: use 1 to 4096 slices")
        _require(1 <= self.replicas <= 8, f"exchange.replicas={self.replicas}: use 1 to 8 owners per slice")
        _require(0 <= self.spot_checks <= self.slices, f"exchange.spot_checks={self.spot_checks}: use 0 to exchange.slices")
        _require(self.spot_check_coverage > 0, f"exchange.spot_check_coverage={self.spot_check_coverage}: use a positive number")
        _require(self.result_timeout_s > 0 and self.result_grace_s >= 0, "exchange.result_timeout_s must be > 0, result_grace_s >= 0")


@dataclass(kw_only=True, slots=True)
class ControlConfig:
    """Who may coordinate the run, and how a standby takes over (docs/threat-model.md).

    A run's identity is its coordinator keys: peers accept manifests and signed states from these
    keys only. The active coordinator holds a lease in the DHT and renews it every lease_s / 3; when
    it lapses, a standby listed here takes over with a higher term."""

    coordinators: list[str] = field(default_factory=list, metadata={
        "help": "fingerprints (peer ids) of the keys allowed to coordinate this run; the active coordinator's own is added"})
    lease_s: float = _documented(6.0, "seconds a coordinator's DHT lease lasts: a standby takes over this long after the active one stops")
    end_grace_s: float = _documented(60.0, "after the last round: keep serving the final state until every peer has it, at most this long")

    def __post_init__(self) -> None:
        for fingerprint in self.coordinators:
            _require(len(fingerprint) == 32 and all(c in "0123456789abcdef" for c in fingerprint),
                     f"control.coordinators entry {fingerprint!r} is not a fingerprint (the 32 hex characters a coordinator prints)")
        _require(1.0 <= self.lease_s <= 600.0, f"control.lease_s={self.lease_s}: use 1 to 600 seconds")
        _require(self.end_grace_s >= 0, f"control.end_grace_s={self.end_grace_s}: use a non-negative number")


@dataclass(kw_only=True, slots=True)
class RunConfig:
    run_id: str = "swarmloco-demo"
    seed: int = _documented(0, "seed of the model init, the data order and the codecs' shared random choices")
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
        _require(
            bool(self.run_id) and all(c.isalnum() or c in "-_." for c in self.run_id),
            f"run_id={self.run_id!r}: use letters, digits, '-', '_' or '.'",
        )
        _require(self.max_payload_bytes > 0, "max_payload_bytes must be positive")
        for key in self.allowed_peers:
            _require(
                len(key) == 64 and all(c in "0123456789abcdef" for c in key.lower()),
                f"allowed_peers entry {key!r} is not a hex Ed25519 public key (64 hex characters)",
            )
        if self.model.vocab_size == 0:  # the tokenizer's default vocabulary
            self.model.vocab_size = 256 if self.data.tokenizer == "bytes" else self.data.bpe_vocab_size
        _require(self.data.tokenizer == "bpe" or self.model.vocab_size == 256,
                 f"model.vocab_size={self.model.vocab_size} needs data.tokenizer = \"bpe\" (bytes have 256 symbols)")
        _require(self.data.tokenizer == "bytes" or self.model.vocab_size >= self.data.bpe_vocab_size,
                 f"model.vocab_size={self.model.vocab_size} is smaller than data.bpe_vocab_size={self.data.bpe_vocab_size}")
        _require(self.data.tokenizer == "bytes" or self.model.arch == "llama",
                 "data.tokenizer = \"bpe\" needs a llama model (model.preset, e.g. llama-20m): the gpt is byte-level")
        micro = self.inner.micro_batch_size
        _require(micro == 0 or self.data.batch_size % micro == 0,
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
