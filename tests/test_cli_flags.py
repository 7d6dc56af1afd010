"""The run-config flags: every documented flag reaches the RunConfig of every verb that documents
it, flags that cannot change a verb's run are refused, and `--help` / `status` never load torch."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from peer.cli.main import ATTACKS, build_parser
from peer.cli.run_flags import RUN_FLAGS, RUN_VERBS, load_run_config
from peer.run.config import ConfigError, RunConfig

ROOT = Path(__file__).resolve().parent.parent

# Each run-config flag: the field it must set (written here, not read from the table under test),
# a value that differs from the default, and what the field must become.
FLAG_VALUES: dict[str, tuple[str, list[str], object]] = {
    "--rounds": ("rounds.rounds", ["7"], 7),
    "--inner-steps": ("inner.steps", ["3"], 3),
    "--codec": ("compression.codec", ["int8"], "int8"),
    "--outer": ("outer.name", ["fedavg"], "fedavg"),
    "--outer-lr": ("outer.lr", ["0.25"], 0.25),
    "--outer-lr-warmup": ("outer.lr_warmup_rounds", ["2"], 2),
    "--outer-lr-schedule": ("outer.lr_schedule", ["cosine"], "cosine"),
    "--aggregator": ("aggregation.name", ["mean"], "mean"),
    "--num-byzantine": ("aggregation.num_byzantine", ["1"], 1),
    "--result-codec": ("exchange.result_codec", ["chunk-topk:4096:64+int8"], "chunk-topk:4096:64+int8"),
    "--support": ("exchange.support", ["vote", "--codec", "chunk-topk:4096:64+stat2"], "vote"),  # needs a chunked top-k codec
    "--min-peers": ("rounds.min_peers", ["2"], 2),
    "--expected-peers": ("rounds.expected_peers", ["3"], 3),
    "--run-seed": ("seed", ["5"], 5),
    "--overlap": ("rounds.overlap_communication", [], True),
    "--window-s": ("rounds.window_s", ["2.5"], 2.5),
    "--init-from": ("model.init_from", ["{init_dir}"], "{init_dir}"),  # a checkpoint folder the test writes
}


def documented_run_flags() -> set[tuple[str, str]]:
    """(flag, verb) for every run-config flag of the README's flag table."""
    run_flags = {spec.flag for spec in RUN_FLAGS}
    pairs = set()
    for line in (ROOT / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`--"):
            continue
        verbs = {v.strip() for v in cells[1].split(",")}
        for flag in re.findall(r"`(--[a-z-]+)", cells[0]):
            if flag in run_flags:
                pairs |= {(flag, verb) for verb in verbs}
    return pairs


def field_value(cfg: RunConfig, path: str):
    value = cfg
    for name in path.split("."):
        value = getattr(value, name)
    return value


def loaded_config(verb: str, argv: list[str]) -> RunConfig:
    """The RunConfig `swarmloco VERB argv` would run with, loaded as that verb loads it."""
    args = build_parser().parse_args([verb, *argv])
    if verb == "simulate":
        from peer.cli.simulate import options_from_args

        return options_from_args(args).run_config()
    return load_run_config(args)  # coordinator and demo (demo adds expected_peers = --peers first)


def test_readme_documents_exactly_the_flags_each_verb_takes():
    accepted = {(spec.flag, verb) for spec in RUN_FLAGS for verb in RUN_VERBS if verb not in spec.refused}
    assert documented_run_flags() == accepted
    assert set(FLAG_VALUES) == {spec.flag for spec in RUN_FLAGS}


@pytest.fixture(scope="module")
def init_dir(tmp_path_factory) -> str:
    """A Hugging Face checkpoint folder for --init-from: a tiny byte-level llama, as `swarmloco export` writes it."""
    from peer.learn.hf_checkpoint import export_model
    from peer.learn.model import build_model

    cfg = RunConfig.from_dict({"model": {"arch": "llama", "d_model": 32, "n_layer": 1, "n_head": 2}})
    return str(export_model(build_model(cfg.model, 0), cfg, tmp_path_factory.mktemp("init") / "hf").resolve())


@pytest.mark.parametrize("flag, verb", sorted(documented_run_flags()))
def test_every_documented_flag_reaches_the_run_config(flag, verb, request):
    path, argv, expected = FLAG_VALUES[flag]
    if flag == "--init-from":
        folder = request.getfixturevalue("init_dir")
        argv, expected = [a.format(init_dir=folder) for a in argv], expected.format(init_dir=folder)
    default = field_value(loaded_config(verb, []), path)
    changed = field_value(loaded_config(verb, [flag, *argv]), path)
    assert changed == expected != default


@pytest.mark.parametrize("verb, flag, reason", [
    ("simulate", "--min-peers", "no quorum"),
    ("simulate", "--expected-peers", "use --peers"),
    ("demo", "--expected-peers", "waits for its --peers"),
])
def test_flags_that_cannot_change_a_verb_are_refused_with_the_reason(verb, flag, reason, capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([verb, flag, "2"] if flag != "--overlap" else [verb, flag])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"{flag} is not used by this verb" in err and reason in err


@pytest.mark.parametrize("outer, default_lr", [("nesterov", 0.7), ("demo", 1e-3), ("fedavg", 1.0)])
def test_outer_lr_sets_the_step_size_of_every_outer_optimizer(outer, default_lr):
    from peer.run.round_math import RoundMath

    default = loaded_config("coordinator", ["--outer", outer])
    assert default.outer.lr == default_lr  # written out: the served config shows the lr that runs
    assert RoundMath(default, numel=8).outer.lr == default_lr
    cfg = loaded_config("coordinator", ["--outer", outer, "--outer-lr", "0.25"])
    assert RoundMath(cfg, numel=8).outer.lr == 0.25


def test_an_aggregator_named_in_the_config_file_is_kept_or_refused_never_replaced(tmp_path):
    sparse = tmp_path / "sparse.toml"
    sparse.write_text('[compression]\ncodec = "topk:0.01+int8"\n')
    assert load_run_config(argparse.Namespace(config=str(sparse))).aggregation.name == "centered-clip"
    sparse.write_text('[compression]\ncodec = "topk:0.01+int8"\n[aggregation]\nname = "median"\n')
    with pytest.raises(ConfigError, match="coordinate-wise"):
        load_run_config(argparse.Namespace(config=str(sparse)))
    with pytest.raises(ConfigError, match="coordinate-wise"):
        loaded_config("coordinator", ["--codec", "topk:0.01+int8", "--aggregator", "median"])


def test_help_names_every_attack_and_aggregator(capsys):
    from optim import aggregate, attacks

    assert ATTACKS == attacks.NAMES
    with pytest.raises(SystemExit):
        build_parser().parse_args(["simulate", "--help"])
    # argparse wraps lines, also after a hyphen inside a name ("agr-" / "tailored")
    help_text = " ".join(capsys.readouterr().out.split()).replace("- ", "-")
    assert all(name in help_text for name in (*aggregate.NAMES, *attacks.NAMES))


def test_help_and_status_do_not_import_torch():
    program = """
import sys
from peer.cli.main import main
for argv in (["--help"], *([verb, "--help"] for verb in ("coordinator", "peer", "demo", "simulate", "status"))):
    try:
        main(argv)
    except SystemExit:
        pass
code = main(["status", "--coordinator", "127.0.0.1:9", "--connect-timeout", "0.5"])
print("exit", code, "loaded", sorted(m for m in ("torch", "hivemind") if m in sys.modules))
"""
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.stdout.splitlines()[-1] == "exit 1 loaded []", result.stdout[-500:] + result.stderr[-2000:]
    assert "cannot reach 127.0.0.1:9" in result.stderr and "Traceback" not in result.stderr
