"""Helpers shared by CLI commands: config options, comma-separated lists, JSON output."""

from __future__ import annotations

import typer

from rlbatch.core.config import Config
from rlbatch.core.errors import ConfigError
from rlbatch.core.loading import load_config
from rlbatch.core.runlog import dumps_strict

# The arguments this invocation was given after `rlbatch` (set by main.main), for commands
# that print a command to continue them.
INVOKED: list[str] = []

SetOption = typer.Option(None, "--set", help="override a config value: a.b=c (repeatable)")
PresetOption = typer.Option(None, "--preset", help="start from a built-in preset")


def resolve(config: str | None, preset: str | None, overrides: list[str] | None) -> Config:
    return load_config(config, preset=preset, overrides=list(overrides or []))


def whole_numbers(text: str, flag: str) -> list[int]:
    """A flag's comma-separated positive whole numbers (`8,32,64`); ConfigError naming `flag`
    and the first value that is not one."""
    values = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            value = int(part)
        except ValueError:
            raise ConfigError(f"{flag}: expected comma-separated integers; '{part}' is not a "
                              f"whole number") from None
        if value <= 0:
            raise ConfigError(f"{flag}: expected positive integers; '{part}' is not positive")
        values.append(value)
    if not values:
        raise ConfigError(f"{flag}: give one or more positive integers")
    return values


def print_json(obj) -> None:
    """The last stdout line: one JSON document."""
    print(dumps_strict(obj))
