"""One simulated round of the sliced exchange through the real engine, in one process.

The simulator's virtual peers each get an identity and sign real update headers; one shared
payload store stands in for the network (every slice and result is found there, so nothing is
fetched); owners are drawn as the coordinator draws them, reduce their slices with
peer/run/slice_exchange.py and each sign one batch of results, as real owners do. Byzantine
owners (`lying-owner`) sign a false result for every slice they own: alone they are outvoted by
recomputation; all owners of a slice Byzantine, they agree on the lie and only a spot check
catches them. What an honest peer gathers is what the
round applies; the liars it caught are counted.

Identities derive from the seed, so the owner draw (seeded by the round's payload hashes) and
hence which slices the liars own are the same on every run of the same simulation.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from optim import slicing
from peer.run import slice_plan
from peer.run.round_math import RoundMath
from peer.run.slice_exchange import SliceExchange
from peer.run.slice_round import sliced_manifest
from protocol.envelope import ManifestEntry, build_update_header, sign_manifest, sign_update, signed_to_json
from protocol.identity import Identity
from protocol.payload_fetch import ChannelPool
from protocol.payload_store import PayloadStore
from protocol.slice_result import SliceResult, sign_slice_results

LYING_OWNER = "lying-owner"  # simulate's --attack name for Byzantine slice owners
LAYOUT = "simulated"
FAKE_ENDPOINT = "127.0.0.1:9"  # never dialled: every slice is in the shared store


@dataclass(slots=True)
class LieCount:
    told: int = 0  # false slice results signed
    caught: int = 0  # of those, named as lies by the honest gatherer
    slices_with_only_liars: int = 0  # slices whose every owner lies (only a spot check can catch them)
    rounds: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {**asdict(self), "uncaught": self.told - self.caught}


def sim_identity(seed: int, name: str) -> Identity:
    """A virtual peer's key, derived from the simulation seed (reproducible owner draws)."""
    return Identity(Ed25519PrivateKey.from_private_bytes(hashlib.sha256(f"swarmloco-sim/{seed}/{name}".encode()).digest()))


class LocalSlicedRound:
    def __init__(self, math: RoundMath, peers: int, *, seed: int = 0) -> None:
        self.math = math
        self.identities = [sim_identity(seed, f"peer{i}") for i in range(peers)]
        self.coordinator = sim_identity(seed, "coordinator")
        self.store = PayloadStore(keep_rounds=1)
        self.pool = ChannelPool()
        self.workers = ThreadPoolExecutor(max_workers=4, thread_name_prefix="swarmloco-sim")
        self.exchanges = [SliceExchange(math, self.pool, self.store, self.workers, identity=i) for i in self.identities]
        self.rng = random.Random(seed)
        self.lies = LieCount()

    def run(self, payloads: list[bytes | None], r: int, *, liars: set[int], spot_checks: int) -> torch.Tensor:
        """-> the (d,) aggregate an honest peer gathers for round r (liars sign false results)."""
        cfg = self.math.cfg
        entries = []
        for i, payload in enumerate(payloads):
            if payload is None:
                continue
            identity = self.identities[i]
            header = build_update_header(run_id=cfg.run_id, round_=r, peer_id=identity.peer_id, codec=cfg.compression.codec,
                                         numel=self.math.numel, layout_hash=LAYOUT, base_param_hash="0" * 64, payload=payload,
                                         slices=self.exchanges[i].slice_hashes(payload))
            signed = sign_update(identity, header)
            self.exchanges[i].serve_slices(header, payload)
            entries.append(ManifestEntry(peer_id=identity.peer_id, payload_sha256=header.payload_sha256, payload_size=len(payload),
                                         header=signed_to_json(signed), holders=[FAKE_ENDPOINT], serves=True))
        manifest = sliced_manifest(self.math, r, entries, base_param_hash="0" * 64)
        owners = manifest.owners
        signed_manifest = sign_manifest(self.coordinator, manifest)
        verify = lambda signed, round_: self.math.open_update(signed, round_=round_, layout_hash=LAYOUT)  # noqa: E731
        rounds = [x.open_round(manifest, signed_manifest, r, verify) for x in self.exchanges]

        liar_ids = {self.identities[i].peer_id for i in liars}
        batches, told = [], {}  # told: (signature of a liar's batch, slice) -> the liar's index
        for i, (exchange, rnd) in enumerate(zip(self.exchanges, rounds)):
            reduced = [exchange.reduce(rnd, j) for j in slice_plan.owned_by(owners, self.identities[i].peer_id)]
            if not reduced:
                continue
            results = [false_result(self.math, self.store, res.slice, data, res) if i in liars else res for data, res in reduced]
            batches.append(sign_slice_results(self.identities[i], results))
            if i in liars:
                told.update({(batches[-1].signature, result.slice): i for result in results})
        only_liars = sum(1 for o in owners if o and set(o) <= liar_ids)
        honest = next(i for i in range(len(self.identities)) if i not in liars and payloads[i] is not None)
        outcome = self.exchanges[honest].gather(rounds[honest], batches, spot_checks=spot_checks, rng=self.rng)
        caught = {(lie.signed.signature, lie.result.slice) for lie in outcome.liars} & set(told)  # each with its signed batch: the evidence
        self.lies.told += len(told)
        self.lies.caught += len(caught)
        self.lies.slices_with_only_liars += only_liars
        self.lies.rounds.append({"round": r, "told": len(told), "caught": len(caught),
                                 "slices_with_only_liars": only_liars, "recomputed": len(outcome.recomputed),
                                 "spot_checked": len(outcome.spot_checked), "named": sorted({told[s] for s in caught})})
        return outcome.combined

    def close(self) -> None:
        for exchange in self.exchanges:
            exchange.close()
        self.workers.shutdown(wait=False)
        self.pool.close()


def false_result(math: RoundMath, store: PayloadStore, j: int, data: bytes, result: SliceResult) -> SliceResult:
    """A lying owner's result: its honest bytes for slice j, shifted by 0.01 (an aggregate that
    still decodes), served from `store`, for the liar to sign. Colluders that shift alike agree on it."""
    values = math.decode_result(data, j) + 0.01
    fake = slicing.encode_result(values, math.result_format)
    sha = hashlib.sha256(fake).hexdigest()
    store.put_blob(sha, result.round, fake)
    return dataclasses.replace(result, result_sha256=sha, result_size=len(fake))
