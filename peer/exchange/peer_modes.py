"""The peer's side of each exchange mode, by `exchange.mode` (folded into peer/exchange/modes.py)."""

from __future__ import annotations

from peer.exchange.all_to_all_peer import AllToAllPeer
from peer.exchange.peer_side import PeerExchange
from peer.exchange.sliced_peer import SlicedPeer

PEER_SIDES: dict[str, type[PeerExchange]] = {"all-to-all": AllToAllPeer, "sliced": SlicedPeer}
