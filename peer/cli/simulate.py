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

`--peer-speeds 1,1,0.5,0.25` gives each virtual peer a speed: with a fixed H every peer still
takes H steps (the round waits for the slowest, in simulated time); with a compute window
(rounds.window_s) each takes the steps its speed fits in the window and the aggregate weighs them
by work (peer/cli/simulate_speeds.py, the swarm's work_math).

The options are peer/cli/simulate_options.py; the per-round curve, log line and result dict
peer/cli/simulate_result.py.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from optim import attacks
from optim import eager as eager_math
from peer.cli.run_flags import load_run_config
from peer.run.config import RunConfig
from peer.learn.data import ShardSampler, load_corpus, validation_batches
from peer.learn.model import build_model, flat_params, initial_model, load_flat_params, num_params
from peer.cli.simulate_ddp import ConcatenatedSampler, ring_allreduce_bytes
from peer.cli.simulate_options import SimulationOptions
from peer.cli.simulate_result import Curve, human_bytes, log_round, simulation_result
from peer.cli.simulate_shared import SharedSupportRound, swarm_math_config
from peer.cli.simulate_slices import LYING_OWNER, LocalSlicedRound
from peer.cli.simulate_speeds import SpeedModel, parse_speeds
from peer.run.round_math import RoundMath, UpdateRejected
from protocol.reasons import count_for_cause
from peer.learn.training import InnerTrainer, evaluate


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
    return simulation_result(opts, cfg, curve, wall_s)


# --- DiLoCo ----------------------------------------------------------------------------------


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


def _run_diloco(opts: SimulationOptions, cfg: RunConfig) -> Curve:
    samplers, val_batches = _samplers(cfg, opts.peers)
    shared_cfg, cfg = (cfg, swarm_math_config(cfg)) if cfg.exchange.support else (None, cfg)  # RoundMath: rule + outer step
    global_model = initial_model(cfg.model, cfg.seed)  # holds θ_r for evaluation only (θ_0: model.init_from's, if set)
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
    curve = Curve(numel=numel, initial_val_loss=evaluate(global_model, val_batches))
    exchange = LocalSlicedRound(receiver, opts.peers, seed=cfg.seed) if lying else None
    shared = SharedSupportRound(shared_cfg, receiver, opts.peers) if shared_cfg is not None else None
    speeds = SpeedModel.of(cfg, opts.peer_speeds, opts.peers, receiver, (opts.claim_work,) * opts.byzantine)
    try:
        for r in range(cfg.rounds.rounds):
            t0 = time.perf_counter()
            deltas, losses = [], []
            before = _arrival_steps(opts, cfg) if r > 0 else cfg.inner.steps
            steps = speeds.steps()  # each peer's inner steps this round (inner.steps, or what its speed fits in the window)
            for peer in peers:
                start = params if peer.anchor is None else peer.anchor
                load_flat_params(peer.model, start)
                if peer.anchor is None or before == cfg.inner.steps:
                    losses.append(peer.trainer.run(steps[peer.index]).mean_loss)
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
            view = speeds.rule_view(steps, receiver.aggregator.name)  # per unit of work, where the rule looks there
            sent = _craft_attacks(opts, attack, peers, deltas, r, cfg.seed, view)
            if shared is not None:
                shared.begin(r, sent)

            payloads: list[bytes | None] = []
            excluded: dict[str, str] = {}
            for peer, delta in zip(peers, sent):
                try:
                    payloads.append(peer.sender.encode(delta, r) if shared is None else shared.encode(peer.index, delta))
                except ValueError as exc:  # a codec that refuses the input: nothing goes on the wire
                    payloads.append(None)
                    excluded[str(peer.index)] = f"unencodable: {exc}"
            updates, authors = [], []
            for peer, payload in zip(peers, payloads):  # peer order = the manifest's sorted order
                if payload is None:
                    continue
                try:
                    updates.append(receiver.decode(payload, r) if shared is None else shared.decode(payload))
                    authors.append(peer.index)
                except UpdateRejected as exc:
                    excluded[str(peer.index)] = exc.reason
            work, history = speeds.work(authors, steps)  # what their headers would claim, capped as the owners do
            if shared is not None:  # aligned values on the round's shared support, the rule per coordinate
                receiver.step_with_aggregate(params, shared.aggregate(updates, r, count_for_cause(excluded)), round_=r)
            elif exchange is None:
                receiver.apply(params, updates, round_=r, excluded_for_cause=count_for_cause(excluded), work=work)  # θ_r -> θ_{r+1} in place (no-op when nothing survived)
            else:  # the sliced exchange run for real, liars signing false results; an honest peer's gather
                combined = exchange.run(payloads, r, liars=set(range(opts.byzantine)), spot_checks=cfg.exchange.spot_checks)
                receiver.step_with_aggregate(params, combined, round_=r)

            # Each sender keeps what this round's aggregate did not apply of its message (all of it
            # when no update survived: then nothing was applied, and last_aggregate is an older round's).
            applied = receiver.last_aggregate if updates or exchange is not None else torch.zeros(numel)
            sizes = [0 if p is None else len(p) for p in payloads]
            if shared is not None:
                shared.finish(applied)
                upload, download = shared.traffic(sizes)
            else:
                for peer in peers:
                    peer.sender.restore_unapplied(applied, r)
                upload, download = receiver.mode.traffic(receiver, sizes)
            curve.upload_bytes.append(upload)
            curve.download_bytes.append(download)
            load_flat_params(global_model, params)
            curve.val_loss.append(evaluate(global_model, val_batches))
            curve.train_loss.append(sum(losses) / len(losses))
            curve.excluded.append(excluded)
            speeds.close(authors, steps, history, count_for_cause(excluded))
            lies = exchange.lies.rounds[-1] if exchange is not None else None
            log_round(opts, cfg, curve, r, time.perf_counter() - t0, lies)
    finally:
        if exchange is not None:
            exchange.close()
    curve.final_params_sha256 = hashlib.sha256(params.numpy().tobytes()).hexdigest()
    curve.lies = None if exchange is None else exchange.lies.to_dict()
    curve.work = speeds.summary()
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
    view: tuple[list[int], list[int]] | None = None,
) -> list[torch.Tensor]:
    """Replace the first `byzantine` peers' Δ by the attack's, seeing this round's honest Δs.

    `view` (each peer's real and claimed steps): the rule sees rows per unit of claimed work, so
    the attacker crafts its row there (every Δ over its steps) and sends it times its claimed
    steps: once the owners divide by its claim, the rule sees exactly the crafted row."""
    if attack is None or attack.data_poisoning:
        return deltas  # label-flip's poison is already in the attackers' training batches
    real, claimed = view if view is not None else ([1] * len(deltas), [1] * len(deltas))
    seen = deltas if view is None else [d / n for d, n in zip(deltas, real)]
    honest = torch.stack(seen[opts.byzantine :])  # (n - f, d)
    sent = list(deltas)
    for i in range(opts.byzantine):
        rng = torch.Generator().manual_seed(seed * 1_000_003 + r * 1009 + i)
        sent[i] = attack(seen[i], honest, round=r, rng=rng, num_byzantine=opts.byzantine, history=peers[i].history)
        if view is not None:
            sent[i] = sent[i] * claimed[i]
        peers[i].history.append(seen[i])
    return sent


# --- DDP -------------------------------------------------------------------------------------


def _run_ddp(opts: SimulationOptions, cfg: RunConfig) -> Curve:
    samplers, val_batches = _samplers(cfg, opts.peers)
    model = initial_model(cfg.model, cfg.seed)
    numel = num_params(model)
    trainer = InnerTrainer(model, cfg.inner, ConcatenatedSampler(samplers))  # type: ignore[arg-type]
    curve = Curve(numel=numel, initial_val_loss=evaluate(model, val_batches))
    per_round = ring_allreduce_bytes(numel, opts.peers) * cfg.inner.steps  # sent + received, per peer
    for r in range(cfg.rounds.rounds):
        t0 = time.perf_counter()
        stats = trainer.run(cfg.inner.steps)
        curve.val_loss.append(evaluate(model, val_batches))
        curve.train_loss.append(stats.mean_loss)
        curve.upload_bytes.append([per_round // 2] * opts.peers)
        curve.download_bytes.append([per_round - per_round // 2] * opts.peers)
        curve.excluded.append({})
        log_round(opts, cfg, curve, r, time.perf_counter() - t0)
    return curve


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
        peer_speeds=parse_speeds(args.peer_speeds) if args.peer_speeds else None,
        claim_work=args.claim_work,
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
        f"{human_bytes(result['bytes_per_peer_per_round'])}/peer/round (up {human_bytes(result['upload_bytes_per_peer_per_round'])}) | "
        f"total {human_bytes(result['total_bytes'])} | ddp-equivalent {human_bytes(result['ddp_equivalent_bytes'])} "
        f"({result['ratio_vs_ddp'] or 0:.1f}x fewer)"
    )
    work = result["work"]
    if work and (opts.peer_speeds or cfg.rounds.window_s):
        print(f"speeds {work['peer_speeds']}: {work['simulated_seconds']:.1f} simulated s | utilization "
              + ", ".join(f"{u:.0%}" for u in work["utilization"]) + " | counted share "
              + ", ".join(f"{c:.0%}" for c in work["counted_share"]) + " vs compute share "
              + ", ".join(f"{c:.0%}" for c in work["compute_share"]))
    if result["lying_owner"]:
        lies = result["lying_owner"]
        print(f"lying owners: {lies['told']} false results signed, {lies['caught']} caught, {lies['uncaught']} uncaught "
              f"({lies['slices_with_only_liars']} slices had only lying owners; exchange.spot_checks catches those)")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0
