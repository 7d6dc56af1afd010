"""The sliced peer's two waits on the coordinator, in process: each long-poll goes out before the
call whose news it waits for (docs/sliced-exchange.md "Round trips"), and the applied answer's
signed state of round r + 1 reaches the round's outcome (the node checks θ_{r+1} without a
GetRunInfo of its own)."""

from __future__ import annotations

import threading
from datetime import timedelta
from types import SimpleNamespace

import torch

from peer.exchange.outcome import Applied
from peer.exchange.peer_side import ManifestInHand, PeerExchangeContext
from peer.exchange.sliced_peer import SlicedPeer
from peer.run.slice_round import GatherOutcome
from peer.run.timeouts import PeerTimeouts
from protocol.identity import Identity
from protocol.wire import swarm_pb2

D = 4
WAIT_S = 20.0  # a call that is answered only once its long-poll is out: sequential, it would wait this long


class Engine:
    """The reduce/gather engine's seam: this peer owns the one slice; nothing is fetched."""

    def __init__(self, me: str) -> None:
        self.me = me
        self.last_reduce_times = None  # nothing timed (peer/run/thread_clock.py)

    def open_round(self, manifest, signed, r, verify):
        return SimpleNamespace(headers={self.me: None}, owners=[[self.me]], pack=lambda batches: batches)

    def reduce_owned(self, rnd, marks):
        return [swarm_pb2.Signed(body=b"our batch")]

    def gather(self, rnd, results, **_):
        return GatherOutcome(combined=torch.ones(D))

    def close(self) -> None:
        pass


class Coordinator:
    """Answers a call only once the long-poll that waits for its news is parked (a real one would
    answer the call at once; the point is the order the peer asks in)."""

    def __init__(self) -> None:
        self.asked = {"final": threading.Event(), "applied": threading.Event()}
        self.news = {"final": threading.Event(), "applied": threading.Event()}
        self.order: list[str] = []
        self.state = swarm_pb2.Signed(body=b"state of round 1", signature=b"s" * 64, public_key=b"k" * 32)

    def submit_slice_results(self, signed):
        self.order.append("submit" if self.asked["final"].wait(WAIT_S) else "submit, poll not out")
        self.news["final"].set()
        return swarm_pb2.CommitReply(accepted=True)

    def report_gathered(self, signed):
        self.order.append("gathered" if self.asked["applied"].wait(WAIT_S) else "gathered, poll not out")
        self.news["applied"].set()
        return swarm_pb2.CommitReply(accepted=True)

    def report_evidence(self, signed):
        raise AssertionError("nothing was false")

    def slice_results(self, round_, wait_s, *, until_applied=False):
        what = "applied" if until_applied else "final"
        self.asked[what].set()
        if not self.news[what].wait(wait_s):
            return swarm_pb2.SliceResultsReply(ready=until_applied, current_round=round_)
        if until_applied:
            return swarm_pb2.SliceResultsReply(ready=True, applied=True, param_hash="h" * 64, current_round=round_ + 1,
                                               run_state=self.state)
        return swarm_pb2.SliceResultsReply(ready=True, results=[swarm_pb2.Signed(body=b"our batch")], current_round=round_)


def test_each_long_poll_is_out_before_the_call_it_waits_on_and_the_state_comes_with_applied():
    me = Identity.generate()
    coordinator = Coordinator()
    math = SimpleNamespace(cfg=SimpleNamespace(run_id="run", exchange=SimpleNamespace(spot_checks=1, spot_check_coverage=0.5)),
                           step_with_aggregate=lambda params, combined, round_: params.add_(combined))
    ctx = PeerExchangeContext(client=coordinator, math=math, identity=me, store=None, pool=None, workers=None,
                              verify_header=lambda signed, r: None, own_endpoint="127.0.0.1:9", stop=threading.Event(),
                              timeouts=PeerTimeouts(poll=timedelta(seconds=1), results=timedelta(seconds=60)))
    side = SlicedPeer(ctx, engine=Engine(me.peer_id))
    try:
        outcome = side.run(ManifestInHand(r=0, manifest=SimpleNamespace(excluded={}, window_ms=0), signed=swarm_pb2.Signed(),
                                          base=torch.zeros(D), wait_s=0.0, moved=lambda: False))
    finally:
        side.close()
    assert coordinator.order == ["submit", "gathered"]
    assert isinstance(outcome, Applied) and outcome.params.tolist() == [1.0] * D
    assert outcome.run_state == coordinator.state and set(outcome.timeline) >= {"submitted", "final", "reported", "applied"}


class MovedOn(Coordinator):
    """Round 0's results, final, handed out when the coordinator is at round 3: it applied round 0
    without this peer (cut off) and its owners no longer keep round 0's slices."""

    def slice_results(self, round_, wait_s, *, until_applied=False):
        self.asked["applied" if until_applied else "final"].set()
        return swarm_pb2.SliceResultsReply(ready=True, results=[swarm_pb2.Signed(body=b"our batch")], current_round=round_ + 3)


def test_results_of_a_round_applied_long_without_us_are_not_gathered_but_resynced():
    from peer.exchange.outcome import Resync

    me = Identity.generate()
    engine = Engine(me.peer_id)
    gathered: list[int] = []
    engine.gather = lambda rnd, results, **_: gathered.append(1)  # old code: recomputed from what it reached, a θ nobody held
    math = SimpleNamespace(cfg=SimpleNamespace(run_id="run", exchange=SimpleNamespace(spot_checks=1, spot_check_coverage=0.5)))
    ctx = PeerExchangeContext(client=MovedOn(), math=math, identity=me, store=None, pool=None, workers=None,
                              verify_header=lambda signed, r: None, own_endpoint="127.0.0.1:9", stop=threading.Event(),
                              timeouts=PeerTimeouts(poll=timedelta(seconds=1), results=timedelta(seconds=60)))
    side = SlicedPeer(ctx, engine=engine)
    try:
        outcome = side.run(ManifestInHand(r=0, manifest=SimpleNamespace(excluded={}, window_ms=0), signed=swarm_pb2.Signed(),
                                          base=torch.zeros(D), wait_s=0.0, moved=lambda: False))
    finally:
        side.close()
    assert isinstance(outcome, Resync) and "applied without us" in outcome.why and not gathered
