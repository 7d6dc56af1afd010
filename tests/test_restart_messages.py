"""Restarting a coordinator: the README's own command, rerun as it is, continues the run; a
checkpoint of another run is refused with what differs (the coordinator key, or the fields) and
what to pass.

The CLI test runs the README's "Start a swarm" command on loopback ports (the same flags, free
ports, a tiny run config); the message tests build real checkpoint files."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.helpers import ROOT, free_port, kill_tree, process_tree, still_running, tiny_run_config, wait_line, write_run_config

pytestmark = pytest.mark.integration

START_S = 90.0  # a coordinator's start on 2 busy cores: torch, the DHT, θ_0 and its evaluation


def readme_coordinator_command() -> list[str]:
    """The README's "Start a swarm" coordinator command, its continuation lines joined, split as a shell would."""
    lines = (ROOT / "README.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(".venv/bin/swarmloco coordinator "))
    command = []
    for line in lines[start:]:
        command.append(line.rstrip("\\").strip())
        if not line.endswith("\\"):
            break
    return shlex.split(" ".join(command))


class Coordinator:
    """One `swarmloco coordinator` process: its output, and its whole process tree stopped at the end."""

    def __init__(self, name: str, args: list[str], cwd: Path) -> None:
        self.name, self.lines = name, []
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        self.process = subprocess.Popen([sys.executable, "-m", "peer.cli.main", *args], cwd=cwd, env=env, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        self.tree: dict[int, int] = {}
        self.pump = threading.Thread(target=self._pump, daemon=True)  # wait_line: ended = read to EOF
        self.pump.start()

    def _pump(self) -> None:
        for line in self.process.stdout:  # type: ignore[union-attr]
            self.lines.append(line)

    def alive(self) -> bool:
        return self.process.poll() is None

    def output(self) -> str:
        return "".join(self.lines)

    def stop(self) -> int:
        """SIGTERM, and wait until it and everything it started (the DHT process, p2pd) are gone."""
        self.tree = process_tree(self.process.pid)
        if self.alive():
            os.killpg(self.process.pid, signal.SIGTERM)
        code = self.process.wait(timeout=30)
        left = still_running(self.tree, 10.0)
        assert not left, f"left running after {self.name} exited: {left}"
        return code

    def kill(self) -> None:
        kill_tree({**self.tree, **process_tree(self.process.pid)})
        if self.alive():
            self.process.kill()
        self.process.wait(timeout=10)


def on_loopback(command: list[str], home: Path, config: Path) -> list[str]:
    """The README command's flags (without `.venv/bin/swarmloco`), on free loopback ports, `~` in `home`."""
    ports = {"31337": str(free_port()), "31338": str(free_port())}
    args = []
    for arg in command[1:]:
        arg = re.sub(r"\b(31337|31338)\b", lambda m: ports[m.group(1)], arg)
        args.append(arg.replace("~", str(home)).replace("0.0.0.0", "127.0.0.1").replace("203.0.113.7", "127.0.0.1"))
    return [*args, "--host", "127.0.0.1", "--config", str(config)]


def without(args: list[str], flag: str) -> list[str]:
    i = args.index(flag)
    return args[:i] + args[i + 2:]


def test_the_readme_coordinator_command_rerun_as_it_is_continues_and_a_new_key_is_named_as_the_cause(tmp_path):
    command = readme_coordinator_command()
    assert command[:2] == [".venv/bin/swarmloco", "coordinator"]
    assert "--identity-path" in command and "--checkpoint" in command, command  # what a restart needs
    config = write_run_config(tmp_path / "run.json", rounds={"rounds": 3, "expected_peers": 2})
    args = on_loopback(command, tmp_path / "home", config)
    checkpoint = Path(args[args.index("--checkpoint") + 1])
    children: list[Coordinator] = []
    try:
        first = Coordinator("first", args, tmp_path)
        children.append(first)
        key = wait_line(first, r"coordinator fingerprint: (\w+)", START_S).group(1)
        assert checkpoint.exists()
        assert first.stop() == 128 + signal.SIGTERM

        # Both at once (each imports torch): the identical command, and the same one with a fresh key.
        again = Coordinator("again", args, tmp_path)
        new_key = Coordinator("new key", on_loopback(without(command, "--identity-path"), tmp_path / "home", config), tmp_path)
        children += [again, new_key]
        assert wait_line(again, r"coordinator fingerprint: (\w+)", START_S).group(1) == key
        assert re.search(r"round 0/3", again.output())

        assert new_key.process.wait(timeout=START_S) == 2, new_key.output()[-3000:]
        message = new_key.output()
        assert f"swarmloco coordinator: {checkpoint} was written by a different run config: the coordinator key differs" in message
        assert f"the checkpoint's run has {key[:8]}" in message and "pass the same --identity-path as before" in message
        assert "these fields differ" not in message and "Traceback" not in message
        assert again.stop() == 128 + signal.SIGTERM
    finally:
        for child in children:
            child.kill()


def checkpoint_file(path: Path, cfg) -> Path:
    """A real checkpoint file of the run `cfg`, as a coordinator writes it (its config in extra)."""
    import torch

    from peer.run import checkpoint

    checkpoint.save(path, checkpoint.Checkpoint(round=4, params=torch.zeros(8), param_hash="0" * 64, config_hash=cfg.config_hash(),
                                                extra={"config": cfg.to_dict()}))
    return path


def with_keys(cfg, *keys: str):
    import dataclasses

    return dataclasses.replace(cfg, control=dataclasses.replace(cfg.control, coordinators=sorted(keys)))


def test_a_changed_flag_is_named_with_both_values_and_the_key_only_when_it_differs(tmp_path):
    from peer.run import checkpoint

    key, other = "a" * 32, "b" * 32
    stored = with_keys(tiny_run_config(), key)
    path = checkpoint_file(tmp_path / "run.ckpt", stored)
    ckpt = checkpoint.load(path)
    changed = with_keys(tiny_run_config(inner={"steps": 9}, compression={"codec": "int8"}), key)

    message = checkpoint.config_mismatch(path, ckpt.extra["config"], changed.to_dict(), own_key=key)
    assert message == (f"{path} was written by a different run config: these fields differ: inner.steps 8 -> 9; "
                       "compression.codec 'fp16' -> 'int8': use the same --config and flags as before; "
                       "or give another --checkpoint path to start a new run")

    both = checkpoint.config_mismatch(path, ckpt.extra["config"], with_keys(tiny_run_config(inner={"steps": 9}), other).to_dict(),
                                      own_key=other)
    assert "the coordinator key differs (this one is bbbbbbbb, the checkpoint's run has aaaaaaaa)" in both
    assert "these fields differ: inner.steps 8 -> 9:" in both and "control.coordinators" not in both

    # A standby key listed on restart (--coordinators) is a field change, not a key change.
    listed = checkpoint.config_mismatch(path, ckpt.extra["config"], with_keys(stored, key, other).to_dict(), own_key=key)
    assert "coordinator key differs" not in listed and "control.coordinators" in listed


def test_a_checkpoint_without_its_config_gets_the_general_message(tmp_path):
    from peer.run import checkpoint

    path = checkpoint_file(tmp_path / "run.ckpt", tiny_run_config())
    message = checkpoint.config_mismatch(path, None, tiny_run_config(inner={"steps": 9}).to_dict(), own_key="a" * 32)
    assert message == (f"{path} was written by a different run config; use the same --config and flags as before, "
                       "or another --checkpoint path")
