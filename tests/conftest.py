"""Shared fixtures: a real swarm of processes on loopback that is always torn down (also when a
test fails), torch's thread count restored after every test, and a check at the end of the
session that no process started by the tests is still running. Shared plain functions (the tiny
run config, free_port, wait_line, summary) are in tests/helpers.py."""

from __future__ import annotations

import os
import signal

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")  # before grpc is imported: see peer/__init__.py
import sys
import time
from pathlib import Path

import pytest

_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:  # `tests.helpers` below, and the tests' own `from tests.helpers import ...`
    sys.path.insert(0, _ROOT)

from tests.helpers import ROOT, tiny_run_config, write_run_config  # noqa: E402,F401


@pytest.fixture
def swarm(tmp_path, request):
    """A peer.cli.launcher.Swarm in tmp_path: real coordinator and peer processes on loopback,
    forked from the prewarmed server (peer/cli/prewarmed.py: each skips ~4 CPU-seconds of
    importing torch and hivemind), or exec'd under @pytest.mark.exec_processes."""
    from peer.cli.launcher import Swarm

    s = Swarm(tmp_path / "swarm", prewarmed=request.node.get_closest_marker("exec_processes") is None)
    try:
        yield s
    finally:
        s.stop_all()
        for child in s.children:  # leave the logs where a failing test can show them
            if child.process.returncode not in (0, None):
                print(f"--- {child.name} (rc={child.process.returncode}) ---\n{''.join(child.lines)[-2000:]}")


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """SWARMLOCO_CACHE in tmp_path: what the test trains or prepares (a BPE tokenizer) is not
    read from a cache another test or run filled."""
    monkeypatch.setenv("SWARMLOCO_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def one_torch_thread():
    """torch on 1 thread for a module (`pytestmark = pytest.mark.usefixtures("one_torch_thread")`).
    WHY: on a busy 2-core box a tiny MKL matmul with 2 OpenMP threads waits ~15 ms for the
    descheduled thread. Restored after the module."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    """Whatever a test (or the code it runs, e.g. PeerNode(threads=1)) does to torch's thread
    count, the next test starts with the count this one found."""
    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None else None
    yield
    if before is not None and torch.get_num_threads() != before:
        torch.set_num_threads(before)


# Every process the tests start inherits this variable, also grandchildren that outlive their
# parent (a p2pd daemon whose DHT process died): the end-of-session check finds them by it.
SESSION_MARKER = f"SWARMLOCO_TEST_SESSION={os.getpid()}"
os.environ["SWARMLOCO_TEST_SESSION"] = str(os.getpid())
# Helpers that Python and torch start once and that end with the pytest process itself:
# multiprocessing's resource tracker, and torch's shared-memory manager (hivemind's DHT uses it).
SESSION_HELPERS = ("multiprocessing.resource_tracker", "torch_shm_manager")


def _running_descendants() -> dict[int, str]:
    """pid -> command line of live processes started from this test session (zombies excluded)."""
    from peer.cli import prewarmed

    marker = SESSION_MARKER.encode()
    servers = prewarmed.server_pids()  # ends with this process (its children are checked like any other)
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        state = stat[stat.rindex(")") + 2:].split()[0]  # "pid (comm) state ...": comm may hold spaces
        if state != "Z" and not any(helper in cmdline for helper in SESSION_HELPERS) and int(entry.name) not in servers:
            found[int(entry.name)] = cmdline
    return found


@pytest.fixture(scope="session", autouse=True)
def _no_process_outlives_the_tests():
    """Every process a test starts (Swarm children, DHT daemons, worker pools) must be gone when
    the session ends; any that is left fails the run by name, and is then killed."""
    yield
    if not Path("/proc/self/stat").exists():  # not Linux: nothing to look at
        return
    deadline = time.monotonic() + 10.0  # shutdowns already under way get a moment to finish
    left = _running_descendants()
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = _running_descendants()
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not left, "processes started by the tests are still running:\n" + "\n".join(
        f"  pid {pid}: {cmd[:200]}" for pid, cmd in left.items()
    )
