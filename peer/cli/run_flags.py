"""CLI flags + a run config file -> one validated RunConfig: the loader every verb uses.

Each override flag names one RunConfig field (RUN_FLAGS below); its type, choices and help text
are read from that field (peer/run/config.py), so no default or description is kept twice.
`coordinator`, `demo` and `simulate` take the same flags; a flag that cannot change one verb's run
is refused there with the reason, never silently ignored.

Imports no torch: `swarmloco --help` and `swarmloco status` stay fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from peer.run.config import RunConfig, read_config_file
from peer.run.recipes import NAMES as RECIPE_NAMES, RECIPES, recipe_overrides

RUN_VERBS = ("coordinator", "demo", "simulate")


@dataclass(frozen=True, slots=True)
class RunFlag:
    flag: str  # e.g. "--inner-steps"
    path: str  # the RunConfig field it sets: "section.field", or a top-level field such as "seed"
    refused: Mapping[str, str] = field(default_factory=dict)  # verb -> why it cannot change that verb's run

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")


_NO_NETWORK = "simulate has no network: every virtual peer's update arrives each round"

RUN_FLAGS: tuple[RunFlag, ...] = (
    RunFlag("--rounds", "rounds.rounds"),
    RunFlag("--inner-steps", "inner.steps"),
    RunFlag("--codec", "compression.codec"),
    RunFlag("--outer", "outer.name"),
    RunFlag("--outer-lr", "outer.lr"),
    RunFlag("--outer-lr-warmup", "outer.lr_warmup_rounds"),
    RunFlag("--outer-lr-schedule", "outer.lr_schedule"),
    RunFlag("--aggregator", "aggregation.name"),
    RunFlag("--num-byzantine", "aggregation.num_byzantine"),
    RunFlag("--result-codec", "exchange.result_codec"),
    RunFlag(
        "--support", "exchange.support",
        {v: "the agreed support is a prototype only simulate runs (docs/robust-compressed.md)" for v in ("coordinator", "demo")},
    ),
    RunFlag("--min-peers", "rounds.min_peers", {"simulate": f"{_NO_NETWORK}, so there is no quorum to wait for"}),
    RunFlag(
        "--expected-peers", "rounds.expected_peers",
        {"demo": "demo waits for its --peers peers", "simulate": f"{_NO_NETWORK}; use --peers"},
    ),
    RunFlag("--run-seed", "seed"),
    RunFlag("--overlap", "rounds.overlap_communication"),  # simulate: the overlapped schedule's math, no time hidden
    RunFlag("--window-s", "rounds.window_s"),  # simulate: a window in simulated seconds (--peer-speeds)
    RunFlag("--init-from", "model.init_from"),  # peers take θ_0 from the coordinator: only its machine needs DIR
)


def config_field(path: str) -> tuple[dataclasses.Field, Any]:
    """The dataclass field a dotted RunConfig path names, and its resolved type."""
    owner: type = RunConfig
    *sections, name = path.split(".")
    for section in sections:
        owner = typing.get_type_hints(owner)[section]
    fields = {f.name: f for f in dataclasses.fields(owner)}
    return fields[name], typing.get_type_hints(owner)[name]


class _Refused(argparse.Action):
    """A run-config flag that cannot change this verb's run: an error with the reason, at parse time."""

    def __init__(self, option_strings: list[str], dest: str, *, reason: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs="?", help=argparse.SUPPRESS, **kwargs)
        self.reason = reason

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        parser.error(f"{option_string} is not used by this verb: {self.reason}")


def add_run_flags(parser: argparse.ArgumentParser, verb: str) -> None:
    """--config and every run-config override flag, typed and documented from its RunConfig field."""
    assert verb in RUN_VERBS, verb
    group = parser.add_argument_group("run config (flags override --config; defaults: peer/run/config.py)")
    group.add_argument("--config", metavar="RUN.toml", help="run config file (see docs/run.example.toml)")
    group.add_argument(
        "--recipe", choices=RECIPE_NAMES, default=None,
        help="published settings by name, applied after --config and before the flags below: "
        + "; ".join(f"{r.name}: {r.summary}" for r in RECIPES.values()),
    )
    for spec in RUN_FLAGS:
        if verb in spec.refused:
            group.add_argument(spec.flag, dest=spec.dest, action=_Refused, reason=spec.refused[verb])
            continue
        f, kind = config_field(spec.path)
        options: dict[str, Any] = {"dest": spec.dest, "default": None, "help": f.metadata["help"]}
        if kind is bool:
            options["action"] = "store_true"
        elif typing.get_origin(kind) is typing.Literal:
            options["choices"] = typing.get_args(kind)
        else:
            options["type"] = next(t for t in (int, float, str) if t is kind or t in typing.get_args(kind))
        group.add_argument(spec.flag, **options)


def flag_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """{RunConfig path: value} for every override flag given on the command line."""
    return {spec.path: getattr(args, spec.dest) for spec in RUN_FLAGS if getattr(args, spec.dest, None) is not None}


def load_run_config(args: argparse.Namespace) -> RunConfig:
    """The run config of a verb: --config (or the defaults), then the override flags, validated."""
    recipe = getattr(args, "recipe", None)
    overrides = {**(recipe_overrides(recipe) if recipe else {}), **flag_overrides(args)}
    return resolve_run_config(getattr(args, "config", None), overrides)


def resolve_run_config(source: str | Path | RunConfig | None, overrides: Mapping[str, Any]) -> RunConfig:
    """`source` (a config file, a RunConfig, or None for the defaults) with `overrides` applied
    ({"inner.steps": 12, "seed": 3, ...}), every rule checked (ConfigError says what to change).

    On a sparse codec the default median becomes centered-clip unless an aggregator was named,
    in the file or as an override; outer demo without a named codec sends its DCT top-k as signs;
    outer.lr unset becomes the chosen optimizer's default."""
    from peer.run import config_rules  # imports torch (the codec and aggregator registries)

    if isinstance(source, RunConfig):
        data, named_in_file, codec_in_file = source.to_dict(), False, True
    else:
        data = read_config_file(source) if source is not None else {}
        named_in_file = "name" in data.get("aggregation", {})
        codec_in_file = "codec" in data.get("compression", {})
    for path, value in overrides.items():
        config_field(path)  # a KeyError here is a typo in the caller, not a user error
        *sections, name = path.split(".")
        table = data
        for section in sections:
            table = table.setdefault(section, {})
        table[name] = value
    if "model.init_from" in overrides:  # read that directory again, even if the source named another's hash
        data["model"].pop("init_sha256", None)
    cfg = RunConfig.from_dict(data)
    explicit = named_in_file or "aggregation.name" in overrides
    explicit_codec = codec_in_file or "compression.codec" in overrides
    return config_rules.finalize(cfg, explicit_aggregator=explicit, explicit_codec=explicit_codec)
