"""After an applied round a peer serves the swarm state θ_{r+1} to joiners (its parts, from its own
store: peer/run/state_sync.py) and wakes the heartbeat that tells the coordinator it holds them.

Overlapped rounds do both on the state writer, beside the next inner phase: slicing, copying and
hashing the whole state (two model-sized vectors) took 2% of the training thread's samples at 4
peers, and it grows with the model. What is served is taken when the round is applied (θ_{r+1} is
never changed in place; the global state is a copy), so the next round cannot change it meanwhile.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from peer.run import state_sync

log = logging.getLogger("swarmloco.peer")


def state_publication(node: Any) -> Callable[[], None]:
    """Serving the node's state as it is now (θ_r, its round and hash, a copy of the global state),
    to call now or on another thread; nothing for a client-mode peer (no one can fetch from it)."""
    if node.options.client_mode:
        return lambda: None
    round_, param_hash, params, global_state = node.round, node.current_hash, node.params, node.math.global_state_dict()

    def publish() -> None:
        state_sync.publish(node.store, node.identity, run_id=node.cfg.run_id, config_hash=node.cfg.config_hash(),
                           round_=round_, param_hash=param_hash, params=params, global_state=global_state,
                           layout=node.math.layout, sign=False)

    return publish


def announce_state(publish: Callable[[], None] | None, *, heartbeat: Any, round_: int,
                   writer: ThreadPoolExecutor | None) -> None:
    """Serve θ_{round_} (`publish`: None when the node is not in sync), then wake the heartbeat; on
    `writer` when given (overlapped rounds: the state writer), else now. A failure to serve is logged
    (joiners then fetch the state from other holders or the coordinator's checkpoint) and the
    heartbeat still wakes."""

    def announce() -> None:
        try:
            if publish is not None:
                publish()
        except Exception as exc:  # noqa: BLE001 - serving joiners is best effort; the round is applied
            log.warning("could not serve the state of round %d to joiners: %s", round_, exc)
        if heartbeat is not None:
            heartbeat.now.set()

    if writer is not None:
        writer.submit(announce)
    else:
        announce()
