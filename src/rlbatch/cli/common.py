"""Helpers shared by CLI commands: config options, JSON output."""

from __future__ import annotations

import typer

from rlbatch.core.config import Config
from rlbatch.core.loading import load_config
from rlbatch.core.runlog import dumps_strict

# The arguments this invocation was given after `rlbatch` (set by main.main), for commands
# that print a command to continue them.
INVOKED: list[str] = []

SetOption = typer.Option(None, "--set", help="override a config value: a.b=c (repeatable)")
PresetOption = typer.Option(None, "--preset", help="start from a built-in preset")


def resolve(config: str | None, preset: str | None, overrides: list[str] | None) -> Config:
    return load_config(config, preset=preset, overrides=list(overrides or []))


def print_json(obj) -> None:
    """The last stdout line: one JSON document."""
    print(dumps_strict(obj))
