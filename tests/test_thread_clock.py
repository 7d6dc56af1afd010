"""peer/run/thread_clock.py: a call's wall time, its thread's CPU and its wait for a core."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from peer.run import thread_clock
from peer.run.thread_clock import CoreTally


def spin(seconds: float) -> int:
    """Burn this thread's CPU for about `seconds` of its own CPU time."""
    end, n = time.thread_time() + seconds, 0
    while time.thread_time() < end:
        n += 1
    return n


def test_a_busy_call_is_its_own_cpu_and_a_sleeping_one_is_not():
    tally = CoreTally()
    assert tally.call(spin, 0.05) > 0
    busy = tally.take()
    assert busy["calls"] == 1 and busy["cpu_s"] >= 0.05 and busy["wall_s"] >= busy["cpu_s"] - 0.002  # thread_time's granularity
    tally.call(time.sleep, 0.05)
    slept = tally.take()
    assert slept["calls"] == 1 and slept["wall_s"] >= 0.05 and slept["cpu_s"] < 0.02  # a sleep runs nothing
    assert tally.take() == {"calls": 0, "wall_s": 0.0, "cpu_s": 0.0, "core_wait_s": 0.0}  # take() started again


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread schedstat is Linux's")
def test_on_linux_the_wait_for_a_core_is_read_and_never_negative():
    before = thread_clock.core_wait_s()
    assert before is not None and before >= 0
    tally = CoreTally()
    tally.call(spin, 0.02)
    waited = tally.take()["core_wait_s"]
    assert waited is not None and waited >= 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread schedstat is Linux's")
def test_each_thread_reads_its_own_counters_from_the_file_it_opened_once():
    seen: dict[int, tuple[int, int]] = {}

    def read() -> None:
        assert thread_clock.core_wait_s() is not None and thread_clock.core_wait_s() is not None  # the second: the same file
        seen[threading.get_native_id()] = (os.fstat(thread_clock._SCHEDSTAT.file.fd).st_ino, thread_clock._SCHEDSTAT.file.fd)

    threads = [threading.Thread(target=read) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    read()
    assert len(seen) == 3 and len({fd for _, fd in seen.values()}) >= 2  # a finished thread's file may be closed and its fd reused
    for tid, (inode, _) in seen.items():
        if tid == threading.get_native_id():
            assert inode == os.stat(f"/proc/self/task/{tid}/schedstat").st_ino  # this thread's own, not the process's


def test_calls_from_several_threads_add_up_and_a_raising_call_is_counted():
    tally = CoreTally()
    threads = [threading.Thread(target=tally.call, args=(spin, 0.01)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with pytest.raises(ZeroDivisionError):
        tally.call(lambda: 1 / 0)
    got = tally.take()
    assert got["calls"] == 4 and got["cpu_s"] >= 0.03


def test_where_the_os_does_not_say_the_wait_is_unknown_not_zero(monkeypatch, tmp_path):
    monkeypatch.setattr(thread_clock, "SCHEDSTAT", str(tmp_path / "no-such-file"))
    assert thread_clock.core_wait_s() is None
    tally = CoreTally()
    tally.call(spin, 0.001)
    got = tally.take()
    assert got["calls"] == 1 and got["core_wait_s"] is None
