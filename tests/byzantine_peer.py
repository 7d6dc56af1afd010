"""A Byzantine training peer for the real-swarm tests: `python -m tests.byzantine_peer --attack SPEC peer ...`.

SPEC is an optim.attacks name, optionally with JSON options: `nan`, `sign-flip:{"scale": 4.0}`,
`label-flip`. The rest of the command line is `swarmloco peer`'s. The attack lives here, in a
subclass that overrides the node's public make_update phase (or poisons its sampler), so no
production class carries test-only attack code.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from optim import attacks
from peer.cli.main import build_parser, cmd_peer
from peer.node.node import PeerNode, PeerOptions
from peer.node.round_exchange import Update


class ByzantinePeer(PeerNode):
    def __init__(self, options: PeerOptions, attack: attacks.Attack) -> None:
        super().__init__(options)
        self.attack = attack

    def connect(self) -> None:
        super().connect()
        if self.attack.data_poisoning:  # label flip: honest work on poisoned batches
            self.trainer.sampler = attacks.PoisonedSampler(self.trainer.sampler)

    def make_update(self, r: int, delta: torch.Tensor) -> Update:
        if not self.attack.data_poisoning:
            rng = torch.Generator().manual_seed(r)
            delta = self.attack(delta, delta[None, :], round=r, rng=rng, num_byzantine=1, history=None)
        return super().make_update(r, delta)


def parse_attack(spec: str) -> attacks.Attack:
    name, _, options = spec.partition(":")
    return attacks.build(name, **(json.loads(options) if options else {}))


def main(argv: list[str] | None = None) -> int:
    front = argparse.ArgumentParser(prog="python -m tests.byzantine_peer", allow_abbrev=False)
    front.add_argument("--attack", required=True, help='an optim.attacks name[:JSON options], e.g. sign-flip:{"scale": 4.0}')
    ours, rest = front.parse_known_args(argv)
    attack = parse_attack(ours.attack)
    args = build_parser().parse_args(rest)
    if args.verb != "peer":
        front.error("the command after --attack must be `peer ...`")
    return cmd_peer(args, make_node=lambda options: ByzantinePeer(options, attack))


if __name__ == "__main__":
    sys.exit(main())
