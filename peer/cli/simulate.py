"""`swarmloco simulate`: N virtual peers in one process, the real round math without the network.

Every virtual peer owns a model, an InnerTrainer (AdamW kept across rounds) on shard i of n, and
its own sender RoundMath (error-feedback residual, DeMo local momentum: state that never leaves a
peer). One receiver RoundMath stands for every honest node: in the real swarm they all run the
same deterministic decode -> aggregate -> outer step on the same bytes, so one copy is exact.

Per round r, as a real peer does it (peer/node/node.py):
    θ_r -> H inner steps per peer -> Δ_i = θ_r − θ_i -> (attackers craft Δ) -> encode -> bytes
    -> decode every payload (non-finite / undecodable ones excluded, as the manifest would)
    -> aggregate (sorted by peer) -> outer step -> θ_{r+1} -> val loss on the fixed batches.

Bytes are counted, not estimated: len(payload) of every update. In the exchange each peer uploads
its own payload once and downloads the n-1 others, so per peer per round it moves
len(own) + Σ len(others); `total_bytes` sums that over peers and rounds.

Byzantine peers are the first `byzantine` virtual peers. They train honestly and then replace
their Δ with the attack's (omniscient: they see this round's honest Δs); `label-flip` instead
poisons their batches. `lying-owner` (sliced exchange only) attacks the exchange instead of the
rule: the attackers send honest updates and sign false results for the slices they own; the round
then runs through peer/cli/simulate_slices.py (the real engine: owner draw, signed results, an
honest peer's gather with recomputation and spot checks) and the JSON counts the lies told and
caught. `--baseline ddp` runs synchronous data-parallel on the same peers instead
(peer/cli/simulate_ddp.py), logging val loss every H steps so its curve lines up with the rounds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from optim import aggregate, attacks
from optim import eager as eager_math
from peer.cli.run_flags import load_run_config, resolve_run_config
from peer.run.config import RunConfig
from peer.learn.data import ShardSampler, load_corpus, validation_batches
from peer.learn.model import build_model, flat_params, load_flat_params, num_params
from peer.cli.simulate_ddp import ConcatenatedSampler, ring_allreduce_bytes
from peer.cli.simulate_slices import LYING_OWNER, LocalSlicedRound
from peer.run.progress import format_bytes
from peer.run.slice_plan import expected_traffic
from peer.run.round_math import RoundMath, UpdateRejected
from protocol.reasons import count_for_cause
from peer.learn.training import InnerTrainer, evaluate

Baseline = Literal["diloco", "ddp"]
ATTACK_NAMES = (*attacks.NAMES, LYING_OWNER)


@dataclass(kw_only=True)
class SimulationOptions:
    """What to simulate: simulate's own options and the run config.

    The CLI passes `config` as loaded from its run-config flags (peer/cli/run_flags.py, the same
    loader every verb uses). Scripts may name overrides here instead (None keeps the config's
    value); run_config() applies them through that loader.
    """

    peers: int = 4
    rounds: int | None = None  # None: config.rounds.rounds
    inner_steps: int | None = None  # H; None: config.inner.steps
    codec: str | None = None  # e.g. "topk:0.01+int8"; None: config.compression.codec
    outer: str | None = None  # nesterov | demo | fedavg; None: config.outer.name
    aggregator: str | None = None  # None: config.aggregation.name
    seed: int | None = None  # None: config.seed (model init, shards' sampling streams, codec seeds)
    # The first `byzantine` peers attack; the aggregator tolerates as many unless the config says more.
    byzantine: int = 0
    attack: str | None = None
    attack_options: dict[str, Any] = field(default_factory=dict)
    baseline: Baseline = "diloco"
    # torch intra-op threads. 1 by default: the model's 128-wide matmuls gain ~25% from a second
    # thread on an idle machine, but with any other process on the cores OpenMP's spinning threads
    # slowed an 8-round run from 47 s to over 10 minutes here. None: leave torch's setting.
    threads: int | None = 1
    # Overlapped rounds (--overlap): the share of the next phase's inner steps done before the
    # average in flight lands and the peer moves onto θ_{r+1} (peer/node/overlap.py does so after
    # the inner step during which its exchange finished). 1.0: at the phase's end, the worst case,
    # an exchange as long as a whole phase; 0.5: an exchange half as long as the phase.
    overlap_arrival: float = 1.0
    config: RunConfig = field(default_factory=RunConfig)
    log: Callable[[str], None] | None = None  # receives one dense line per round

    def __post_init__(self) -> None:
        if self.peers < 1:
            raise ValueError(f"--peers {self.peers}: simulate at least 1 peer")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"--threads {self.threads}: use at least 1 thread")
        if not 0 <= self.overlap_arrival <= 1:
            raise ValueError(f"--overlap-arrival {self.overlap_arrival}: use a share of the phase in [0, 1] (1: at its end)")
        if self.baseline not in ("diloco", "ddp"):
            raise ValueError(f"--baseline {self.baseline!r}: choose diloco or ddp")
        if not 0 <= self.byzantine < self.peers:
            raise ValueError(
                f"--num-byzantine {self.byzantine} attackers with --peers {self.peers}: need 0 <= attackers < peers "
                "(at least one honest peer must remain)"
            )
        if self.byzantine > 0 and self.attack is None:
            raise ValueError(f"{self.byzantine} Byzantine peers need --attack NAME; valid names: {', '.join(ATTACK_NAMES)}")
        if self.attack is not None and self.byzantine == 0:
            raise ValueError(f"--attack {self.attack} needs --num-byzantine F (the first F peers attack), F >= 1")
        if self.baseline == "ddp" and self.byzantine:
            raise ValueError("--baseline ddp has no aggregation to attack; drop --attack")
        if self.attack == LYING_OWNER and self.attack_options:
            raise ValueError(f"--attack {LYING_OWNER} takes no options (each liar shifts its honest result by 0.01)")
        if self.attack is not None and self.attack != LYING_OWNER:
            attacks.build(self.attack, **self.attack_options)  # unknown name/option -> ValueError here

    def run_config(self) -> RunConfig:
        """The run config with this simulation's overrides applied, validated like every verb's."""
        named = {
            "rounds.rounds": self.rounds, "inner.steps": self.inner_steps, "compression.codec": self.codec,
            "outer.name": self.outer, "aggregation.name": self.aggregator, "seed": self.seed,
        }
        overrides = {path: value for path, value in named.items() if value is not None}
        # Lying owners send honest updates: the rule has nothing of theirs to tolerate.
        if self.byzantine and not self.config.aggregation.num_byzantine and self.attack != LYING_OWNER:
            overrides["aggregation.num_byzantine"] = self.byzantine
        cfg = resolve_run_config(self.config, overrides)
        if self.attack == LYING_OWNER and cfg.exchange.mode != "sliced":
            raise ValueError(
                f"--attack {LYING_OWNER} lies as a slice owner, which only the sliced exchange has; "
                f"this run config has exchange.mode = {cfg.exchange.mode!r}: set it to \"sliced\""
            )
        f = cfg.aggregation.num_byzantine
        need = aggregate.minimum_rows(cfg.aggregation.name, f)
        if self.baseline == "diloco" and self.peers < need:
            raise ValueError(
                f"--aggregator {cfg.aggregation.name} tolerating {f} Byzantine peer(s) needs at least {need} "
                f"peers, got --peers {self.peers}: add peers or lower --num-byzantine"
            )
        return cfg


@dataclass
class VirtualPeer:
    index: int
    model: torch.nn.Module
    trainer: InnerTrainer
    sender: RoundMath  # this peer's codec/outer sender state (error feedback, DeMo momentum)
    history: list[torch.Tensor] = field(default_factory=list)  # an attacker's own past honest Δs
    anchor: torch.Tensor | None = None  # overlapped: where this peer's inner phase starts (None: θ_r)
    own_previous: torch.Tensor | None = None  # overlapped + eager: its Δ of the last round


def run_simulation(opts: SimulationOptions) -> dict[str, Any]:
    """Run the simulation described by `opts`; returns the JSON-ready result dict."""
    cfg = opts.run_config()
    previous_threads = torch.get_num_threads()
    if opts.threads is not None:
        torch.set_num_threads(opts.threads)
    try:
        started = time.perf_counter()
        if opts.baseline == "ddp":
            curve = _run_ddp(opts, cfg)
        else:
            curve = _run_diloco(opts, cfg)
        wall_s = time.perf_counter() - started
    finally:
        torch.set_num_threads(previous_threads)
    return _result(opts, cfg, curve, wall_s)


# --- DiLoCo ----------------------------------------------------------------------------------


@dataclass
class _Curve:
    """What both baselines measure, one entry per round (all byte counts are per round)."""

    numel: int
    initial_val_loss: float
    val_loss: list[float] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)  # mean inner loss over peers and steps
    upload_bytes: list[list[int]] = field(default_factory=list)  # [round][peer]
    download_bytes: list[list[int]] = field(default_factory=list)  # [round][peer]
    excluded: list[dict[str, str]] = field(default_factory=list)  # [round] {peer index: reason}
    final_params_sha256: str | None = None  # θ after the last round (diloco): bit-identity checks
    lies: dict[str, Any] | None = None  # lying-owner: lies told / caught (simulate_slices.LieCount)


def _samplers(cfg: RunConfig, peers: int) -> tuple[list[ShardSampler], list]:
    corpus = load_corpus(cfg.data, seq_len=cfg.model.seq_len)
    samplers = [
        ShardSampler(
            corpus.train, shard=i, num_shards=peers, batch_size=cfg.data.batch_size,
            seq_len=cfg.model.seq_len, seed=cfg.seed,
        )
        for i in range(peers)
    ]
    return samplers, validation_batches(corpus, cfg.data.batch_size, cfg.model.seq_len, cfg.data.val_batches)


def _run_diloco(opts: SimulationOptions, cfg: RunConfig) -> _Curve:
    samplers, val_batches = _samplers(cfg, opts.peers)
    global_model = build_model(cfg.model, cfg.seed)  # holds θ_r for evaluation only
    params = flat_params(global_model)  # θ_r, (d,) float32
    numel = params.numel()
    lying = opts.attack == LYING_OWNER  # honest updates; the first `byzantine` peers lie as slice owners
    attack = attacks.build(opts.attack, **opts.attack_options) if opts.attack and not lying else None
    peers: list[VirtualPeer] = []
    for i, sampler in enumerate(samplers):
        model = build_model(cfg.model, cfg.seed)
        if attack is not None and attack.data_poisoning and i < opts.byzantine:
            sampler = attacks.PoisonedSampler(sampler)  # label flip: the attacker trains on poisoned batches
        trainer = InnerTrainer(model, cfg.inner, sampler)
        peers.append(VirtualPeer(i, model, trainer, RoundMath(cfg, numel)))
    receiver = RoundMath(cfg, numel)  # aggregator + outer global state, shared by all honest nodes
    curve = _Curve(numel=numel, initial_val_loss=evaluate(global_model, val_batches))
    exchange = LocalSlicedRound(receiver, opts.peers, seed=cfg.seed) if lying else None
    try:
        for r in range(cfg.rounds.rounds):
            t0 = time.perf_counter()
            deltas, losses = [], []
            before = _arrival_steps(opts, cfg) if r > 0 else cfg.inner.steps
            for peer in peers:
                start = params if peer.anchor is None else peer.anchor
                load_flat_params(peer.model, start)
                if peer.anchor is None or before == cfg.inner.steps:
                    losses.append(peer.trainer.run(cfg.inner.steps).mean_loss)
                else:  # overlapped: θ_r lands `before` steps into the phase; the progress moves onto it
                    loss = peer.trainer.run(before).mean_loss * before if before else 0.0
                    load_flat_params(peer.model, flat_params(peer.model) - start + params)
                    start = params
                    after = cfg.inner.steps - before
                    losses.append((loss + peer.trainer.run(after).mean_loss * after) / cfg.inner.steps)
                deltas.append(start - flat_params(peer.model))  # pseudo-gradient Δ_i = −progress, (d,)
            if cfg.rounds.overlap_communication:  # the next phase starts before θ_{r+1} is known, as in overlap.py
                for peer, delta in zip(peers, deltas):
                    peer.anchor = eager_math.next_start(
                        receiver.outer_at(r), params, delta, eager=cfg.rounds.eager_updates, mode=cfg.rounds.eager_estimate,
                        last_average=receiver.last_aggregate, own_previous=peer.own_previous,
                        peers=len(peers) if receiver.last_aggregate is not None else 0)  # as the node: none known yet
                    peer.own_previous = delta
            sent = _craft_attacks(opts, attack, peers, deltas, r, cfg.seed)

            payloads: list[bytes | None] = []
            excluded: dict[str, str] = {}
            for peer, delta in zip(peers, sent):
                try:
                    payloads.append(peer.sender.encode(delta, r))
                except ValueError as exc:  # a codec that refuses the input: nothing goes on the wire
                    payloads.append(None)
                    excluded[str(peer.index)] = f"unencodable: {exc}"
            updates = []
            for peer, payload in zip(peers, payloads):  # peer order = the manifest's sorted order
                if payload is None:
                    continue
                try:
                    updates.append(receiver.decode(payload, r))
                except UpdateRejected as exc:
                    excluded[str(peer.index)] = exc.reason
            if exchange is None:
                receiver.apply(params, updates, round_=r, excluded_for_cause=count_for_cause(excluded))  # θ_r -> θ_{r+1} in place (no-op when nothing survived)
            else:  # the sliced exchange run for real, liars signing false results; an honest peer's gather
                combined = exchange.run(payloads, r, liars=set(range(opts.byzantine)), spot_checks=cfg.exchange.spot_checks)
                receiver.step_with_aggregate(params, combined, round_=r)

            sizes = [0 if p is None else len(p) for p in payloads]
            if receiver.sliced:  # expected bytes of the owner draw (every virtual peer serves)
                result_bytes = receiver.numel * {"fp32": 4, "fp16": 2, "bf16": 2}[receiver.result_format]
                xc = cfg.exchange
                traffic = [expected_traffic(len(sizes), own, result_bytes, xc.replicas, spot_checks=xc.spot_checks,
                                            coverage=xc.spot_check_coverage, num_slices=receiver.layout.num_slices)
                           for own in sizes]
                curve.upload_bytes.append([round(x["sent"]) for x in traffic])
                curve.download_bytes.append([round(x["received"]) for x in traffic])
            else:  # all-to-all: each peer uploads its payload once and fetches every other one
                curve.upload_bytes.append(sizes)
                curve.download_bytes.append([sum(sizes) - own for own in sizes])
            load_flat_params(global_model, params)
            curve.val_loss.append(evaluate(global_model, val_batches))
            curve.train_loss.append(sum(losses) / len(losses))
            curve.excluded.append(excluded)
            lies = exchange.lies.rounds[-1] if exchange is not None else None
            _log_round(opts, cfg, curve, r, time.perf_counter() - t0, lies)
    finally:
        if exchange is not None:
            exchange.close()
    curve.final_params_sha256 = hashlib.sha256(params.numpy().tobytes()).hexdigest()
    curve.lies = None if exchange is None else exchange.lies.to_dict()
    return curve


def _arrival_steps(opts: SimulationOptions, cfg: RunConfig) -> int:
    """Overlapped: inner steps of a phase run before the average in flight lands."""
    return min(cfg.inner.steps, max(0, round(opts.overlap_arrival * cfg.inner.steps)))


def _craft_attacks(
    opts: SimulationOptions,
    attack: attacks.Attack | None,
    peers: list[VirtualPeer],
    deltas: list[torch.Tensor],
    r: int,
    seed: int,
) -> list[torch.Tensor]:
    """Replace the first `byzantine` peers' Δ by the attack's, seeing this round's honest Δs."""
    if attack is None or attack.data_poisoning:
        return deltas  # label-flip's poison is already in the attackers' training batches
    honest = torch.stack(deltas[opts.byzantine :])  # (n - f, d)
    sent = list(deltas)
    for i in range(opts.byzantine):
        rng = torch.Generator().manual_seed(seed * 1_000_003 + r * 1009 + i)
        sent[i] = attack(
            deltas[i], honest, round=r, rng=rng, num_byzantine=opts.byzantine, history=peers[i].history
        )
        peers[i].history.append(deltas[i])
    return sent


# --- DDP -------------------------------------------------------------------------------------


def _run_ddp(opts: SimulationOptions, cfg: RunConfig) -> _Curve:
    samplers, val_batches = _samplers(cfg, opts.peers)
    model = build_model(cfg.model, cfg.seed)
    numel = num_params(model)
    trainer = InnerTrainer(model, cfg.inner, ConcatenatedSampler(samplers))  # type: ignore[arg-type]
    curve = _Curve(numel=numel, initial_val_loss=evaluate(model, val_batches))
    per_round = ring_allreduce_bytes(numel, opts.peers) * cfg.inner.steps  # sent + received, per peer
    for r in range(cfg.rounds.rounds):
        t0 = time.perf_counter()
        stats = trainer.run(cfg.inner.steps)
        curve.val_loss.append(evaluate(model, val_batches))
        curve.train_loss.append(stats.mean_loss)
        curve.upload_bytes.append([per_round // 2] * opts.peers)
        curve.download_bytes.append([per_round - per_round // 2] * opts.peers)
        curve.excluded.append({})
        _log_round(opts, cfg, curve, r, time.perf_counter() - t0)
    return curve


# --- results ---------------------------------------------------------------------------------


def _log_round(opts: SimulationOptions, cfg: RunConfig, curve: _Curve, r: int, seconds: float, lies: dict | None = None) -> None:
    if opts.log is None:
        return
    up, down = curve.upload_bytes[-1], curve.download_bytes[-1]
    moved = (sum(up) + sum(down)) / len(up)
    excluded = curve.excluded[-1]
    opts.log(
        f"round {r + 1:>3}/{cfg.rounds.rounds} | val {curve.val_loss[-1]:.4f} | train {curve.train_loss[-1]:.4f} | "
        f"up {_human(sum(up) / len(up))}/peer | up+down {_human(moved)}/peer | "
        f"excluded {len(excluded)}{' ' + str(sorted(excluded.items())) if excluded else ''} | "
        + (f"lies told {lies['told']} caught {lies['caught']} (liar-only slices {lies['slices_with_only_liars']}) | " if lies else "")
        + f"{seconds:.1f}s"
    )


def _human(n: float) -> str:
    return format_bytes(n, digits=1)


def _result(opts: SimulationOptions, cfg: RunConfig, curve: _Curve, wall_s: float) -> dict[str, Any]:
    n, rounds, steps = opts.peers, cfg.rounds.rounds, cfg.inner.steps
    per_round_total = [sum(u) + sum(d) for u, d in zip(curve.upload_bytes, curve.download_bytes)]
    total = sum(per_round_total)
    uploads = sum(sum(u) for u in curve.upload_bytes)
    ddp_bytes = ring_allreduce_bytes(curve.numel, n) * steps * rounds * n
    cumulative, running = [], 0
    for b in per_round_total:
        running += b
        cumulative.append(running)
    return {
        "baseline": opts.baseline,
        "peers": n,
        "overlap_arrival": opts.overlap_arrival if cfg.rounds.overlap_communication else None,
        "rounds": rounds,
        "inner_steps": steps,
        "numel": curve.numel,
        "seed": cfg.seed,
        "codec": cfg.compression.codec if opts.baseline == "diloco" else "fp32-allreduce",
        "outer": cfg.outer.name if opts.baseline == "diloco" else None,
        "aggregator": cfg.aggregation.name if opts.baseline == "diloco" else None,
        "attack": opts.attack,
        "attack_options": dict(opts.attack_options),
        "byzantine": opts.byzantine,
        "initial_val_loss": curve.initial_val_loss,
        "final_val_loss": curve.val_loss[-1],
        "val_loss_per_round": curve.val_loss,
        "train_loss_per_round": curve.train_loss,
        "bytes_per_peer_per_round": total / (n * rounds),
        "upload_bytes_per_peer_per_round": uploads / (n * rounds),
        "bytes_per_round": per_round_total,  # all peers, up + down
        "cumulative_bytes_per_round": cumulative,
        "total_bytes": total,
        "ddp_equivalent_bytes": ddp_bytes,
        "ratio_vs_ddp": ddp_bytes / total if total else None,
        "excluded_per_round": curve.excluded,
        "final_params_sha256": curve.final_params_sha256,
        "lying_owner": curve.lies,
        "bytes_note": (
            "measured len(payload): each peer uploads its own once and downloads the n-1 others"
            if opts.baseline == "diloco"
            else "ring all-reduce of dense fp32 gradients every step: 2*2(n-1)/n*4*numel per peer per step"
        ),
        "wall_s": wall_s,
        "config": cfg.to_dict(),
    }


# --- CLI -------------------------------------------------------------------------------------


def _parse_attack_options(items: list[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--attack-option {item!r}: use KEY=VALUE, e.g. --attack-option scale=4")
        try:
            options[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            options[key.strip()] = value
    return options


def options_from_args(args: argparse.Namespace) -> SimulationOptions:
    """`swarmloco simulate`'s flags (peer/cli/main.py) -> options; with --attack, the first
    --num-byzantine peers attack."""
    config = load_run_config(args)
    return SimulationOptions(
        peers=args.peers, byzantine=config.aggregation.num_byzantine if args.attack else 0, attack=args.attack,
        attack_options=_parse_attack_options(args.attack_option), baseline=args.baseline,
        threads=args.threads, overlap_arrival=args.overlap_arrival, config=config, log=lambda line: print(line, flush=True),
    )


def main(args: argparse.Namespace) -> int:
    try:
        opts = options_from_args(args)
        cfg = opts.run_config()
        what = (
            "ddp baseline (fp32 gradient all-reduce every step)"
            if opts.baseline == "ddp"
            else f"diloco codec={cfg.compression.codec} outer={cfg.outer.name} aggregator={cfg.aggregation.name}"
            + (f" attack={opts.attack} x{opts.byzantine}" if opts.attack else "")
        )
        print(f"simulate: {opts.peers} peers x {cfg.rounds.rounds} rounds x {cfg.inner.steps} inner steps, {what}", flush=True)
        result = run_simulation(opts)
    except ValueError as exc:
        print(f"swarmloco simulate: error: {exc}", file=sys.stderr)
        return 2
    print(
        f"done in {result['wall_s']:.1f}s | val {result['initial_val_loss']:.4f} -> {result['final_val_loss']:.4f} | "
        f"{_human(result['bytes_per_peer_per_round'])}/peer/round (up {_human(result['upload_bytes_per_peer_per_round'])}) | "
        f"total {_human(result['total_bytes'])} | ddp-equivalent {_human(result['ddp_equivalent_bytes'])} "
        f"({result['ratio_vs_ddp'] or 0:.1f}x fewer)"
    )
    if result["lying_owner"]:
        lies = result["lying_owner"]
        print(f"lying owners: {lies['told']} false results signed, {lies['caught']} caught, {lies['uncaught']} uncaught "
              f"({lies['slices_with_only_liars']} slices had only lying owners; exchange.spot_checks catches those)")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0
