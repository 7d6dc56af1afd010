"""One swarmloco exchange-and-aggregate round, on the real transport, without the coordinator.

Used by scripts/bench_vs_hivemind.py (one ExchangePeer per worker process) and its smoke test
(two in one process). What peer/node/node.py does per round minus training and the coordinator:

    commit():    RoundMath.encode (outer transmit, codec, error feedback) -> sha256 -> signed
                 UpdateHeader -> PayloadStore, served by the gRPC Peer service
    aggregate(): for every (peer_id, signed header, endpoint) in peer_id order: verify the header
                 (open_update: signature, run, round, codec, layout, size bound), fetch the payload
                 over gRPC unless it is our own (fetch_payload: chunked, size + sha256 checked),
                 decode (finite check), then RoundMath.apply (fedavg lr 1: params -= mean).

Whoever runs it relays the headers between commit() and aggregate() (the coordinator's manifest).
Import only after any hivemind DHT of the process has started: gRPC is not fork-safe.
"""

from __future__ import annotations

import hashlib
import time

import torch

from peer.run.config import RunConfig
from peer.run.round_math import RoundMath
from protocol.wire import swarm_pb2, swarm_pb2_grpc
from protocol.accounting import ByteCounter
from protocol.channels import create_server
from protocol.envelope import UpdateHeader, open_update, sign_update
from protocol.identity import Identity
from protocol.payload_fetch import ChannelPool, fetch_payload
from protocol.payload_service import PayloadServicer, PayloadStore, StoredPayload

RUN_ID = "bench"
LAYOUT = "bench"

ManifestEntry = tuple[str, bytes, str]  # (peer_id, serialized signed header, HOST:PORT)


class ExchangePeer:
    """A peer's transport (gRPC server, byte counter, channel pool) and its per-codec round math."""

    def __init__(self, update: torch.Tensor) -> None:
        self.update = update  # (d,) what this peer contributes every round
        self.numel = update.numel()
        self.identity = Identity.generate()
        self.counter = ByteCounter(self.identity.peer_id)
        self.store = PayloadStore(keep_rounds=1)
        self.server, port = create_server(self.counter, host="127.0.0.1", port=0)
        servicer = PayloadServicer(self.store, verify_header=lambda signed: None, accept_pushes=False)
        swarm_pb2_grpc.add_PeerServicer_to_server(servicer, self.server)
        self.server.start()
        self.pool = ChannelPool(self.counter)
        self.endpoint = f"127.0.0.1:{port}"
        self.maths: dict[str, RoundMath] = {}
        self.payload = b""

    @property
    def peer_id(self) -> str:
        return self.identity.peer_id

    def math(self, codec: str) -> RoundMath:
        if codec not in self.maths:
            cfg = RunConfig.from_dict({"run_id": RUN_ID, "outer": {"name": "fedavg"}, "compression": {"codec": codec}})
            self.maths[codec] = RoundMath(cfg, self.numel)
        return self.maths[codec]

    def commit(self, codec: str, round_: int) -> ManifestEntry:
        payload = self.math(codec).encode(self.update, round_)
        header = UpdateHeader(run_id=RUN_ID, round=round_, peer_id=self.peer_id, codec=codec, numel=self.numel,
                              layout_hash=LAYOUT, base_param_hash=LAYOUT, payload_sha256=hashlib.sha256(payload).hexdigest(),
                              payload_size=len(payload))
        signed = sign_update(self.identity, header)
        self.store.put(StoredPayload(header, signed, payload))
        self.payload = payload
        return self.peer_id, signed.SerializeToString(), self.endpoint

    def aggregate(self, manifest: list[ManifestEntry], codec: str, round_: int) -> tuple[torch.Tensor, dict[str, float]]:
        """Verify, fetch, decode and average every entry; returns (-mean (d,), seconds per stage)."""
        math = self.math(codec)
        max_bytes = math.codec.max_encoded_size(self.numel)
        updates, fetch_s, decode_s = [], 0.0, 0.0
        for peer_id, signed_bytes, holder in manifest:
            t = time.perf_counter()
            header = open_update(swarm_pb2.Signed.FromString(signed_bytes), run_id=RUN_ID, round_=round_, codec=codec,
                                 numel=self.numel, layout_hash=LAYOUT, max_payload_bytes=max_bytes)
            data = self.payload if peer_id == self.peer_id else fetch_payload(self.pool, [holder], header)
            t_fetched = time.perf_counter()
            updates.append(math.decode(data, round_))
            fetch_s += t_fetched - t
            decode_s += time.perf_counter() - t_fetched
        t_agg = time.perf_counter()
        params = torch.zeros(self.numel)
        math.apply(params, updates)  # fedavg, lr 1: params = 0 - mean(updates)
        return params, {"fetch_s": fetch_s, "decode_s": decode_s, "aggregate_s": time.perf_counter() - t_agg}

    def close(self) -> None:
        self.pool.close()
        self.server.stop(grace=0.5)
