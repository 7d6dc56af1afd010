"""A measurement script stopped with SIGTERM (what `kill`, `timeout` and CI send) unwinds through
its cleanup (scripts/stop_signals.py): bench_heterogeneous, stopped while its speed probes run in
their cgroups, exits 143 and leaves no cgroup and no probe behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from scripts.chaos_cgroup import CpuThrottle, cgroup_kind
from tests.helpers import ROOT, process_tree, still_running

SEED = 9071  # its cgroups are swlHwindow-s9071cal0..3: no other run's


@pytest.mark.skipif(os.geteuid() != 0 or not cgroup_kind(), reason="needs root and a cgroup cpu controller")
def test_a_sigtermed_heterogeneous_bench_removes_its_cgroups_and_probes(tmp_path):
    groups = [CpuThrottle(f"swlHwindow-s{SEED}cal{i}") for i in range(4)]
    bench = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "bench_heterogeneous.py"), "--rows", "window",
                              "--seed", str(SEED), "--calibrate-s", "600", "--json", str(tmp_path / "h.json"),
                              "--md", str(tmp_path / "h.md"), "--workdir", str(tmp_path / "work")],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tree: dict[int, int] = {}
    try:
        deadline = time.monotonic() + 120  # a hang guard: the groups appear as the probes start
        while not all(g.exists() for g in groups):
            assert bench.poll() is None and time.monotonic() < deadline, bench.stdout.read()[-3000:]
            time.sleep(0.1)
        tree = process_tree(bench.pid)
        assert len(tree) >= 5  # the bench and its four probes
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=60) == 143
        assert not [g.path for g in groups if g.exists()]
        assert not still_running(tree, 10.0)
    finally:
        bench.kill()
        bench.wait()
        for group in groups:
            group.close()
