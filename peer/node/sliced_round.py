"""A peer's sliced exchange of one round, once the signed manifest is in hand.

  1. reduce-scatter: reduce the slices this peer owns, sign each result, submit it
  2. wait until the coordinator says the round's results are final
  3. all-gather: each aggregated slice from one of its owners (recomputed where owners disagree,
     where nobody answered, and for a few random spot checks); false results are reported
  4. outer step on the gathered aggregate -> θ_{r+1}
  5. wait until the coordinator has applied the round too, for its hash of θ_{r+1}

It touches neither the model nor the node's parameters, so the overlapped schedule can run it
beside the next inner phase, like the all-to-all exchange.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

import torch

from peer.node.coordinator_client import CoordinatorClient
from peer.node.round_exchange import Exchange
from peer.run.faults import fail_point
from peer.run import slice_plan
from peer.run.round_math import RoundMath
from peer.run.slice_exchange import SliceExchange
from protocol.envelope import GATHERED_TAG, EnvelopeError, RoundManifest
from protocol.signing import sign_body
from protocol.slice_result import sign_mismatch_report
from protocol.wire import swarm_pb2

log = logging.getLogger("swarmloco.peer")
RESULTS_POLL_S = 5.0


def sliced_exchange(
    *,
    client: CoordinatorClient,
    exchange: SliceExchange,
    math: RoundMath,
    identity: Any,
    manifest: RoundManifest,
    signed_manifest: swarm_pb2.Signed,
    r: int,
    base: torch.Tensor,
    verify_header: Callable[[Any, int | None], Any],
    stop: threading.Event,
    wait_s: float,
    moved: Callable[[], bool] = lambda: False,
) -> Exchange:
    """`moved()`: the run's coordinator changed (failover); the caller restarts the round there."""
    t_fetch = time.monotonic()
    try:
        rnd = exchange.open_round(manifest, signed_manifest, r, verify_header)
    except EnvelopeError as exc:
        log.warning("round %d: the manifest does not hold (%s): resynchronising", r, exc)
        return Exchange(resync="could not verify the manifest", wait_s=wait_s)

    for signed in exchange.reduce_owned(rnd):  # reduce-scatter: our slices
        reply = client.submit_slice_result(signed)
        if not reply.accepted:
            log.warning("round %d: our slice result was refused: %s", r, reply.reason)
    fail_point("reduced", r)
    reduce_s = time.monotonic() - t_fetch

    t_wait = time.monotonic()
    reply = _poll(client, r, stop, moved, until_applied=False)
    if moved():
        return Exchange(resync="coordinator changed")
    if reply is None or not reply.ready:
        if reply is not None and reply.finished and reply.current_round <= r:
            return Exchange(finished=True, wait_s=wait_s)
        return Exchange(resync=f"the results of round {r} never became final", wait_s=wait_s)
    waited = time.monotonic() - t_wait

    t_gather = time.monotonic()
    outcome = exchange.gather(rnd, list(reply.results), spot_checks=math.cfg.exchange.spot_checks,
                              coverage=math.cfg.exchange.spot_check_coverage)
    fail_point("gathered", r)
    by_slice: dict[int, list[swarm_pb2.Signed]] = {}
    for lie in outcome.liars:
        log.warning("round %d: a slice result did not recompute: %s", r, lie.why)
        by_slice.setdefault(lie.result.slice, []).append(lie.signed)
    for slice_, signed_results in by_slice.items():
        client.report_evidence(sign_mismatch_report(identity, run_id=math.cfg.run_id, round_=r, slice_=slice_, results=signed_results))
    # Only now that its reports are in: the coordinator applies the round once every live peer has
    # said it gathered, so that a lie caught here never reaches θ_{r+1}.
    gathered = client.report_gathered(sign_body(identity, GATHERED_TAG, {
        "run_id": math.cfg.run_id, "round": r, "peer_id": identity.peer_id, "timestamp": time.time()}))
    if not gathered.accepted:
        log.warning("round %d: our gathered report was refused: %s", r, gathered.reason)
    fetch_s = reduce_s + time.monotonic() - t_gather

    t_agg = time.monotonic()
    new_params = base.clone()
    math.step_with_aggregate(new_params, outcome.combined, round_=r)
    aggregate_s = time.monotonic() - t_agg

    # Wait until the coordinator applied the round too: the node then compares θ_{r+1} with the
    # state it signs for round r + 1 (RunAuthority.state).
    _poll(client, r, stop, moved, until_applied=True)
    if moved():
        return Exchange(resync="coordinator changed")
    return Exchange(
        params=new_params, updates=len(rnd.headers), excluded={**manifest.excluded, **outcome.excluded_by_peer()},
        wait_s=wait_s + waited, fetch_s=fetch_s, aggregate_s=aggregate_s,
        slices={"owned": len(slice_plan.owned_by(rnd.owners, identity.peer_id)),
                "recomputed": len(outcome.recomputed), "spot_checked": len(outcome.spot_checked), "liars": len(outcome.liars)},
    )


def _poll(client: CoordinatorClient, r: int, stop: threading.Event, moved: Callable[[], bool], *, until_applied: bool):
    reply = None
    deadline = time.monotonic() + 600.0  # a round's results come within the result timeout; this only bounds a lost coordinator
    while not stop.is_set() and time.monotonic() < deadline and not moved():
        reply = client.slice_results(r, wait_s=RESULTS_POLL_S, until_applied=until_applied)
        done = reply.applied if until_applied else reply.ready
        forgotten = not reply.ready and reply.current_round > r  # the coordinator moved on without this round
        if done or forgotten or (reply.finished and reply.current_round <= r):
            break
    return reply
