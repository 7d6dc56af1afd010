"""A Byzantine training peer for the real-swarm tests: `python -m tests.byzantine_peer --attack SPEC peer ...`,
or a lying slice owner: `python -m tests.byzantine_peer --lie lone peer ...` / `--lie collude:ID,ID peer ...`.

SPEC is an optim.attacks name, optionally with JSON options: `nan`, `sign-flip:{"scale": 4.0}`,
`label-flip`. `--claim-work X` signs X times the inner steps and tokens the peer really did into
its headers (a peer buying influence in a compute-window run). The rest of the command line is `swarmloco peer`'s. The attack lives here, in a
subclass that overrides the node's public make_update phase (or poisons its sampler), so no
production class carries test-only attack code.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import torch

from optim import attacks
from peer.cli.main import build_parser, cmd_peer
from peer.exchange.peer_side import PeerExchange
from peer.exchange.sliced_peer import SlicedPeer
from peer.node.node import PeerNode, PeerOptions
from peer.cli.simulate_slices import false_result
from peer.node.round import Update
from peer.run.slice_exchange import SliceExchange
from peer.run.slice_round import SliceRound
from protocol.slice_result import sign_slice_results
from protocol.wire import swarm_pb2


class LyingOwner(SliceExchange):
    """Signs a false result for every slice it owns (`colluders` empty), or only for the slices
    whose owners are all colluders (then they agree on the lie, and only spot checks catch it),
    in one batch with its honest ones, as an owner signs them."""

    colluders: frozenset[str] = frozenset()

    def reduce_owned(self, rnd: SliceRound, marks: dict[str, float] | None = None) -> list[swarm_pb2.Signed]:
        results = []
        for data, result in self.reduce_owned_slices(rnd, marks):
            lie = not self.colluders or set(rnd.owners[result.slice]) <= self.colluders
            results.append(false_result(self.math, self.store, result.slice, data, result) if lie else result)
        return [sign_slice_results(self.identity, results)] if results else []


class ByzantinePeer(PeerNode):
    def __init__(self, options: PeerOptions, attack: attacks.Attack | None, lie: str | None = None,
                 claim_work: float = 1.0) -> None:
        super().__init__(options)
        self.attack = attack
        self.lie = lie
        self.claim_work = claim_work

    def make_exchange(self) -> PeerExchange:
        if self.lie is None:
            return super().make_exchange()
        engine = LyingOwner(self.math, self.pool, self.store, self.fetchers, own_endpoint=self.endpoint, identity=self.identity)
        mode, _, ids = self.lie.partition(":")
        engine.colluders = frozenset(ids.split(",")) if mode == "collude" else frozenset()
        return SlicedPeer(self.exchange_context(), engine=engine)

    def connect(self) -> None:
        super().connect()
        if self.attack is not None and self.attack.data_poisoning:  # label flip: honest work on poisoned batches
            self.trainer.sampler = attacks.PoisonedSampler(self.trainer.sampler)

    def make_update(self, r: int, delta: torch.Tensor, stats) -> Update:
        if self.attack is not None and not self.attack.data_poisoning:
            rng = torch.Generator().manual_seed(r)
            delta = self.attack(delta, delta[None, :], round=r, rng=rng, num_byzantine=1, history=None)
        if self.claim_work != 1.0:
            stats = dataclasses.replace(stats, steps=round(stats.steps * self.claim_work), tokens=round(stats.tokens * self.claim_work))
        return super().make_update(r, delta, stats)


def parse_attack(spec: str) -> attacks.Attack:
    name, _, options = spec.partition(":")
    return attacks.build(name, **(json.loads(options) if options else {}))


def main(argv: list[str] | None = None) -> int:
    front = argparse.ArgumentParser(prog="python -m tests.byzantine_peer", allow_abbrev=False)
    front.add_argument("--attack", help='an optim.attacks name[:JSON options], e.g. sign-flip:{"scale": 4.0}')
    front.add_argument("--lie", help="as a slice owner, sign false results: `lone` (every owned slice) or "
                                     "`collude:ID,ID,...` (only slices whose owners are all in the list)")
    front.add_argument("--claim-work", type=float, default=1.0, help="sign X times the work really done into each header")
    ours, rest = front.parse_known_args(argv)
    if not ours.attack and not ours.lie and ours.claim_work == 1.0:
        front.error("give --attack, --lie and/or --claim-work")
    attack = parse_attack(ours.attack) if ours.attack else None
    args = build_parser().parse_args(rest)
    if args.verb != "peer":
        front.error("the command after --attack must be `peer ...`")
    return cmd_peer(args, make_node=lambda options: ByzantinePeer(options, attack, ours.lie, ours.claim_work))


if __name__ == "__main__":
    sys.exit(main())
