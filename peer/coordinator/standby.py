"""A standby coordinator: follows the active one, takes over when its lease lapses.

The active coordinator's DHT run record is its lease: written with a TTL of `control.lease_s` and
renewed every third of it (peer/coordinator/main.py). A standby, whose key the run lists in
`[control] coordinators`, keeps the latest closed round's checkpoint (downloaded every round and
accepted only against the state the active coordinator signs), and announces itself so peers
and the active one know where it will answer. When no live active record is left, it takes over
with term = the highest term seen + 1, from that checkpoint: the swarm continues from the last
closed round, and peers move to it without a restart (peer/node/trust.py: highest term wins).

A coordinator started without --standby follows too when the run already has a live active
coordinator (it came back after a takeover): two actives in one run are never started on purpose.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from peer.learn.model import param_hash
from peer.node.coordinator_client import CoordinatorClient, CoordinatorUnavailable
from peer.node.errors import PeerExit
from peer.node.trust import trust_run
from peer.run import checkpoint
from peer.run.config import ConfigError, RunConfig
from protocol import discovery
from protocol.accounting import ByteCounter
from protocol.identity import Identity

log = logging.getLogger("swarmloco.coordinator")
POLL_S = 0.5
STANDBY_RECORD_TTL_S = 30.0


class StandbyError(RuntimeError):
    """A standby that cannot follow this run; the message says what to change."""


@dataclass(slots=True)
class Takeover:
    cfg: RunConfig  # the run's config, as the active coordinator signed it
    term: int  # the term this coordinator takes over with
    round: int  # the last closed round's state it holds


def live_active(dht, run_id: str, pinned: str | None) -> tuple[discovery.RunRecord | None, int, discovery.RunRecord | None]:
    """The run's live active record (the one rule: highest term, then lowest key), the highest term
    seen, and the record of a coordinator that finished the run (role "finished"), if any."""
    records = discovery.vouched(discovery.run_records(dht, run_id), pinned)
    top_term = max((r.term for r in records), default=0)
    active = sorted((r for r in records if r.role == "active"), key=lambda r: (-r.term, r.coordinator_id))
    finished = [r for r in records if r.role == "finished"]
    return (active[0] if active else None), top_term, (finished[0] if finished else None)


def follow(
    *, dht, identity: Identity, run_id: str, checkpoint_path: Path, endpoint: str, pinned: str | None,
    stop: threading.Event, wait_for_run_s: float = 60.0,
) -> Takeover | None:
    """Follow the run's active coordinator until its lease lapses; None when stopped or the run ended."""
    counter = ByteCounter(identity.peer_id)
    client: CoordinatorClient | None = None
    held: Takeover | None = None
    top_term = 0
    announced = 0.0
    started = time.monotonic()
    printed = False
    try:
        while not stop.is_set():
            active, seen, finished = live_active(dht, run_id, pinned)
            top_term = max(top_term, seen)
            if finished is not None:
                print(f"standby {identity.peer_id[:8]} | run {run_id} finished (coordinator {finished.coordinator_id[:8]}, "
                      f"term {finished.term}): nothing to take over", flush=True)
                return None
            if active is None or active.coordinator_id == identity.peer_id:
                if held is not None:
                    return Takeover(cfg=held.cfg, term=top_term + 1, round=held.round)
                if time.monotonic() - started > wait_for_run_s:
                    raise StandbyError(f"no active coordinator of run {run_id!r} in the DHT after {wait_for_run_s:.0f}s, and no "
                                       "state to take over from: check --initial-peers and --run-id")
                stop.wait(POLL_S)
                continue
            if client is None or client.endpoint != active.endpoint:
                if client is not None:
                    client.close()
                client = CoordinatorClient(active.endpoint, counter, retry_for=timedelta(seconds=2))
            try:
                info = client.run_info()
                trusted = trust_run(info, pinned=active.coordinator_id, pinned_by="the DHT-signed run record",
                                    endpoint=active.endpoint, run_id=run_id)
            except (CoordinatorUnavailable, PeerExit) as exc:
                log.info("standby: the active coordinator does not answer (%s); waiting for its lease to lapse", exc)
                stop.wait(POLL_S)
                continue
            if not trusted.keys.matches(identity.peer_id):
                raise StandbyError(
                    f"this coordinator's key {identity.peer_id} is not one of run {run_id!r}'s coordinators: the active "
                    f"coordinator must list it (swarmloco coordinator --coordinators {identity.peer_id} ..., or [control] coordinators)")
            state = trusted.state
            if state.finished:
                print(f"standby {identity.peer_id[:8]} | run {run_id} finished at round {state.round} "
                      f"(final hash {state.param_hash[:16]}): nothing to take over", flush=True)
                return None
            if held is None or state.round > held.round:
                try:
                    held = _fetch_state(client, trusted.cfg, state.round, state.param_hash, checkpoint_path) or held
                except (CoordinatorUnavailable, checkpoint.CheckpointError, ConfigError) as exc:
                    log.info("standby: checkpoint of round %d not fetched (%s)", state.round, exc)
            if held is not None and time.monotonic() - announced > STANDBY_RECORD_TTL_S / 3:
                discovery.announce_run(dht, identity, run_id=run_id, endpoint=endpoint, role="standby", term=state.term,
                                       coordinators=trusted.cfg.control.coordinators, ttl_s=STANDBY_RECORD_TTL_S)
                announced = time.monotonic()
                if not printed:
                    print(f"standby {identity.peer_id[:8]} | following run {run_id}'s active coordinator "
                          f"{active.coordinator_id[:8]} (term {state.term}) at {active.endpoint}; holding round {held.round}", flush=True)
                    printed = True
            stop.wait(POLL_S)
        return None
    finally:
        if client is not None:
            client.close()


def _fetch_state(client: CoordinatorClient, cfg: RunConfig, round_: int, signed_hash: str, path: Path) -> Takeover | None:
    """The active coordinator's checkpoint, kept only when it is the state it signed for that round."""
    data, _ = client.checkpoint()
    ckpt = checkpoint.from_bytes(data)
    if ckpt.config_hash != cfg.config_hash() or ckpt.round != round_ or ckpt.param_hash != signed_hash \
            or param_hash(ckpt.params) != signed_hash:
        log.info("standby: checkpoint (round %d) does not match the signed state of round %d yet", ckpt.round, round_)
        return None
    checkpoint.write_atomic(path, data)
    log.info("standby: holding round %d (%s)", round_, signed_hash[:16])
    return Takeover(cfg=cfg, term=0, round=round_)
