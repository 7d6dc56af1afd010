"""The sections of a run config, one typed dataclass per TOML table (`[model]`, `[data]`, ...),
each validating its own fields in __post_init__ with a ConfigError that says what to change.

RunConfig (peer/run/config.py) holds one of each and checks the rules between them; defaults are
the small demo run, with optimizer defaults from the DiLoCo paper (inner AdamW, outer Nesterov lr
0.7, momentum 0.9).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from peer.run.config_errors import require
from peer.run.presets import apply_preset

OuterName = Literal["nesterov", "demo", "fedavg"]
OuterSchedule = Literal["constant", "cosine", "linear"]

# Outer learning rate when outer.lr is unset: DiLoCo's Nesterov 0.7; 1.0 makes fedavg plain
# averaging (θ_{r+1} = θ_r − mean Δ); DeMo's sign step is outer.demo_lr.
OUTER_DEFAULT_LR: dict[str, float] = {"nesterov": 0.7, "fedavg": 1.0}


def documented(default: Any, help: str) -> Any:
    """A field whose `help` is also its CLI help (peer/cli/run_flags.py maps flags onto fields)."""
    return field(default=default, metadata={"help": help})


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    """A small GPT over bytes (vocab 256): ~0.5M parameters by default.

    arch = "llama" is a Llama-style decoder (RMSNorm, RoPE, SwiGLU; peer/learn/llama.py);
    `preset` names one of its sizes (peer/run/presets.py: llama-20m ... llama-1b) and then
    sets arch, d_model, n_layer, n_head and ffn_hidden. vocab_size 0 means the tokenizer's
    default (256 for bytes, data.bpe_vocab_size for BPE).

    `init_from` names a local Hugging Face checkpoint directory of a Llama (config.json +
    safetensors, as transformers' save_pretrained or `swarmloco export` writes it): its
    config.json sets arch and every shape field, its weights are θ_0 and its tokenizer.json the
    run's tokenizer (peer/learn/hf_checkpoint.py). It is read when the config is made; init_sha256
    then names the checkpoint, so the run's config hash changes with it, and a config that carries
    the hash (the one a coordinator serves) is not read again."""

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
    n_kv_head: int = 0  # llama: key/value heads, grouped-query attention when fewer than n_head (0: n_head)
    rms_eps: float = 1e-5  # llama: RMSNorm epsilon
    init_from: str = documented("", "a local Hugging Face checkpoint directory of a Llama (config.json, safetensors, "
                                "tokenizer.json) that the run starts from: its shape, weights and tokenizer")
    init_sha256: str = ""  # init_from: the checkpoint's hash, filled in when the config is made

    def __post_init__(self) -> None:
        require(isinstance(self.init_from, str), f"model.init_from={self.init_from!r}: expected a directory path")
        require(self.init_from or not self.init_sha256, "model.init_sha256 names an init_from checkpoint: set model.init_from too")
        if self.init_from and not self.init_sha256:
            require(not self.preset, f"model.preset={self.preset!r} and model.init_from both set the model's shape: drop one")
            from peer.learn.hf_checkpoint import resolve_init_from  # torch, safetensors: only for such a run

            resolve_init_from(self)
        if self.preset:
            apply_preset(self)
        require(self.arch in ("gpt", "llama"), f"model.arch={self.arch!r}: choose gpt or llama")
        require(self.vocab_size >= 0 and self.ffn_hidden >= 0, "model.vocab_size and model.ffn_hidden must be >= 0")
        require(self.arch == "llama" or not self.init_from, "model.init_from needs arch llama (its config.json sets it)")
        require(self.arch == "llama" or self.vocab_size in (0, 256),
                 f"model.vocab_size={self.vocab_size}: the byte-level gpt has 256; use arch llama (or a preset) for a BPE vocabulary")
        require(self.rope_theta > 0, f"model.rope_theta={self.rope_theta}: use a positive base")
        require(self.seq_len >= 8, f"model.seq_len={self.seq_len}: use at least 8")
        require(self.d_model > 0 and self.n_layer > 0, "model.d_model and model.n_layer must be positive")
        require(
            self.n_head > 0 and self.d_model % self.n_head == 0,
            f"model.d_model={self.d_model} must be divisible by model.n_head={self.n_head}",
        )
        require(self.n_kv_head >= 0 and (self.n_kv_head == 0 or self.n_head % self.n_kv_head == 0),
                 f"model.n_kv_head={self.n_kv_head}: use 0 (= n_head) or a divisor of model.n_head={self.n_head}")
        require(self.arch == "llama" or self.n_kv_head in (0, self.n_head), "model.n_kv_head (grouped-query attention) needs arch llama")
        require(_is_number(self.rms_eps) and self.rms_eps > 0, f"model.rms_eps={self.rms_eps!r}: use a small positive number (1e-5, 1e-6)")
        require(0.0 <= self.dropout < 1.0, f"model.dropout={self.dropout}: use a value in [0, 1)")


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
    text_field: str = "text"  # the key of a .jsonl record / the column of a .parquet file that holds its text

    def __post_init__(self) -> None:
        require(self.tokenizer in ("bytes", "bpe"), f"data.tokenizer={self.tokenizer!r}: choose bytes or bpe")
        require(512 <= self.bpe_vocab_size <= 1 << 20, f"data.bpe_vocab_size={self.bpe_vocab_size}: use 512 to 1048576")
        require(self.batch_size > 0, f"data.batch_size={self.batch_size}: use a positive batch size")
        require(0.0 < self.val_fraction < 1.0, f"data.val_fraction={self.val_fraction}: use a value in (0, 1)")
        require(self.val_batches > 0, "data.val_batches must be positive")
        require(self.max_corpus_bytes >= 100_000, "data.max_corpus_bytes: use at least 100000")
        require(isinstance(self.text_field, str) and bool(self.text_field.strip()),
                f"data.text_field={self.text_field!r}: name the .jsonl key / .parquet column that holds the text")


@dataclass(kw_only=True, slots=True)
class InnerConfig:
    """Inner AdamW, run for `steps` (DiLoCo's H) between synchronizations; its state persists."""

    steps: int = documented(25, "inner AdamW steps per round (DiLoCo's H)")
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
        require(self.steps > 0, f"inner.steps={self.steps}: use at least 1 inner step per round")
        require(self.lr > 0, f"inner.lr={self.lr}: use a positive learning rate")
        require(0 <= self.beta1 < 1 and 0 <= self.beta2 < 1, "inner.beta1/beta2 must be in [0, 1)")
        require(self.warmup_steps >= 0 and self.grad_clip >= 0, "inner.warmup_steps and inner.grad_clip must be >= 0")
        require(self.micro_batch_size >= 0, f"inner.micro_batch_size={self.micro_batch_size}: use 0 (no accumulation) or more")
        require(self.precision in ("auto", "bf16", "fp32"), f"inner.precision={self.precision!r}: choose auto, bf16 or fp32")


@dataclass(kw_only=True, slots=True)
class OuterConfig:
    """Outer optimizer applied to the aggregated pseudo-gradient once per round."""

    name: OuterName = documented("nesterov", "outer optimizer: nesterov (DiLoCo), demo (DeMo's sign step), fedavg (averaging)")
    lr: float | None = documented(
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
    lr_warmup_rounds: int = documented(0, "outer step warm-up: ramp linearly over this many rounds (0 = none)")
    lr_schedule: OuterSchedule = documented(
        "constant", "outer step after the warm-up: constant, or cosine/linear decay towards outer.lr_final x it at the end of the run"
    )
    lr_final: float = 0.0  # cosine/linear: the last round's step as a fraction of the full one

    def __post_init__(self) -> None:
        require(
            self.name in ("nesterov", "demo", "fedavg"),
            f"outer.name={self.name!r}: choose one of nesterov, demo, fedavg",
        )
        require(self.lr is None or _is_number(self.lr), f"outer.lr={self.lr!r}: expected a number")
        require(self.lr is None or self.lr > 0, f"outer.lr={self.lr}: use a positive learning rate")
        require(0 <= self.momentum < 1, f"outer.momentum={self.momentum}: use a value in [0, 1)")
        require(0 < self.demo_decay <= 1, "outer.demo_decay must be in (0, 1]")
        require(1 <= self.demo_topk <= self.demo_chunk <= 4096, "outer: need 1 <= demo_topk <= demo_chunk <= 4096")
        require(isinstance(self.lr_warmup_rounds, int) and self.lr_warmup_rounds >= 0,
                 f"outer.lr_warmup_rounds={self.lr_warmup_rounds!r}: use 0 (no warm-up) or a number of rounds")
        require(self.lr_schedule in ("constant", "cosine", "linear"),
                 f"outer.lr_schedule={self.lr_schedule!r}: choose constant, cosine or linear")
        require(_is_number(self.lr_final) and 0 <= self.lr_final <= 1,
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

    codec: str = documented(
        "fp16",
        "pseudo-gradient codec: fp32, fp16, bf16, int8, int4, int2, sign, topk:F, randk:F, chunk-topk:C:K, "
        "dct-topk:C:K, chained with + (e.g. topk:0.01+int8)",
    )
    error_feedback: bool = True  # the sender keeps what the codec dropped and adds it next round
    # Error-feedback decay β (SparseLoCo): e <- β·e + Δ, send codec(e), e <- e - sent. 1.0 keeps
    # every dropped value in full (classic error feedback); SparseLoCo uses 0.95.
    error_feedback_decay: float = 1.0

    def __post_init__(self) -> None:
        require(bool(self.codec.strip()), "compression.codec is empty: use e.g. fp16, int8, topk:0.01+int8")
        require(0 < self.error_feedback_decay <= 1, f"compression.error_feedback_decay={self.error_feedback_decay}: use a value in (0, 1]")


@dataclass(kw_only=True, slots=True)
class AggregationConfig:
    """Robust aggregator (optim/aggregate.py) and the number of Byzantine peers it must tolerate.

    Default: coordinate-wise median — in benchmarks/byzantine.md it had the best worst case over
    every attack with 2 of 8 peers Byzantine (+1.5%) and cost +0.3% with no attacker (see
    docs/robustness.md). On sparse codecs (top-k) the run uses centered-clip instead unless an
    aggregator is named explicitly: median zeroes out coordinates that only some peers sent.
    """

    name: str = documented(
        "median",
        "robust aggregator: mean, median, trimmed-mean, krum, multi-krum, geometric-median, centered-clip, dnc "
        "(default median; centered-clip on sparse codecs unless named)",
    )
    num_byzantine: int = documented(0, "Byzantine peers the aggregator must tolerate (f)")
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        require(self.num_byzantine >= 0, f"aggregation.num_byzantine={self.num_byzantine}: use 0 or more")


@dataclass(kw_only=True, slots=True)
class RoundConfig:
    """Round clock: how many rounds, how long to wait, how many peers make a quorum."""

    rounds: int = documented(20, "number of outer rounds")
    min_peers: int = documented(1, "quorum: a round closes only with at least this many valid updates")
    expected_peers: int = documented(0, "wait for this many peers before round 0 starts (0 = no wait; bounded by rounds.start_timeout_s)")
    start_timeout_s: float = 120.0  # give up waiting for expected_peers after this long
    deadline_s: float = 120.0  # initial deadline after the first commitment of a round
    min_deadline_s: float = 5.0
    max_deadline_s: float = 600.0
    deadline_slack: float = 2.0  # adaptive deadline = slack x the slowest recent arrival gap
    peer_timeout_s: float = 30.0  # a peer silent this long is considered gone
    # Overlap communication with computation: a peer starts round r+1's inner steps as soon as it
    # has committed round r, and folds θ_{r+1} in when the exchange finishes (a one-round-delayed
    # outer update, as in streaming/eager DiLoCo variants). Hides the exchange behind compute.
    overlap_communication: bool = documented(
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
    # Compute window (shared/DESIGN.md, "Heterogeneous peers"): instead of inner.steps per round,
    # each peer trains until window_s seconds have passed since its inner phase began (at least
    # min_steps, at most max_steps), signs the steps and tokens it did into its update header, and
    # the owners weigh updates by that work, capped (optim/work_weights.py). 0 = off: every peer
    # runs inner.steps and updates count equally (the default; the swarm's math is unchanged).
    # With overlap_communication the window is the swarm's, not the peer's: a phase closes window_s
    # after this peer received the signed manifest of the round in flight (the coordinator's close
    # of that round, which every peer receives at once), so a peer that committed early trains
    # longer and the next commits line up (peer/node/overlap.py).
    window_s: float = documented(0.0, "compute window: each peer trains this many seconds a round and updates are weighted by work (0 = off: inner.steps each)")
    # Overlapped rounds with no window_s: phases still close on the swarm's clock. The coordinator
    # signs into each manifest the window of the phase it starts (RoundManifest.window_ms: H steps at
    # the swarm's median step rate, from the commits it saw; peer/coordinator/phase_window.py), so
    # the peers' commits line up instead of a faster peer's head start growing round after round
    # (a fixed H lands the average late on it: benchmarks/wan.md); updates are then weighed by the
    # work they claim, as in any window run. Only where the run can weigh work (sliced exchange, a
    # rule of work_math.WEIGHTED_RULES); false: every phase takes exactly inner.steps.
    overlap_window: bool = True
    min_steps: int = 1  # compute window: inner steps a peer takes even when the window has closed
    max_steps: int = 1000  # compute window: no peer takes (or may claim) more inner steps in a round

    def __post_init__(self) -> None:
        require(math.isfinite(self.window_s) and self.window_s >= 0,
                 f"rounds.window_s={self.window_s!r}: use 0 (fixed inner.steps) or the seconds of a round's compute window")
        require(1 <= self.min_steps <= self.max_steps,
                 f"rounds: need 1 <= min_steps ({self.min_steps}) <= max_steps ({self.max_steps})")
        require(self.rounds > 0, f"rounds.rounds={self.rounds}: use at least 1 round")
        require(self.min_peers >= 1, f"rounds.min_peers={self.min_peers}: a quorum needs at least 1 peer")
        require(
            0 < self.min_deadline_s <= self.deadline_s <= self.max_deadline_s,
            "rounds: need 0 < min_deadline_s <= deadline_s <= max_deadline_s",
        )
        require(self.deadline_slack >= 1.0, "rounds.deadline_slack must be >= 1")
        require(self.peer_timeout_s > 0, "rounds.peer_timeout_s must be positive")
        require(self.eager_estimate in ("own", "drift", "share", "fit", "own-share"),
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
    # Expected recomputations of each slice per round across the whole swarm: a peer (and the
    # coordinator) runs its spot checks with probability min(1, coverage·S / (n·spot_checks)), so a
    # large swarm still checks every slice about this often while each node's spot-check traffic
    # stays at most about coverage·P (P: one payload) whatever n. 0.5 keeps a 48-peer swarm's
    # per-peer bytes within 1.8x of a 4-peer swarm's; the odds that colluders survive are in
    # docs/sliced-exchange.md ("Liars and colluders").
    spot_check_coverage: float = 0.5
    # What an aggregated slice travels as. "" (default): dense, fp16 for a lossy codec (fp32 / bf16
    # when the values are). A codec spec ("chunk-topk:4096:64+int8") compresses the aggregate
    # itself: the owner keeps the top-K of each chunk, deterministically, so the all-gather is as
    # small as a payload; what the aggregate drops goes back to each sender's error feedback
    # (docs/compressed-exchange.md).
    result_codec: str = documented("", "what an aggregated slice travels as: '' = dense (fp16 for a lossy codec), or a "
                                    "codec spec such as chunk-topk:4096:64+int8 (a compressed, robustly aggregated all-gather)")
    # Which coordinates peers send. "" (default): each peer its own top-K per chunk (the codec's).
    # "shared:MIX[:DECAY]": every peer the same K per chunk, derived from public state (a share MIX
    # by an EMA of the applied aggregates, the rest drawn from the round's seed), so a
    # coordinate-wise rule sees n aligned values; "vote": the support chosen by the peers' top-K
    # index sets, a coordinate needing f + 1 proposers. A prototype that only `swarmloco simulate` runs
    # (optim/shared_support.py, docs/robust-compressed.md); the swarm refuses it.
    support: str = documented("", "'' = each peer sends its own top-K; shared:MIX[:DECAY] = every peer the same "
                              "coordinates from public state; vote = by the peers' index sets (simulate only, a prototype)")
    result_timeout_s: float = 60.0  # after the manifest: wait this long for slice results, then recompute what is missing
    result_grace_s: float = 2.0  # once every slice has a result: wait this long for the other owners' results

    def __post_init__(self) -> None:
        require(self.mode in ("sliced", "all-to-all"), f"exchange.mode={self.mode!r}: choose sliced or all-to-all")
        require(1 <= self.slices <= 4096, f"exchange.slices={self.slices}: use 1 to 4096 slices")
        require(1 <= self.replicas <= 8, f"exchange.replicas={self.replicas}: use 1 to 8 owners per slice")
        require(0 <= self.spot_checks <= self.slices, f"exchange.spot_checks={self.spot_checks}: use 0 to exchange.slices")
        require(self.spot_check_coverage > 0, f"exchange.spot_check_coverage={self.spot_check_coverage}: use a positive number")
        require(self.support in ("", "vote") or self.support.startswith("shared:"),
                f"exchange.support={self.support!r}: use '' (each peer's own top-K), shared:MIX (e.g. shared:0.5) or vote")
        require(self.result_timeout_s > 0 and self.result_grace_s >= 0, "exchange.result_timeout_s must be > 0, result_grace_s >= 0")


@dataclass(kw_only=True, slots=True)
class ControlConfig:
    """Who may coordinate the run, and how a standby takes over (docs/threat-model.md).

    A run's identity is its coordinator keys: peers accept manifests and signed states from these
    keys only. The active coordinator holds a lease in the DHT and renews it every third of it; when
    it lapses, a standby listed here takes over with a higher term. lease_s is the lease's floor: it
    grows to 4x the slowest measured renewal (peer/coordinator/lease.py), so a loaded machine
    lengthens it instead of losing it."""

    coordinators: list[str] = field(default_factory=list, metadata={
        "help": "fingerprints (peer ids) of the keys allowed to coordinate this run; the active coordinator's own is added"})
    lease_s: float = documented(6.0, "seconds a coordinator's DHT lease lasts at least (it grows with slow renewals): a standby takes over this long after the active one stops")
    end_grace_s: float = documented(60.0, "after the last round: keep serving the final state until every peer has it, at most this long")

    def __post_init__(self) -> None:
        for fingerprint in self.coordinators:
            require(len(fingerprint) == 32 and all(c in "0123456789abcdef" for c in fingerprint),
                     f"control.coordinators entry {fingerprint!r} is not a fingerprint (the 32 hex characters a coordinator prints)")
        require(1.0 <= self.lease_s <= 600.0, f"control.lease_s={self.lease_s}: use 1 to 600 seconds")
        require(self.end_grace_s >= 0, f"control.end_grace_s={self.end_grace_s}: use a non-negative number")
