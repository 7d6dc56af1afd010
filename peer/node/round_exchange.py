"""A peer's round from its commit on: commit (push in client mode), wait for the signed manifest, check that it lists our update,
hand it to the run's exchange mode (peer/exchange/), and restart there when the run's
coordinator changed mid-round (failover). One RoundOutcome comes out, never an exception: it
runs in the overlapped schedule's background thread too.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import grpc

from peer.exchange.outcome import Fatal, Finished, Resync, RoundOutcome, Unreachable
from peer.exchange.peer_side import ManifestInHand, PeerExchange
from peer.node.coordinator_change import CoordinatorChange
from peer.node.coordinator_client import CoordinatorUnavailable
from peer.node.errors import PeerExit
from peer.node.round import PeerRound, Update
from peer.run.faults import fail_point
from peer.run.timeouts import PeerTimeouts
from protocol.coordinator_port import CoordinatorPort
from protocol.envelope import RoundManifest, open_manifest
from protocol.long_poll import Polled, PollEnd, long_poll
from protocol.payload_service import push_chunks
from protocol.rpc_errors import Refused
from protocol.identity import peer_id_of
from protocol.run_state import CoordinatorKeys, ImpersonationError, TermFence
from protocol.wire import swarm_pb2

log = logging.getLogger("swarmloco.peer")
REJOIN = {swarm_pb2.UNKNOWN_PEER, swarm_pb2.WRONG_ENDPOINT}  # join again, then commit the same update
RESYNC = {swarm_pb2.STALE_ROUND, swarm_pb2.WRONG_BASE}  # download the swarm's state instead
FATAL = {swarm_pb2.EQUIVOCATION, swarm_pb2.BANNED}
PUSH_FAILED = "PUSH_FAILED"  # commit()'s answer when a client-mode push broke twice
RELOCATE_TRIES = 5  # a superseded coordinator's manifest: look for the active one this many times, a second apart


def check_listed(manifest: RoundManifest, update: Update, r: int, *, peer_id: str, left_out_so_far: int) -> bool:
    """Censorship made visible: our committed update must be in the signed manifest, or be
    excluded with a reason. True (and a warning) when it is left out without one."""
    short = peer_id[:8]
    if peer_id in manifest.excluded:
        log.warning("peer %s: round %d: the manifest excludes our update: %s", short, r, manifest.excluded[peer_id])
        return False
    if any(e.peer_id == peer_id for e in manifest.entries):
        return False
    print(f"peer {short} | WARNING: round {r}: the coordinator's signed manifest leaves out our committed update "
          f"{hashlib.sha256(update.signed.body).hexdigest()[:12]} without a reason ({left_out_so_far + 1} round(s) so far)", flush=True)
    return True


@dataclass(frozen=True, slots=True)
class ManifestAhead:
    """Round r's manifest long-poll, running since just before its commit went out."""

    r: int
    future: Future
    cancel: threading.Event  # ends it after its current call (the commit was refused)
    committed: threading.Event  # the commit beside it is in
    moved: CoordinatorChange


class RoundExchange:
    """Everything a round needs after its commit, and nothing else of the node."""

    def __init__(self, *, client: CoordinatorPort, keys: CoordinatorKeys, run_id: str, peer_id: str, side: PeerExchange,
                 timeouts: PeerTimeouts, stop: threading.Event, endpoint: str, client_mode: bool,
                 rejoin: Callable[[], None], waiting: Callable[[], None] = lambda: None, fence: TermFence | None = None,
                 relocate: Callable[[], bool] = lambda: False) -> None:
        self.client = client
        self.keys = keys
        self.run_id = run_id
        self.peer_id = peer_id
        self.side = side
        self.timeouts = timeouts
        self.stop = stop
        self.endpoint = endpoint  # where our payload is served ("" in client mode: pushed)
        self.client_mode = client_mode
        self.rejoin = rejoin  # Join again (raises NotAdmitted when refused)
        self.waiting = waiting  # the round now waits on the coordinator (the node's phase)
        self.left_out: list[int] = []  # rounds whose signed manifest left our valid commitment out without a reason
        self.fence = fence  # the highest coordinator term seen (peer/node/trust.py): a lower one's manifest is refused
        self.relocate = relocate  # move to the run's active coordinator (a superseded one signed the manifest)
        self.ahead: ManifestAhead | None = None  # the manifest's long-poll, sent out with the last commit
        self.polls = ThreadPoolExecutor(max_workers=2, thread_name_prefix="swarmloco-manifest-poll")

    def commit(self, update: Update, r: int, *, poll_ahead: bool = False) -> str | None:
        """Push (client mode) and commit round r's update: None when the coordinator holds it (or
        refused it for a reason the manifest wait will tell, e.g. the run just finished), else the
        refusal's name when only the swarm's state can help (stale round, wrong base; PUSH_FAILED:
        a client-mode push broke twice, so the coordinator cannot list our update). Raises
        PeerExit when the peer must stop (equivocation, banned).

        A coordinator that does not know us (it restarted from a checkpoint without us, or we
        changed endpoint) gets one fresh Join, then the same signed update again.

        poll_ahead: the manifest's long-poll goes out before the commit, and run() takes its
        answer: the last peer to commit gets the manifest one round trip after its commit, not
        two (docs/sliced-exchange.md "Round trips"; the poll is a read, asking early changes nothing)."""
        ahead = self._manifest_ahead(update, r) if poll_ahead else None
        try:
            refused = self._commit(update, r)
        except BaseException:
            if ahead is not None:
                ahead.cancel.set()
            raise
        if ahead is not None:
            if refused is None:
                ahead.committed.set()
                self.ahead = ahead
            else:
                ahead.cancel.set()
        return refused

    def _manifest_ahead(self, update: Update, r: int) -> "ManifestAhead":
        if self.ahead is not None:
            self.ahead.cancel.set()
        cancel, committed = threading.Event(), threading.Event()
        moved = CoordinatorChange(self.client, r=r, keys=self.keys, run_id=self.run_id, fence=self.fence)
        # Between two of its polls it commits again only once the commit in flight beside it is in.
        future = self.polls.submit(self._wait_manifest, update, r, moved, lambda: not cancel.is_set(), committed.is_set)
        return ManifestAhead(r, future, cancel, committed, moved)

    def close(self) -> None:
        if self.ahead is not None:
            self.ahead.cancel.set()
        self.polls.shutdown(wait=False, cancel_futures=True)

    def _commit(self, update: Update, r: int) -> str | None:
        for attempt in range(2):
            try:
                if self.client_mode and self.side.pushes_to_coordinator and not self._push(update, r):
                    return PUSH_FAILED
                self.client.submit(update.signed, self.endpoint)
            except Refused as exc:
                refused = exc
                if attempt == 0 and exc.refusal in REJOIN:
                    self.rejoin()
                    continue
                break
            fail_point("committed", r)
            return None
        log.warning("peer %s: round %d update refused: %s", self.peer_id[:8], r, refused.reason)
        if refused.refusal in RESYNC:
            return refused.name
        if refused.refusal in FATAL:
            raise PeerExit(refused.reason)
        return None

    def _push(self, update: Update, r: int) -> bool:
        """Client mode, all-to-all: hand our payload to the coordinator (sliced: SlicedPeer pushes
        each slice to its owners once the manifest is in). A transfer cut short is tried once
        more; False when it broke twice (the round goes on without us; we resynchronise)."""
        for attempt in range(2):
            try:
                self.client.push(push_chunks(update.signed, update.payload))
                return True
            except grpc.RpcError as exc:  # not a refusal (Refused is raised as such): the stream broke
                log.warning("peer %s: round %d: pushing our update broke (%s)%s", self.peer_id[:8], r,
                            exc.details() if hasattr(exc, "details") else exc, "; trying again" if attempt == 0 else "")
        return False

    def _recommit(self, update: Update, r: int) -> bool:
        return self.commit(update, r, poll_ahead=False) is None

    def run(self, rnd: PeerRound) -> RoundOutcome:
        """Round r's outcome once committed. A coordinator that changed mid-round (failover) gets
        our update again and the round restarts there, unless it continues the manifest we hold
        (peer/node/coordinator_change.py)."""
        while True:
            ahead, self.ahead = self.ahead, None  # the manifest's long-poll sent out with the commit
            if ahead is not None and ahead.r != rnd.r:
                ahead.cancel.set()
                ahead = None
            moved = ahead.moved if ahead is not None else CoordinatorChange(self.client, r=rnd.r, keys=self.keys,
                                                                            run_id=self.run_id, fence=self.fence)
            try:
                outcome = self._once(rnd, moved=moved, ahead=ahead)
            except CoordinatorUnavailable as exc:
                return Unreachable(str(exc))
            except PeerExit as exc:
                return Fatal(str(exc))
            except Exception as exc:  # never out of the exchange thread; the round resynchronises instead
                log.warning("peer %s: round %d exchange failed (%s: %s)", self.peer_id[:8], rnd.r, type(exc).__name__, exc)
                return Resync(f"the exchange failed ({type(exc).__name__})")
            if not (moved.reported or moved()):
                return outcome
            print(f"peer {self.peer_id[:8]} | round {rnd.r}: the run's coordinator is now {self.client.endpoint}; committing again", flush=True)
            if not self._recommit(rnd.update, rnd.r):
                return Resync("the new coordinator did not take our update")

    def _wait_manifest(self, update: Update, r: int, moved: CoordinatorChange, going: Callable[[], bool] = lambda: True,
                       committed: Callable[[], bool] = lambda: True) -> Polled[swarm_pb2.ManifestReply]:
        """Long-poll round r's manifest. Between polls: make sure the coordinator holds our
        commitment once committed() (a restarted one forgot it; committing the same header again
        is idempotent); GAVE_UP once going() is False."""
        return long_poll(lambda wait_s: self.client.manifest(r, wait_s=wait_s),
                         lambda reply: reply.ready or reply.current_round > r or reply.finished,
                         deadline=self.timeouts.manifest, poll=self.timeouts.poll, stop=self.stop, moved=moved,
                         between=lambda: going() and (not committed() or self._recommit(update, r)))

    def _once(self, rnd: PeerRound, moved: CoordinatorChange, ahead: "ManifestAhead | None" = None) -> RoundOutcome:
        r = rnd.r
        self.waiting()
        if ahead is None:
            waited = self._wait_manifest(rnd.update, r, moved)
        else:
            try:
                waited = ahead.future.result()
            finally:
                ahead.cancel.set()
        reply, wait_s = waited.reply, waited.waited_s
        if waited.end is PollEnd.MOVED:
            return Resync("coordinator changed")  # run() commits again there
        if waited.end is PollEnd.GAVE_UP:
            return Resync("our update was refused")
        if reply is None or not reply.ready:
            if reply is not None and reply.finished and reply.current_round <= r:
                return Finished(wait_s=wait_s)
            return Resync(f"missed the manifest of round {r}", wait_s=wait_s)
        try:
            manifest = open_manifest(reply.manifest, keys=self.keys, run_id=self.run_id, round_=r)
        except ImpersonationError as exc:
            raise PeerExit(f"the coordinator at {self.client.endpoint} signs manifests with a key that is not the run's: {exc}") from None
        if self.fence is not None and not self.fence.observe(manifest.term, peer_id_of(bytes(reply.manifest.public_key)), reply.manifest):
            # A coordinator that was superseded (a standby took over with a higher term) closed
            # this round: not the run's word. Move to the active one; run() commits there again.
            log.warning("peer %s: round %d: the manifest is signed in term %d, superseded by term %d: refusing it",
                        self.peer_id[:8], r, manifest.term, self.fence.term)
            for attempt in range(RELOCATE_TRIES):
                if self.relocate() or attempt == RELOCATE_TRIES - 1 or self.stop.wait(1.0):
                    break
            return Resync(f"the manifest of round {r} comes from a superseded coordinator (term {manifest.term})", wait_s=wait_s)
        if check_listed(manifest, rnd.update, r, peer_id=self.peer_id, left_out_so_far=len(self.left_out)):
            self.left_out.append(r)  # status shows it (the heartbeat carries it)
        fail_point("manifest", r)
        moved.hold(manifest, reply.manifest)
        return self.side.run(ManifestInHand(r=r, manifest=manifest, signed=reply.manifest, base=rnd.base, wait_s=wait_s, moved=moved,
                                            landed=rnd.landed if rnd.landing is not None else None))
