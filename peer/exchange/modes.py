"""The exchange modes a run can choose (`exchange.mode`), each with its coordinator side.

One entry per mode; nothing else branches on the mode's name. The peer side of each mode
(peer/exchange/peer_side.py) joins it here as a `peer` field.
"""

from __future__ import annotations

from dataclasses import dataclass

from peer.exchange.all_to_all_coordinator import AllToAllCoordinator
from peer.exchange.coordinator_side import CoordinatorExchange, RoundContext
from peer.exchange.sliced_coordinator import SlicedCoordinator


@dataclass(frozen=True, slots=True)
class ExchangeMode:
    name: str
    coordinator: type[CoordinatorExchange]
    # peer: type[PeerExchange]  -- the peer's side, added with peer/exchange/peer_side.py


MODES: dict[str, ExchangeMode] = {
    mode.name: mode
    for mode in (
        ExchangeMode(name=SlicedCoordinator.name, coordinator=SlicedCoordinator),
        ExchangeMode(name=AllToAllCoordinator.name, coordinator=AllToAllCoordinator),
    )
}


def coordinator_exchange(ctx: RoundContext) -> CoordinatorExchange:
    """The coordinator's side of the run's exchange mode (cfg.exchange.mode, validated by the config)."""
    return MODES[ctx.cfg.exchange.mode].coordinator(ctx)
