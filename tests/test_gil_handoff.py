"""peer/run/gil_handoff.py: swarm processes hand the interpreter lock over within 0.5 ms, set by the
CLI process itself (`swarmloco ...`, as the demo's forked processes and the WAN bench's run it) and
never by a test that calls main() in its own process (what it buys is measured on the emulated WAN,
benchmarks/wan.md, not timed here)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from peer.cli import main as cli
from peer.run import gil_handoff

ROOT = Path(__file__).resolve().parent.parent
# The CLI as its own process: `swarmloco peer` refused at once (its --port is held), then the interval.
PROBE = """
import sys
from peer.cli import main
sys.argv = ["swarmloco", "peer", "--coordinator", "127.0.0.1:1", "--host", "127.0.0.1", "--port", sys.argv[1]]
code = main.main()
print(code, sys.getswitchinterval(), flush=True)
"""


def test_quicken_handoffs_sets_the_interval():
    before = sys.getswitchinterval()
    try:
        gil_handoff.quicken_handoffs()
        assert sys.getswitchinterval() == pytest.approx(gil_handoff.SWITCH_INTERVAL_S)
        assert gil_handoff.SWITCH_INTERVAL_S < 0.005 / 5  # well under CPython's default
    finally:
        sys.setswitchinterval(before)


def test_the_cli_process_sets_it():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        out = subprocess.run([sys.executable, "-c", PROBE, str(taken.getsockname()[1])], capture_output=True, text=True,
                             timeout=120, cwd=ROOT)
    code, interval = out.stdout.split()
    assert code != "0", out.stderr  # refused: the port is held
    assert float(interval) == pytest.approx(gil_handoff.SWITCH_INTERVAL_S)


def test_a_test_calling_main_keeps_its_own_interval(tmp_path):
    before = sys.getswitchinterval()
    assert cli.main(["coordinator", "--config", str(tmp_path / "missing.toml")]) != 0
    assert sys.getswitchinterval() == before
