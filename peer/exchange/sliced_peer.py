"""Sliced, the peer's side of one round once the signed manifest is in hand.

  0. client mode: push each slice of our update to that slice's owners (the coordinator relays nothing)
  1. reduce-scatter: reduce the slices this peer owns, sign their results as one batch, submit it
  2. wait until the coordinator says the round's results are final
  3. all-gather: each aggregated slice from one of its owners (recomputed where owners disagree,
     where nobody answered, and for a few random spot checks); false results are reported, and
     the coordinator is told that we gathered (it applies once every live peer has)
  4. outer step on the gathered aggregate -> θ_{r+1}
  5. wait until the coordinator has applied the round too, for its signed state of θ_{r+1}

The two waits on the coordinator are long-polls sent out BEFORE the call they wait on (our results
in 1, our gathered report in 3), not after its answer: the poll is a read, so asking early changes
nothing, and the round trip of the call and that of the poll overlap (docs/sliced-exchange.md
"Round trips"). The calls themselves stay where they were, in order, signed as before.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

from peer.exchange.outcome import Applied, Finished, Landing, Resync, RoundOutcome
from peer.exchange.peer_side import ManifestInHand, PeerExchange, PeerExchangeContext
from peer.run import slice_plan
from peer.run.faults import fail_point
from peer.run.slice_exchange import SliceExchange
from protocol.envelope import GATHERED_TAG, EnvelopeError, UpdateHeader
from protocol.long_poll import PollEnd, long_poll
from protocol.signing import sign_body
from protocol.slice_result import sign_mismatch_report
from protocol.wire import swarm_pb2

log = logging.getLogger("swarmloco.peer")


class SlicedPeer(PeerExchange):
    pushes_to_coordinator = False  # client mode: each slice goes to its owners once the manifest names them

    def __init__(self, ctx: PeerExchangeContext, engine: SliceExchange | None = None) -> None:
        super().__init__(ctx)
        # The reduce/gather engine (a seam: the tests' Byzantine owners pass a lying one).
        self.engine = engine or SliceExchange(ctx.math, ctx.pool, ctx.store, ctx.workers, own_endpoint=ctx.own_endpoint,
                                              identity=ctx.identity)
        # The long-polls sent ahead of the calls they wait on (run()); 2: a round's, and one that
        # a round which stopped early left parked for at most one more call.
        self.polls = ThreadPoolExecutor(max_workers=2, thread_name_prefix="swarmloco-poll")

    def slice_hashes(self, payload: bytes) -> tuple[str, ...]:
        return tuple(self.engine.slice_hashes(payload))

    def serve(self, header: UpdateHeader, payload: bytes) -> None:
        self.engine.serve_slices(header, payload)  # owners fetch our slices one by one

    def close(self) -> None:
        self.engine.close()
        self.polls.shutdown(wait=False, cancel_futures=True)

    def run(self, round_: ManifestInHand) -> RoundOutcome:
        ctx, r, wait_s = self.ctx, round_.r, round_.wait_s
        t_fetch = time.monotonic()
        now = time.time()  # wall clock: the timeline lines up with other processes' (scripts/wan_emulation.py)
        marks = {"committed": now - wait_s, "manifest": now}
        try:
            rnd = self.engine.open_round(round_.manifest, round_.signed, r, ctx.verify_header)
        except EnvelopeError as exc:
            log.warning("round %d: the manifest does not hold (%s): resynchronising", r, exc)
            return Resync("could not verify the manifest", wait_s=wait_s)
        if not ctx.own_endpoint:  # client mode: nobody can fetch from us, so our slices go to their owners
            own = ctx.store.get(rnd.headers[ctx.identity.peer_id].payload_sha256) if ctx.identity.peer_id in rnd.headers else None
            if own is not None:
                self.engine.push_own_slices(rnd, ctx.identity.peer_id, own.signed_header)

        batches = rnd.pack(self.engine.reduce_owned(rnd, marks))  # reduce-scatter: our slices, one signed batch
        if batches:
            marks["reduced"] = time.time()
        final_ahead, stop_final = self._ahead(round_, until_applied=False)  # before our batch: see the docstring
        try:
            for signed in batches:
                reply = ctx.client.submit_slice_results(signed)
                if not reply.accepted:
                    log.warning("round %d: our slice results were refused: %s", r, reply.reason)
            marks["submitted"] = time.time()
            fail_point("reduced", r)
            reduce_s = time.monotonic() - t_fetch
            final = final_ahead.result()
        finally:
            stop_final.set()
        if final.end is PollEnd.MOVED:
            return Resync("coordinator changed")
        reply = final.reply
        if final.end is not PollEnd.NEWS or not reply.ready:
            if reply is not None and reply.finished and reply.current_round <= r:
                return Finished(wait_s=wait_s)
            return Resync(f"the results of round {r} never became final", wait_s=wait_s)
        if reply.current_round > r + 1:
            # Round r was applied without us long ago (we were cut off: issue 22's partition). The owners
            # keep its slices two rounds only: a gather now could recompute them from what we still reach
            # alone, a θ_{r+1} nobody holds (chaos: reported by our heartbeat before the hash check resynced).
            return Resync(f"round {r} was applied without us (the coordinator is at round {reply.current_round})", wait_s=wait_s)

        t_gather = time.monotonic()
        marks["final"] = time.time()
        outcome = self.engine.gather(rnd, list(reply.results), spot_checks=ctx.math.cfg.exchange.spot_checks,
                                     coverage=ctx.math.cfg.exchange.spot_check_coverage, marks=marks)
        marks["gathered"] = time.time()
        fail_point("gathered", r)
        t_agg = time.monotonic()
        new_params = round_.base.clone()
        ctx.math.step_with_aggregate(new_params, outcome.combined, round_=r)
        aggregate_s = time.monotonic() - t_agg
        if round_.landed is not None:  # overlapped: the next phase moves onto it now, not after the applied poll
            round_.landed(Landing(params=new_params, manifest_at=marks["manifest"], window_s=round_.manifest.window_ms / 1000))
        applied_ahead, stop_applied = self._ahead(round_, until_applied=True)  # before our report: see the docstring
        try:
            by_slice: dict[int, list[swarm_pb2.Signed]] = {}  # slice -> the batches whose result for it did not recompute
            for lie in outcome.liars:
                log.warning("round %d: a slice result did not recompute: %s", r, lie.why)
                by_slice.setdefault(lie.result.slice, []).append(lie.signed)
            for slice_, disputed in by_slice.items():
                ctx.client.report_evidence(sign_mismatch_report(ctx.identity, run_id=ctx.math.cfg.run_id, round_=r, slice_=slice_,
                                                                results=disputed))
            # Only now that its reports are in: the coordinator applies the round once every live peer has
            # said it gathered, so that a lie caught here never reaches θ_{r+1}.
            gathered = ctx.client.report_gathered(sign_body(ctx.identity, GATHERED_TAG, {
                "run_id": ctx.math.cfg.run_id, "round": r, "peer_id": ctx.identity.peer_id, "timestamp": time.time()}))
            if not gathered.accepted:
                log.warning("round %d: our gathered report was refused: %s", r, gathered.reason)
            fetch_s = reduce_s + time.monotonic() - t_gather - aggregate_s
            marks["reported"] = time.time()

            # Wait until the coordinator applied the round too: the node then compares θ_{r+1} with the
            # state it signs for round r + 1 (the reply carries that signed state).
            applied = applied_ahead.result()
        finally:
            stop_applied.set()
        if applied.end is PollEnd.MOVED:
            return Resync("coordinator changed")
        marks["applied"] = time.time()
        return Applied(
            params=new_params, updates=len(rnd.headers), excluded={**round_.manifest.excluded, **outcome.excluded_by_peer()},
            wait_s=wait_s + final.waited_s, fetch_s=fetch_s, aggregate_s=aggregate_s,
            slices={"owned": len(slice_plan.owned_by(rnd.owners, ctx.identity.peer_id)),
                    "recomputed": len(outcome.recomputed), "spot_checked": len(outcome.spot_checked), "liars": len(outcome.liars),
                    "result_bytes": outcome.result_bytes,
                    "reduce": self.engine.last_reduce_times},  # wall, CPU, wait for a core (peer/run/thread_clock.py)
            timeline=marks, run_state=applied.reply.run_state if applied.reply is not None and applied.reply.applied else None,
            window_s=round_.manifest.window_ms / 1000,
        )

    def _ahead(self, round_: ManifestInHand, *, until_applied: bool) -> tuple[Future, threading.Event]:
        """_wait on a thread of its own, started now; set the event to end it after its current
        call (a round that stopped early leaves no poll behind for longer than one call)."""
        stop = threading.Event()
        return self.polls.submit(self._wait, round_, until_applied=until_applied, cancel=stop), stop

    def _wait(self, round_: ManifestInHand, *, until_applied: bool, cancel: threading.Event | None = None):
        """Long-poll the coordinator until round r's results are final (or, until_applied, until it
        applied the round), the coordinator moved on without it, or the run finished; GAVE_UP once
        `cancel` is set."""
        r, ctx = round_.r, self.ctx

        def done(reply: swarm_pb2.SliceResultsReply) -> bool:
            forgotten = not reply.ready and reply.current_round > r  # the coordinator moved on without this round
            return (reply.applied if until_applied else reply.ready) or forgotten or (reply.finished and reply.current_round <= r)

        return long_poll(lambda wait_s: ctx.client.slice_results(r, wait_s, until_applied=until_applied), done,
                         deadline=ctx.timeouts.results, poll=ctx.timeouts.poll, stop=ctx.stop, moved=round_.moved,
                         between=lambda: cancel is None or not cancel.is_set())
