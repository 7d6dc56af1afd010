"""Run config validation and the CLI's behaviour on bad input: clear messages, no tracebacks."""

import subprocess
import sys
from pathlib import Path

import pytest

from peer.run.config import ConfigError, RunConfig

ROOT = Path(__file__).resolve().parent.parent


def run_cli(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "peer.cli.main", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_example_config_loads_and_roundtrips():
    cfg = RunConfig.from_toml(ROOT / "docs" / "run.example.toml")
    assert cfg.run_id == "my-run" and cfg.inner.steps == 25 and cfg.outer.lr == 0.7
    again = RunConfig.from_json(cfg.to_json())
    assert again == cfg and again.config_hash() == cfg.config_hash()


@pytest.mark.parametrize(
    "data, fragment",
    [
        ({"inner": {"steps": 0}}, "inner.steps"),
        ({"model": {"d_model": 130, "n_head": 4}}, "divisible"),
        ({"outer": {"name": "adam"}}, "nesterov, demo, fedavg"),
        ({"inner": {"lr": "fast"}}, "expected a number"),
        ({"rounds": {"min_deadline_s": 10, "deadline_s": 5}}, "min_deadline_s"),
        ({"bogus": 1}, "unknown run config key"),
        ({"inner": {"stepz": 3}}, "unknown key inner.stepz"),
        ({"allowed_peers": ["zz"]}, "64 hex"),
        ({"outer": {"lr": "fast"}}, "outer.lr='fast': expected a number"),
        ({"outer": {"lr": -1.0}}, "positive learning rate"),
    ],
)
def test_bad_config_says_what_to_change(data, fragment):
    with pytest.raises(ConfigError, match=fragment):
        RunConfig.from_dict(data)


def test_help_lists_every_verb():
    out = run_cli("--help").stdout
    for verb in ("coordinator", "peer", "demo", "simulate", "status"):
        assert verb in out
    peer_help = run_cli("peer", "--help").stdout
    for flag in ("--initial-peers", "--coordinator", "--identity-path", "--client-mode", "--data", "--device"):
        assert flag in peer_help


def test_bad_arguments_get_a_message_not_a_traceback():
    result = run_cli("peer")  # neither --initial-peers nor --coordinator
    assert result.returncode == 2 and "--coordinator HOST:PORT or --initial-peers" in result.stderr
    assert "Traceback" not in result.stderr
    result = run_cli("coordinator", "--codec", "zip9")
    assert result.returncode == 2 and "codec" in result.stderr and "Traceback" not in result.stderr
    result = run_cli("peer", "--coordinator", "nowhere")
    assert result.returncode == 2 and "HOST:PORT" in result.stderr


def test_unreachable_initial_peer_exits_fast_with_advice():
    # run_cli's timeout is the hang guard: a peer that cannot connect must give up by itself.
    result = run_cli("peer", "--initial-peers", "/ip4/127.0.0.1/tcp/9/p2p/12D3KooWPou4aKLcMGmVcJh5KTun4w5jearJ27me8vCq9pSpSebq",
                     "--connect-timeout", "3")
    assert result.returncode == 1
    assert "is the coordinator running" in result.stderr and "Traceback" not in result.stderr
    result = run_cli("peer", "--coordinator", "127.0.0.1:9", "--connect-timeout", "2")
    assert result.returncode == 1 and "cannot reach 127.0.0.1:9" in result.stderr
