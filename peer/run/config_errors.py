"""ConfigError: the one error a run config raises, below every module that validates one
(the sections, the presets table, RunConfig, the cross-section rules)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A run config value that cannot work; the message says what to change."""


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)
