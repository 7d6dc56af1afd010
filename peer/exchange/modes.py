"""The exchange modes a run can choose (`exchange.mode`): each one's peer side and coordinator side.

One entry per mode; nothing else branches on the mode's name. What a mode fixes in the round
math (wire codec, header slices, in-process aggregation) is peer/run/mode_math.py, beneath.
"""

from __future__ import annotations

from dataclasses import dataclass

from peer.exchange.all_to_all_coordinator import AllToAllCoordinator
from peer.exchange.all_to_all_peer import AllToAllPeer
from peer.exchange.coordinator_side import CoordinatorExchange, RoundContext
from peer.exchange.peer_side import PeerExchange, PeerExchangeContext
from peer.exchange.sliced_coordinator import SlicedCoordinator
from peer.exchange.sliced_peer import SlicedPeer


@dataclass(frozen=True, slots=True)
class ExchangeMode:
    name: str
    peer: type[PeerExchange]
    coordinator: type[CoordinatorExchange]


MODES: dict[str, ExchangeMode] = {
    mode.name: mode
    for mode in (
        ExchangeMode(name=SlicedCoordinator.name, peer=SlicedPeer, coordinator=SlicedCoordinator),
        ExchangeMode(name=AllToAllCoordinator.name, peer=AllToAllPeer, coordinator=AllToAllCoordinator),
    )
}


def coordinator_exchange(ctx: RoundContext) -> CoordinatorExchange:
    """The coordinator's side of the run's exchange mode (cfg.exchange.mode, validated by the config)."""
    return MODES[ctx.cfg.exchange.mode].coordinator(ctx)


def peer_exchange(mode: str, ctx: PeerExchangeContext) -> PeerExchange:
    """The peer's side of exchange mode `mode` (cfg.exchange.mode, validated by the config)."""
    return MODES[mode].peer(ctx)
