"""The swarm state as content-addressed parts: identical bytes on every node, rebuilt exactly,
downloaded from many holders (a dead one costs nothing), refused when the signature or a part lies."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from optim.slicing import SliceLayout
from peer.run import state_sync
from protocol.keys import CoordinatorKeys
from protocol.accounting import ByteCounter
from protocol.envelope import EnvelopeError
from protocol.identity import Identity
from protocol.payload_fetch import ChannelPool, FetchError
from protocol.payload_service import PayloadServicer, serve_payloads
from protocol.payload_store import PayloadStore
from protocol.state_manifest import open_state_manifest

D = 10_000


def state(seed: int = 0) -> tuple[torch.Tensor, dict]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(D, generator=gen), {"outer": {"name": "nesterov", "momentum_buffer": torch.randn(D, generator=gen)},
                                           "aggregator_previous": None}


def test_parts_are_the_same_bytes_everywhere_and_rebuild_exactly():
    layout = SliceLayout.build(D, 8, 64)
    params, global_state = state()
    a = state_sync.state_parts(3, "h" * 64, params, global_state, layout)
    b = state_sync.state_parts(3, "h" * 64, params.clone(), {k: v for k, v in reversed(list(global_state.items()))}, layout)
    assert a == b and len(a) == 1 + layout.num_slices
    round_, declared, rebuilt, rebuilt_state = state_sync.rebuild(a)
    assert (round_, declared) == (3, "h" * 64) and torch.equal(rebuilt, params)
    assert torch.equal(rebuilt_state["outer"]["momentum_buffer"], global_state["outer"]["momentum_buffer"])
    assert rebuilt_state["outer"]["name"] == "nesterov" and rebuilt_state["aggregator_previous"] is None
    with pytest.raises(ValueError):
        state_sync.rebuild([a[0], *a[1:-1]])  # a part missing
    with pytest.raises(ValueError):
        state_sync.state_parts(3, "h", params, {"odd": torch.zeros(3)}, layout)


class Holder:
    def __init__(self) -> None:
        self.counter = ByteCounter("holder")
        self.store = PayloadStore()
        self.server, port = serve_payloads(PayloadServicer(self.store, verify_header=lambda s: None, accept_pushes=False), self.counter,
                                           host="127.0.0.1", port=0)
        self.endpoint = f"127.0.0.1:{port}"


def test_a_joiner_downloads_from_many_holders_and_survives_a_dead_one():
    layout = SliceLayout.build(D, 16, 64)
    params, global_state = state(1)
    coordinator, holders = Identity.generate(), [Holder() for _ in range(4)]
    try:
        signed = None
        for i, holder in enumerate(holders):
            out = state_sync.publish(holder.store, coordinator, run_id="r", config_hash="c", round_=5, param_hash="p" * 64,
                                     params=params, global_state=global_state, layout=layout, sign=i == 0)
            signed = signed or out
        manifest = open_state_manifest(signed, keys=CoordinatorKeys.of_key(coordinator.public_key), run_id="r", max_bytes=1 << 20)
        dead = "127.0.0.1:9"  # nothing listens there
        with ThreadPoolExecutor(8) as workers, _pool() as pool:
            parts = state_sync.download(pool, workers, manifest, [dead] + [h.endpoint for h in holders[1:]], holders[0].endpoint)
        _, _, rebuilt, _ = state_sync.rebuild(parts)
        assert torch.equal(rebuilt, params)
        served = [h.counter.total().sent for h in holders[1:]]
        assert sum(1 for s in served if s > 0) >= 2, served  # spread over several peers, not one donor
        with pytest.raises(EnvelopeError):
            open_state_manifest(signed, keys=CoordinatorKeys.of_key(Identity.generate().public_key), run_id="r", max_bytes=1 << 20)
        # A holder serving other bytes under a part's name is refused by the hash check.
        bad = holders[1]
        bad.store.put_blob(manifest.part_sha256[1], 5, b"\x00" * manifest.part_sizes[1])
        with ThreadPoolExecutor(2) as workers, _pool() as pool:
            with pytest.raises(FetchError):
                state_sync.download(pool, workers, manifest, [bad.endpoint], bad.endpoint)
    finally:
        for holder in holders:
            holder.server.stop(0)


class _pool:
    def __enter__(self) -> ChannelPool:
        self.pool = ChannelPool()
        return self.pool

    def __exit__(self, *exc) -> None:
        self.pool.close()
