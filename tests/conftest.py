"""Shared fixtures: the one tiny run config, a real swarm on loopback that is always torn down
(also when a test fails), torch's thread count restored after every test, and a check at the
end of the session that no process started by the tests is still running."""

from __future__ import annotations

import json
import os
import signal

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")  # before grpc is imported: see peer/__init__.py
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# The tests' small, fast run: ~60k parameters, 8 inner steps, a 1 MB corpus; rounds close in
# about a second on 2 busy cores, and 3 rounds of 3 peers lower the validation loss by > 0.05.
TINY_SECTIONS: dict[str, dict] = {
    "model": {"d_model": 64, "n_layer": 1, "n_head": 2, "seq_len": 64},
    "data": {"batch_size": 4, "val_batches": 4, "max_corpus_bytes": 1_000_000},
    "inner": {"steps": 8, "warmup_steps": 4},
    "rounds": {"rounds": 3, "min_deadline_s": 2.0, "deadline_s": 30.0, "peer_timeout_s": 6.0},
}


def tiny_run_config(**sections):
    """The tiny RunConfig; each keyword is a section whose dict updates the tiny values
    (`rounds={"rounds": 4}`), or a top-level field (`seed=3`). For module-level use too."""
    from peer.run.config import RunConfig

    data = RunConfig().to_dict()
    for section, values in TINY_SECTIONS.items():
        data[section].update(values)
    for section, values in sections.items():
        if isinstance(values, dict):
            data[section].update(values)
        else:
            data[section] = values
    return RunConfig.from_dict(data)


@pytest.fixture
def tiny_config():
    """tiny_run_config, as a fixture: call it with the sections a test changes."""
    return tiny_run_config


def write_run_config(path: Path, **sections) -> Path:
    """tiny_run_config(**sections) written as a config file for the CLI (`--config PATH`)."""
    path.write_text(json.dumps(tiny_run_config(**sections).to_dict()))
    return path


@pytest.fixture
def swarm(tmp_path):
    from peer.cli.launcher import Swarm

    s = Swarm(tmp_path / "swarm")
    try:
        yield s
    finally:
        s.stop_all()
        for child in s.children:  # leave the logs where a failing test can show them
            if child.process.returncode not in (0, None):
                print(f"--- {child.name} (rc={child.process.returncode}) ---\n{''.join(child.lines)[-2000:]}")


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
    marker = SESSION_MARKER.encode()
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
        if state != "Z" and not any(helper in cmdline for helper in SESSION_HELPERS):
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
