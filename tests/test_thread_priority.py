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


def policy() -> int:
    return os.sched_getscheduler(threading.get_native_id())


@linux
def test_low_adds_five_to_this_threads_nice_only():
    before = nice()
    assert in_thread(lambda: (lambda n0: (lower_this_thread("low"), nice() - n0)[1])(nice())) == min(5, 19 - before)
    assert nice() == before


@linux
def test_idle_puts_this_thread_alone_under_sched_idle():
    before = policy()
    assert before != os.SCHED_IDLE
    assert in_thread(lambda: (lower_this_thread("idle"), policy())[1]) == os.SCHED_IDLE
    assert policy() == before


@linux
def test_a_thread_started_by_an_idle_thread_inherits_idle():
    def start_one() -> int:
        lower_this_thread("idle")
        seen: list[int] = []
        child = threading.Thread(target=lambda: seen.append(policy()))
        child.start()
        child.join(30)
        return seen[0]

    assert in_thread(start_one) == os.SCHED_IDLE


@linux
def test_a_pool_whose_thread_started_before_the_lowering_keeps_its_priority():
    """Why the node starts its state writer's thread at set-up (peer/node/node.py): a pool's thread
    starts at its first submit, from the submitting thread, and inherits that thread's policy."""
    from concurrent.futures import ThreadPoolExecutor

    def lower_then_submit() -> tuple[int, int]:
        early, late = ThreadPoolExecutor(1), ThreadPoolExecutor(1)
        try:
            early.submit(lambda: None).result()
            lower_this_thread("idle")
            return early.submit(policy).result(), late.submit(policy).result()
        finally:
            early.shutdown()
            late.shutdown()

    before = policy()
    assert in_thread(lower_then_submit) == (before, os.SCHED_IDLE)


@linux
def test_a_refused_lowering_leaves_training_at_its_priority_with_a_warning(monkeypatch, caplog):
    def refuse(*args):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(thread_priority.os, "sched_setscheduler", refuse)
    monkeypatch.setattr(thread_priority.os, "setpriority", refuse)
    monkeypatch.setattr(thread_priority.sys, "platform", "linux")
    for mode in ("auto", "idle", "low"):
        caplog.clear()
        before = (policy(), nice())
        assert in_thread(lambda: (lower_this_thread(mode), (policy(), nice()))[1]) == before
        assert f"--train-priority {mode}: could not lower the training thread" in caplog.text


@linux
def test_auto_the_default_is_idle_on_linux():
    assert PeerOptions(coordinator="127.0.0.1:1").train_priority == "auto"
    assert resolve("auto") == "idle"
    before = (policy(), nice())
    assert in_thread(lambda: (lower_this_thread("auto"), (policy(), nice()))[1]) == (os.SCHED_IDLE, before[1])
    assert (policy(), nice()) == before


def test_auto_is_normal_where_threads_have_no_priority_of_their_own(monkeypatch):
    monkeypatch.setattr(thread_priority.sys, "platform", "darwin")
    assert resolve("auto") == "normal" and resolve("low") == "low" and resolve("idle") == "idle"
    check_mode("auto")  # accepted everywhere
    for mode in ("low", "idle"):
        with pytest.raises(ValueError, match=f"--train-priority {mode}: per-thread priorities need Linux; use --train-priority normal"):
            check_mode(mode)


def test_normal_changes_nothing():
    before = (policy(), nice())
    assert in_thread(lambda: (lower_this_thread("normal"), (policy(), nice()))[1]) == before


def test_an_unknown_mode_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="use one of auto, normal, low, idle"):
        check_mode("lowest")
    with pytest.raises(ValueError, match="--train-priority"):
        PeerOptions(coordinator="127.0.0.1:1", train_priority="high")


@linux
@pytest.mark.parametrize("mode", ["auto", "low"])
def test_overlapped_rounds_lower_the_training_thread_after_the_exchange_thread_started(mode):
    peer = ToyPeer(rounds=3, steps=4, land_after=1)
    peer.options.train_priority = mode
    seen: list[tuple[int, int]] = []
    exchange = peer.exchange

    def noting(rnd):
        seen.append((policy(), nice()))  # the exchange's worker thread
        return exchange(rnd)

    peer.exchange = noting

    def train_then_read() -> tuple[tuple[int, int], tuple[int, int]]:
        start = (policy(), nice())
        run_overlapped(peer)
        return start, (policy(), nice())

    start, after = in_thread(train_then_read)
    assert start[0] != os.SCHED_IDLE
    assert after == ((os.SCHED_IDLE, start[1]) if mode == "auto" else (start[0], min(start[1] + 5, 19)))
    assert seen == [start] * 3  # every round's exchange ran at the priority the peer started with
