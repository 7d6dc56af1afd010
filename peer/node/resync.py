"""Where a peer that is behind gets the swarm's state θ_r (+ the outer optimizer's global state).

First from the in-sync peers that hold it, part by part in parallel, each part checked against
the coordinator's signed state manifest (peer/run/state_sync.py); only when that fails, from the
coordinator's checkpoint stream. Either way the result must match the hash the coordinator signs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import torch

from peer.learn.model import param_hash
from peer.node.errors import PeerExit
from peer.run import checkpoint, state_sync
from peer.run.progress import format_bytes
from protocol.envelope import EnvelopeError
from protocol.run_state import CoordinatorKeys
from protocol.state_manifest import open_state_manifest

log = logging.getLogger("swarmloco.peer")


@dataclass(slots=True)
class SwarmState:
    round: int
    params: torch.Tensor  # (d,)
    global_state: dict
    source: str  # what it came from, for the log line


@dataclass(slots=True)
class StateSource:
    client: Any  # CoordinatorClient
    pool: Any  # ChannelPool
    workers: Any  # ThreadPoolExecutor for the parallel part downloads
    config_hash: str
    run_id: str
    keys: CoordinatorKeys  # the run's coordinator keys: the state manifest must be signed by one
    signed_hash: Callable[[int], str | None]  # the hash of θ_round the coordinator signed (None: not kept)
    own_endpoint: str
    max_part_bytes: int

    def fetch(self) -> SwarmState:
        state = self.from_swarm()
        return state if state is not None else self.from_checkpoint()

    def from_swarm(self) -> SwarmState | None:
        info = self.client.run_info()
        if not info.HasField("state_manifest"):
            return None
        try:
            manifest = open_state_manifest(info.state_manifest, keys=self.keys, run_id=self.run_id,
                                           max_bytes=self.max_part_bytes)
            if manifest.config_hash != self.config_hash:
                raise PeerExit("the swarm's state is for another run config; restart the peer to pick up the new config")
            holders = [h for h in info.state_holders if h != self.own_endpoint]
            parts = state_sync.download(self.pool, self.workers, manifest, holders, self.client.endpoint)
            round_, declared, params, global_state = state_sync.rebuild(parts)
        except (EnvelopeError, IOError, ValueError) as exc:
            log.info("state download from the swarm failed (%s); using the coordinator's checkpoint", exc)
            return None
        if param_hash(params) != manifest.param_hash or declared != manifest.param_hash or round_ != manifest.round:
            log.warning("the swarm's state does not match its signed hash; using the coordinator's checkpoint")
            return None
        return SwarmState(round_, params, global_state, f"{len(holders)} peer(s) + coordinator, {format_bytes(sum(manifest.part_sizes))}")

    def from_checkpoint(self) -> SwarmState:
        data, _ = self.client.checkpoint()
        ckpt = checkpoint.from_bytes(data)
        if ckpt.config_hash != self.config_hash:
            raise PeerExit("the coordinator's checkpoint is for another run config; restart the peer to pick up the new config")
        if param_hash(ckpt.params) != ckpt.param_hash:
            raise PeerExit("downloaded checkpoint does not match its declared parameter hash; retry later")
        # Accepted only against the hash a run key signed for that round, never on self-consistency alone.
        signed = self.signed_hash(ckpt.round)
        if signed != ckpt.param_hash:
            raise PeerExit(f"the checkpoint of round {ckpt.round} does not match the hash the run's coordinator signed "
                           f"({(signed or 'none kept')[:16]} vs {ckpt.param_hash[:16]}); restart the peer to try again")
        return SwarmState(ckpt.round, ckpt.params, ckpt.outer_state, f"coordinator checkpoint, {format_bytes(len(data))}")
