"""The coordinator's long-polls hold no thread (protocol/aio_server.py): many peers wait for a
round's manifest at once, the coordinator's thread count stays where it was, the round still
closes, and every waiter gets the manifest."""

from __future__ import annotations

import threading
import time

from protocol.identity import Identity
from protocol.wire import swarm_pb2
from tests.coordinator_harness import join, make_update, push_and_commit, round_clock, serve_coordinator, tiny_config

WAITERS = 200


def _until(condition, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"still not {what} after {timeout_s:.0f}s"
        time.sleep(0.02)


def test_hundreds_of_waiting_long_polls_hold_no_thread_and_the_round_still_closes():
    with serve_coordinator(tiny_config(expected_peers=1), generous_limits=True) as served:
        peer = Identity.generate()
        assert join(served, peer).accepted
        threads_before = threading.active_count()
        request = swarm_pb2.ManifestRequest(round=0, wait_s=30.0, compact=True)
        polls = [served.stub.GetManifest.future(request, timeout=40.0) for _ in range(WAITERS)]
        _until(lambda: served.servicer.news.waiting == WAITERS, f"{WAITERS} long-polls parked")
        # Every one of them is parked on the server's loop, none answered, and no thread was added
        # for them (a sync server parks each on one of its 16 worker threads, and had 8 slots).
        assert not any(p.done() for p in polls)
        assert threading.active_count() <= threads_before + 2, (threads_before, threading.active_count())
        # Ordinary calls are served meanwhile, and the round closes.
        assert served.stub.GetRunInfo(swarm_pb2.RunInfoRequest(), timeout=10).run_id == served.coordinator.cfg.run_id
        signed, payload, _ = make_update(served, peer)
        with round_clock(served.coordinator):
            assert push_and_commit(served, signed, payload).accepted
            replies = [p.result(timeout=40.0) for p in polls]
        assert all(r.ready and r.manifest == replies[0].manifest for r in replies)
        assert served.servicer.news.waiting == 0
        for _ in range(WAITERS):  # every slot given back
            assert served.servicer.long_polls.acquire(blocking=False)


def test_a_waiter_sees_what_its_notifier_changed_after_notify_all_under_the_same_lock():
    """A notifier that notifies and then finishes its change, in one hold of the lock (the clock
    opens the next round, then the applied hash is set), must not leave a lock-free waiter parked
    until the next notification: it is woken once the lock is free."""
    import asyncio
    from concurrent import futures

    from protocol.async_wait import Announcing, LoopNews

    lock = threading.RLock()
    changed = Announcing(lock)
    news = LoopNews(lock)
    changed.listen(news.wake)
    state = {"applied": False}
    loop = asyncio.new_event_loop()
    loop.set_default_executor(futures.ThreadPoolExecutor(2))
    try:
        waiting = loop.create_task(news.until(lambda: state["applied"], 30.0))
        loop.run_until_complete(asyncio.sleep(0))  # parked
        assert news.waiting == 1

        def notify_then_change() -> None:
            with lock:
                changed.notify_all()
                time.sleep(0.2)  # the loop is free meanwhile: a waiter woken now would find nothing and park again
                state["applied"] = True

        notifier = threading.Thread(target=notify_then_change)
        notifier.start()
        started = time.monotonic()
        assert loop.run_until_complete(waiting) is True
        assert time.monotonic() - started < 20  # woken by that notification, not at its 30 s deadline
        notifier.join()
    finally:
        loop.close()
