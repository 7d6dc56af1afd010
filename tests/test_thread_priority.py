"""The training thread's CPU priority in overlapped rounds (peer/node/thread_priority.py): only the
thread that trains is lowered, once, after the first exchange's thread exists; that thread keeps
its priority. Each case runs in a thread of its own, so pytest's thread is never lowered."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from peer.node.options import PeerOptions
from peer.node.overlap import run_overlapped
from peer.node import thread_priority
from peer.node.thread_priority import check_mode, lower_this_thread, resolve
from tests.test_node_overlap import ToyPeer

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priorities are Linux's")


def in_thread(fn):
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 (re-raised in the test's thread)
            out["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    t.join(60)
    if "error" in out:
        raise out["error"]
    return out["value"]


def nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@linux
def test_low_adds_five_to_this_threads_nice_only():
    before = nice()
    assert in_thread(lambda: (lambda n0: (lower_this_thread("low"), nice() - n0)[1])(nice())) == min(5, 19 - before)
    assert nice() == before


@linux
def test_auto_the_default_lowers_like_low_on_linux():
    assert PeerOptions(coordinator="127.0.0.1:1").train_priority == "auto"
    before = nice()
    assert in_thread(lambda: (lambda n0: (lower_this_thread("auto"), nice() - n0)[1])(nice())) == min(5, 19 - before)
    assert nice() == before


def test_auto_is_normal_where_threads_have_no_priority_of_their_own(monkeypatch):
    monkeypatch.setattr(thread_priority.sys, "platform", "darwin")
    assert resolve("auto") == "normal" and resolve("low") == "low"
    check_mode("auto")  # accepted everywhere
    with pytest.raises(ValueError, match="need Linux; use --train-priority normal"):
        check_mode("low")


def test_normal_changes_nothing():
    before = nice()
    assert in_thread(lambda: (lambda n0: (lower_this_thread("normal"), nice() - n0)[1])(nice())) == 0
    assert nice() == before


def test_an_unknown_mode_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="use one of auto, normal, low"):
        check_mode("idle")
    with pytest.raises(ValueError, match="--train-priority"):
        PeerOptions(coordinator="127.0.0.1:1", train_priority="high")


@linux
def test_overlapped_rounds_lower_the_training_thread_after_the_exchange_thread_started():
    peer = ToyPeer(rounds=3, steps=4, land_after=1)
    peer.options.train_priority = "low"
    seen: list[int] = []
    exchange = peer.exchange

    def noting(rnd):
        seen.append(nice())  # the exchange's worker thread
        return exchange(rnd)

    peer.exchange = noting

    def train_then_read() -> tuple[int, int]:
        start = nice()
        run_overlapped(peer)
        return start, nice()

    start, after = in_thread(train_then_read)
    assert after == min(start + 5, 19)
    assert seen == [start] * 3  # every round's exchange ran at the priority the peer started with
