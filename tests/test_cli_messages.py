"""The messages a volunteer meets when something is wrong (issue 25, "messages that point the wrong
way"), each asserted where it is printed: the CLI run as a user runs it, in its own process
(test_config_cli.run_cli), except where the setup itself needs torch (export) or the message is
pure arithmetic (preflight). Nothing here trains; most runs never import torch."""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import ROOT, free_port, write_run_config
from tests.test_config_cli import run_cli

C_LOG_LINE = re.compile(r"^[EWID]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+\.cc:\d+\]", re.M)  # gRPC's C++ (absl) log format
UNREACHABLE_PEER = "/ip4/127.0.0.1/tcp/9/p2p/12D3KooWPou4aKLcMGmVcJh5KTun4w5jearJ27me8vCq9pSpSebq"


def refused(result: subprocess.CompletedProcess, code: int = 2) -> str:
    """stderr of a run that stopped with `code` and a message, not a traceback."""
    assert result.returncode == code, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    return result.stderr


@dataclass
class WaitingRuns:
    dht: subprocess.Popen
    grpc: subprocess.Popen
    grpc_port: int


@pytest.fixture(scope="module", autouse=True)
def waiting_runs(tmp_path_factory) -> WaitingRuns:
    """The two CLI runs that mostly wait (a DHT bootstrap that times out; a coordinator starting
    up to its gRPC bind), started with the module: they wait while the other tests run."""
    folder = tmp_path_factory.mktemp("waiting")
    config, port = write_run_config(folder / "run.json"), free_port()
    argv = {
        "dht": ["runs", "--initial-peers", UNREACHABLE_PEER, "--connect-timeout", "3"],
        # 203.0.113.1 (TEST-NET-3) is no address of this machine: the gRPC server's bind fails once
        # the coordinator is up, where gRPC logs `E... add_port.cc:83] Failed to add port ...`.
        "grpc": ["coordinator", "--config", str(config), "--host", "203.0.113.1", "--port", str(port),
                 "--host-maddrs", "/ip4/127.0.0.1/tcp/0"],
    }
    runs = {name: subprocess.Popen([sys.executable, "-m", "peer.cli.main", *args], cwd=ROOT, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE) for name, args in argv.items()}
    yield WaitingRuns(**runs, grpc_port=port)
    for run in runs.values():
        if run.poll() is None:
            run.kill()
            run.communicate()


def finished(run: subprocess.Popen) -> subprocess.CompletedProcess:
    stdout, stderr = run.communicate(timeout=120)
    return subprocess.CompletedProcess(run.args, run.returncode, stdout, stderr)


# --- usage and "did you mean" ---------------------------------------------------------------


def test_a_typod_flag_gets_the_verbs_usage_and_the_flag_it_meant():
    err = refused(run_cli("peer", "--inital-peers", UNREACHABLE_PEER))
    assert err.startswith("usage: swarmloco peer ") and "usage: swarmloco [-h]" not in err
    assert "unrecognized argument --inital-peers; did you mean --initial-peers?" in err
    # Refused before argparse would complain about anything else (status needs --coordinator).
    err = refused(run_cli("status", "--coordinatr", "127.0.0.1:1"))
    assert err.startswith("usage: swarmloco status ") and "did you mean --coordinator?" in err
    # A run-config flag on the peer (which takes its run config from the coordinator): who takes it.
    assert "--rounds is an option of coordinator, demo, simulate, not of peer" in refused(run_cli("peer", "--rounds", "3"))


def test_a_typod_verb_or_choice_gets_the_one_it_meant():
    err = refused(run_cli("peeer", "--coordinator", "127.0.0.1:1"))
    assert err.startswith("usage: swarmloco [-h]") and "invalid choice: 'peeer'" in err and "did you mean peer?" in err
    assert "did you mean cosine?" in refused(run_cli("simulate", "--outer-lr-schedule", "cosne"))


def test_verbose_is_taken_after_the_verb_too():
    from peer.cli.main import build_parser

    parse = build_parser().parse_args
    assert parse(["status", "-v", "--coordinator", "127.0.0.1:9"]).verbose
    assert parse(["-v", "status", "--coordinator", "127.0.0.1:9"]).verbose
    assert not parse(["status", "--coordinator", "127.0.0.1:9"]).verbose


# --- where a verb writes ---------------------------------------------------------------------


def _read_only_cli(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """`swarmloco ARGS` with `folder` bind-mounted read-only (a user and mount namespace of its own:
    the only read-only folder a test running as root can have)."""
    return subprocess.run(["unshare", "-rm", "sh", "-c", 'mount -o bind,ro "$0" "$0" && exec "$@"', str(folder),
                           sys.executable, "-m", "peer.cli.main", *args], capture_output=True, text=True, timeout=60, cwd=ROOT)


@pytest.fixture
def read_only(tmp_path) -> Path:
    folder = tmp_path / "read-only"
    folder.mkdir()
    if shutil.which("unshare") is None or _read_only_cli(folder, "--help").returncode != 0:
        pytest.skip("no unshare -rm here: cannot mount a read-only folder")
    return folder


def test_a_read_only_folder_is_refused_at_start_naming_the_flag(read_only):
    err = refused(_read_only_cli(read_only, "peer", "--coordinator", "127.0.0.1:9", "--identity-path", str(read_only / "peer.pem")))
    assert (f"swarmloco peer: cannot write the identity key to {read_only} (read-only file system): "
            "pass --identity-path PATH in a writable folder") in err
    assert "Errno" not in err
    err = refused(_read_only_cli(read_only, "peer", "--coordinator", "127.0.0.1:9", "--summary-json", str(read_only / "s.json")))
    assert f"cannot write the summary to {read_only} (read-only file system): pass --summary-json PATH" in err
    err = refused(_read_only_cli(read_only, "coordinator", "--checkpoint", str(read_only / "run.ckpt")))
    assert f"cannot write the checkpoint to {read_only} (read-only file system): pass --checkpoint PATH" in err
    err = refused(_read_only_cli(read_only, "export", "--checkpoint", "run.ckpt", "--out", str(read_only / "hf")))
    assert f"cannot write the exported model to {read_only / 'hf'} (read-only file system): pass --out DIR" in err


def test_an_existing_key_in_a_read_only_folder_still_needs_a_place_for_the_resume_state(read_only):
    from protocol.identity import Identity

    Identity.load_or_create(read_only / "peer.pem")  # made before the folder turns read-only
    err = refused(_read_only_cli(read_only, "peer", "--coordinator", "127.0.0.1:9", "--identity-path", str(read_only / "peer.pem")))
    assert f"cannot write the --resume state to {read_only} (read-only file system): pass --state-dir DIR" in err


def test_a_file_where_a_folder_should_be_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("")
    err = refused(run_cli("simulate", "--json", str(tmp_path / "notes.txt" / "result.json")))
    assert f"cannot write the results to {tmp_path / 'notes.txt'} ({tmp_path / 'notes.txt'} is not a folder): pass --json PATH" in err


def test_the_key_write_itself_says_what_to_do(tmp_path, monkeypatch):
    """The check at start is not a lock: a write that fails later (or outside the CLI) says the same."""
    from protocol import identity

    def read_only_open(path, *args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    monkeypatch.setattr(identity.os, "open", read_only_open)
    with pytest.raises(identity.IdentityError) as error:
        identity.Identity.load_or_create(tmp_path / "peer.pem")
    assert str(error.value) == (f"cannot write the identity key to {tmp_path} (read-only file system): "
                                "pass --identity-path PATH in a writable folder")


# --- standby, DHT, gRPC ----------------------------------------------------------------------


def test_a_standby_without_initial_peers_is_refused_and_names_its_key(tmp_path):
    from protocol.identity import Identity

    err = refused(run_cli("coordinator", "--standby", "--identity-path", str(tmp_path / "sb.pem")))
    fingerprint = Identity.load_or_create(tmp_path / "sb.pem").peer_id  # the key it made, kept for its next start
    assert "--standby needs --initial-peers" in err and "the active coordinator prints" in err
    assert f"fingerprint {fingerprint}" in err and f"--coordinators {fingerprint}" in err


def test_an_unreachable_dht_says_what_helps_and_not_client_mode(waiting_runs):
    err = refused(finished(waiting_runs.dht), code=1)
    assert "can this machine reach 127.0.0.1 tcp port 9" in err and "firewall" in err
    assert "--client-mode does not help here" in err and "try --client-mode" not in err


def test_grpc_keeps_its_cxx_log_off_the_terminal(waiting_runs):
    err, port = refused(finished(waiting_runs.grpc), code=1), waiting_runs.grpc_port
    assert f"cannot listen on 203.0.113.1:{port}: is the port already in use, or 203.0.113.1 not an address of this machine?" in err
    assert not C_LOG_LINE.search(err) and "add_port.cc" not in err and "GRPC_VERBOSITY" not in err, err


@pytest.mark.parametrize(("verbose", "environment", "expected"), [
    (False, {}, "NONE"),  # the default: gRPC's C++ log off
    (True, {}, None),  # -v: gRPC's own default (its errors shown)
    (False, {"GRPC_VERBOSITY": "DEBUG"}, "DEBUG"),  # the user's own setting, kept
    (False, {"GRPC_TRACE": "tcp"}, None),  # a trace asked for: not silenced
])
def test_grpc_logging_is_quiet_unless_asked_for(monkeypatch, verbose, environment, expected):
    from peer.cli.main import quiet_grpc_logging

    for name in ("GRPC_VERBOSITY", "GRPC_TRACE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delitem(sys.modules, "grpc", raising=False)  # as in the CLI: set before grpc is imported
    quiet_grpc_logging(verbose)
    assert os.environ.get("GRPC_VERBOSITY") == expected


# --- preflight's arithmetic and export -------------------------------------------------------


def test_preflight_suggests_a_whole_number_of_steps_and_shows_the_numbers_it_used():
    from peer.run.preflight_plan import Link, Swarm, recommend

    # A fast link and a slow step: communication needs well under one step per round.
    link = Link(rtt_s=0.0004, upload_bytes_per_s=800e6, download_bytes_per_s=900e6, dial_back=True, dial_address="127.0.0.1:1")
    swarm = Swarm(codec="fp16", inner_steps=25, peers=2, numel=450_000,
                  payload_bytes={"fp16": 900_000, "fp32": 1_800_000, "int8": 450_000, "int4": 230_000})
    plan = recommend(link, swarm, step_s=1.2064)
    for row, line in zip(plan["rows"], plan["arithmetic"][2:]):
        assert 0 < row["h_min"] < 1 and row["h_min_steps"] == 1
        assert f"/ (0.05 x 1.21 s) = {row['h_min']:.3g}, so H >= 1 " in line, line
        assert not re.search(r"= 0(\.0+)?(\s|%|$)", line), line  # no quantity rounded to nothing
    assert "0.0%" not in plan["choice"]["why"]


def _checkpoint(tmp_path: Path, model_section: dict) -> tuple[Path, Path]:
    """A run's checkpoint and its run.json; the checkpoint's config hash is another's (the
    coordinator adds its key to [control]), so loading it with --config prints a note."""
    from peer.learn.model import build_model, flat_params, param_hash
    from peer.run import checkpoint
    from tests.helpers import tiny_run_config

    cfg = tiny_run_config(model=model_section)
    params = flat_params(build_model(cfg.model, cfg.seed))
    path, config = tmp_path / "run.ckpt", tmp_path / "run.json"
    checkpoint.save(path, checkpoint.Checkpoint(round=1, params=params, param_hash=param_hash(params), config_hash="0" * 64))
    config.write_text(cfg.to_json())
    return path, config


def test_export_refuses_a_byte_level_run_first_and_with_nothing_else(tmp_path, capsys):
    from peer.cli.main import main

    path, config = _checkpoint(tmp_path, {})
    assert main(["export", "--checkpoint", str(path), "--config", str(config), "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"swarmloco export: {path} is a gpt run (model.arch = 'gpt'): only llama runs export") and "note:" not in err
    assert f"swarmloco sample --checkpoint {path}" in err and not (tmp_path / "hf").exists()


def test_exported_files_get_the_mode_new_files_get(tmp_path, capsys):
    from peer.cli.main import main

    path, config = _checkpoint(tmp_path, {"arch": "llama", "d_model": 32, "n_layer": 1, "n_head": 2, "seq_len": 32})
    previous = os.umask(0o027)
    try:
        assert main(["export", "--checkpoint", str(path), "--config", str(config), "--out", str(tmp_path / "hf")]) == 0
    finally:
        os.umask(previous)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "hf").iterdir()}
    assert modes == {"model.safetensors": 0o640, "config.json": 0o640}, modes
