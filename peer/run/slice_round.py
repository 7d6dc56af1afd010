"""One round of the sliced exchange as its signed manifest fixes it: the owner draw, the manifest,
the round object every step of peer/run/slice_exchange.py works on, and what a gather found.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from peer.run import slice_plan
from peer.run.round_math import RoundMath
from protocol import merkle
from protocol.envelope import ManifestEntry, RoundManifest, UpdateHeader, signed_from_json
from protocol.slice_result import SliceResult
from protocol.slice_result_wire import BatchUnpacker, pack_batches
from protocol.wire import swarm_pb2


def draw_owners(math: RoundMath, r: int, entries: list[ManifestEntry]) -> list[list[str]]:
    """Each slice's owners, drawn among the serving authors from the listed payload hashes: what
    the coordinator signs and every node re-checks."""
    seed = slice_plan.owner_seed(math.cfg.run_id, r, [e.payload_sha256 for e in entries])
    return slice_plan.assign_owners([e.peer_id for e in entries if e.serves], math.layout.num_slices,
                                    math.cfg.exchange.replicas, seed)


def sliced_manifest(math: RoundMath, r: int, entries: list[ManifestEntry], *, base_param_hash: str,
                    excluded: dict[str, str] | None = None) -> RoundManifest:
    """The round's manifest: entries sorted by peer_id, with the owner draw."""
    entries = sorted(entries, key=lambda e: e.peer_id)
    return RoundManifest(run_id=math.cfg.run_id, round=r, base_param_hash=base_param_hash, entries=entries,
                         excluded=dict(excluded or {}), owners=draw_owners(math, r, entries))


@dataclass(slots=True)
class SliceRound:
    """One round's sliced exchange as the signed manifest fixes it."""

    round: int
    manifest: RoundManifest
    manifest_sha256: str
    headers: dict[str, UpdateHeader]  # peer_id -> verified header, in the manifest's order
    holders: dict[str, list[str]]  # peer_id -> endpoints holding that update's slices
    owners: list[list[str]]  # slice -> owner peer_ids
    endpoints: dict[str, str]  # owner peer_id -> its serving endpoint
    # peer_id -> the tree nodes its slices' proofs have proven so far: later fetches of that
    # update's slices ask for the siblings below them only (protocol/merkle.ProvenNodes)
    proven: dict[str, merkle.ProvenNodes] = field(default_factory=dict)
    public_keys: dict[str, bytes] = field(default_factory=dict)  # peer_id -> the key its signed header names

    def __post_init__(self) -> None:
        for peer_id, header in self.headers.items():
            if header.num_slices:
                self.proven.setdefault(peer_id, merkle.ProvenNodes(header.root_bytes(), header.num_slices))

    @property
    def peer_ids(self) -> list[str]:
        return list(self.headers)

    @classmethod
    def of(cls, r: int, manifest: RoundManifest, signed_manifest: swarm_pb2.Signed,
           headers: dict[str, UpdateHeader]) -> "SliceRound":
        """A signed manifest and its (verified) headers, in the manifest's order. Results are bound
        to the manifest's signed body, or to the one it continues (a takeover's: the same round)."""
        holders = {e.peer_id: [h for h in e.holders if h] for e in manifest.entries}
        endpoints = {e.peer_id: e.holders[0] for e in manifest.entries if e.serves and e.holders}
        bound = manifest.continues or hashlib.sha256(signed_manifest.body).hexdigest()
        keys = {e.peer_id: signed_from_json(e.header).public_key for e in manifest.entries}
        return cls(r, manifest, bound, headers, holders, manifest.owners, endpoints, public_keys=keys)

    def unpacker(self, run_id: str) -> BatchUnpacker:
        """Rebuilds this round's packed slice-result batches (protocol/slice_result_wire.py)."""
        return BatchUnpacker(run_id=run_id, round_=self.round, manifest_sha256=self.manifest_sha256, peer_ids=self.peer_ids,
                             owners=self.owners, public_keys=self.public_keys)

    def pack(self, batches: list[swarm_pb2.Signed]) -> list[swarm_pb2.Signed]:
        """Verified full batches of this round, packed to travel (in this order)."""
        return pack_batches(batches, peer_ids=self.peer_ids, owners=self.owners)


class Lie(NamedTuple):
    """A slice result that recomputation disproved; `signed`, its owner's signed batch, is the evidence."""

    signed: swarm_pb2.Signed
    why: str
    result: SliceResult


@dataclass(slots=True)
class GatherOutcome:
    combined: torch.Tensor  # (d,) the aggregate every honest node applies
    recomputed: list[int] = field(default_factory=list)  # slices recomputed here (disputes, spot checks, missing)
    spot_checked: list[int] = field(default_factory=list)
    liars: list[Lie] = field(default_factory=list)
    excluded: dict[int, dict[str, str]] = field(default_factory=dict)  # slice -> peer_id -> reason (agreed results)
    result_bytes: int = 0  # the aggregate's encoded size, all slices (what the round's result format made of it)

    def excluded_by_peer(self) -> dict[str, str]:
        """peer_id -> the reason it was left out of (at least) one slice."""
        merged: dict[str, str] = {}
        for per_slice in self.excluded.values():
            for peer_id, reason in per_slice.items():
                merged.setdefault(peer_id, reason)
        return merged
