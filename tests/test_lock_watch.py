"""SWARMLOCO_LOCK_WATCH (peer/coordinator/lock_watch.py): the coordinator's lock, watched, still
serves the Condition the long-polls wait on, and a hold longer than HELD_S prints its holder's
stack (where issue 22's partition stall was first looked for)."""

from __future__ import annotations

import gc
import threading
import time

from peer.coordinator import lock_watch
from protocol.async_wait import Announcing


def test_unset_it_is_a_plain_rlock(monkeypatch):
    monkeypatch.delenv(lock_watch.ENV, raising=False)
    assert type(lock_watch.coordinator_lock()) is type(threading.RLock())


def test_a_watched_lock_serves_a_condition_and_names_a_long_holder(monkeypatch, capsys):
    monkeypatch.setenv(lock_watch.ENV, "1")
    lock = lock_watch.coordinator_lock("the test's lock")
    assert isinstance(lock, lock_watch.WatchedLock)
    news = Announcing(lock)
    woke: list[bool] = []
    waiting = threading.Event()

    def waiter() -> None:
        with news, lock:  # reentrant: a wait releases both levels and takes both back
            waiting.set()  # the notify below can take the lock only once this wait has released it
            assert news.wait(10.0)
            woke.append(lock.holder == threading.get_ident() and lock._depth == 2)

    thread = threading.Thread(target=waiter)
    thread.start()
    assert waiting.wait(10.0)
    with lock:
        news.notify_all()
    thread.join(10.0)
    assert woke == [True] and lock.holder is None

    def held_too_long() -> None:
        with lock:
            time.sleep(lock_watch.HELD_S + 4 * lock_watch.POLL_S)

    held_too_long()
    time.sleep(lock_watch.POLL_S)
    err = capsys.readouterr().err
    assert "the test's lock held" in err and "in held_too_long" in err and "by thread MainThread" in err
    watchdog = lock.watchdog
    del lock, news
    gc.collect()
    watchdog.join(10.0)  # gone with its lock, faulthandler disarmed: nothing dumps later in the session
    assert not watchdog.is_alive()
