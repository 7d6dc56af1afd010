"""The prewarmed server (peer/cli/prewarmed.py): a forked child is a process of its own, as
Popen(start_new_session=True) makes one (own session, the requested environment, working
directory and module, its exit status or killing signal as returncode), and it dies with the
server, which dies when its launcher closes it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from peer.cli import prewarmed
from tests.helpers import ROOT, process_tree, still_running

pytestmark = pytest.mark.skipif(not prewarmed.available(), reason="fork server: Linux only")

CHILD = "tests.prewarmed_child"  # prints what it sees, then exits with argv[1] (or waits)


@pytest.fixture(scope="module")
def server():
    s = prewarmed.PrewarmedServer(dict(os.environ))
    try:
        yield s
    finally:
        s.close()


def _lines(process) -> dict[str, str]:
    return dict(line.rstrip("\n").split("=", 1) for line in process.stdout if "=" in line)


def test_a_child_is_its_own_session_with_the_requested_environment_and_exit_status(server, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # as `python -m` would, it looks for the module there, then on PYTHONPATH
    child = server.spawn(CHILD, ["7", "an argument"], dict(os.environ, PREWARMED_PROBE="yes", PYTHONPATH=str(ROOT)))
    seen = _lines(child)
    assert child.wait(timeout=60) == 7 and child.returncode == 7
    assert seen["pid"] == str(child.pid) and seen["pgid"] == str(child.pid) and seen["sid"] == str(child.pid)
    assert seen["ppid"] == str(server.process.pid)
    assert seen["cwd"] == str(tmp_path) and seen["probe"] == "yes" and seen["argv"] == "['7', 'an argument']"
    assert seen["name"] == "__main__" and seen["torch_preloaded"] == "True"
    assert seen["stderr"] == "to stderr"  # stdout and stderr are one pipe, as Popen(stderr=STDOUT)


def test_a_child_shares_the_preloads_and_collects_only_its_own_objects(server, monkeypatch):
    """The server's preloads are frozen (a child's collections never write their pages), the child
    collects as a fresh Python does, and its first optimizer step finds torch._dynamo (~820
    modules with sympy, ~1.5 CPU-seconds, imported by that step otherwise) already there."""
    monkeypatch.chdir(ROOT)
    child = server.spawn(CHILD, ["optimizer"], dict(os.environ))
    seen = _lines(child)
    assert child.wait(timeout=60) == 0
    assert seen["gc_enabled"] == "True"
    assert int(seen["gc_frozen"]) > 100_000  # torch, hivemind, numpy, ... (~400K objects)
    assert int(seen["optimizer_imports"]) <= 5  # 800+ without torch._dynamo in PRELOAD


def test_a_killed_child_reports_the_signal_and_poll_never_blocks(server):
    child = server.spawn(CHILD, ["wait"], dict(os.environ))
    assert child.stdout.readline().startswith("pid=")
    assert child.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(timeout=0.2)
    os.killpg(child.pid, signal.SIGTERM)  # its session is its own process group
    assert child.wait(timeout=60) == -signal.SIGTERM
    child.kill()  # after it was reaped: no signal to a pid that may be reused


def test_an_exception_is_printed_and_exits_1(server):
    child = server.spawn(CHILD, ["raise"], dict(os.environ))
    out = child.stdout.read()
    assert child.wait(timeout=60) == 1
    assert "RuntimeError: asked to raise" in out


def test_children_die_with_their_server_and_nothing_is_left():
    s = prewarmed.PrewarmedServer(dict(os.environ))
    try:
        child = s.spawn(CHILD, ["wait"], dict(os.environ))
        assert child.stdout.readline().startswith("pid=")
        tree = process_tree(s.process.pid)
        assert child.pid in tree
    finally:
        s.close()  # closes its request socket: the server ends, its child on its parent-death signal
    assert child.wait(timeout=30) == -signal.SIGKILL
    assert not still_running(tree, 10.0)



class _SwarmStarted(Exception):
    """Raised by the fake Swarm below: the demo got as far as starting its swarm."""


@pytest.mark.parametrize("flags, forked", [([], True), (["--exec-processes"], False)])
def test_the_demo_forks_its_processes_unless_told_to_exec(flags, forked, tmp_path, monkeypatch):
    """`swarmloco demo` starts its swarm prewarmed (what lets 48 peers fit, benchmarks/scale.md);
    `--exec-processes` starts fresh Pythons."""
    from peer.cli import demo
    from peer.cli.main import build_parser

    seen = {}

    def fake_swarm(workdir, **kwargs):
        seen.update(kwargs)
        raise _SwarmStarted

    monkeypatch.setattr(demo, "Swarm", fake_swarm)
    args = build_parser().parse_args(["demo", "--peers", "2", "--workdir", str(tmp_path), *flags])
    with pytest.raises(_SwarmStarted):
        demo.main(args)
    assert seen["prewarmed"] is forked


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
