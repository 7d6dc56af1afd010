"""peer/run/gil_handoff.py: swarm processes hand the interpreter lock over within 0.5 ms, set
first thing by `swarmloco peer` and `swarmloco coordinator` (what it buys is measured on the
emulated WAN, benchmarks/wan.md, not timed here)."""

from __future__ import annotations

import socket
import sys

import pytest

from peer.cli import main as cli
from peer.run import gil_handoff


@pytest.fixture
def default_interval():
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    yield
    sys.setswitchinterval(before)


def test_quicken_handoffs_sets_the_interval(default_interval):
    gil_handoff.quicken_handoffs()
    assert sys.getswitchinterval() == pytest.approx(gil_handoff.SWITCH_INTERVAL_S)
    assert gil_handoff.SWITCH_INTERVAL_S < 0.005 / 5  # well under CPython's default


def test_a_peer_process_sets_it_before_anything_else_can_fail(default_interval):
    with socket.socket() as taken:  # a --port another process holds: refused right after the set-up calls
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        args = cli.build_parser().parse_args(["peer", "--coordinator", "127.0.0.1:1", "--host", "127.0.0.1",
                                              "--port", str(taken.getsockname()[1])])
        with pytest.raises(OSError, match="in use|--port"):
            cli.cmd_peer(args)
    assert sys.getswitchinterval() == pytest.approx(gil_handoff.SWITCH_INTERVAL_S)


def test_a_coordinator_process_sets_it_too(default_interval, tmp_path):
    args = cli.build_parser().parse_args(["coordinator", "--config", str(tmp_path / "missing.toml")])
    with pytest.raises((OSError, ValueError)):
        cli.cmd_coordinator(args)
    assert sys.getswitchinterval() == pytest.approx(gil_handoff.SWITCH_INTERVAL_S)
