"""docs/reference.md is `rlbatch config reference`'s output: every config key with its type,
default and description, and every command's options. It fails here when it is stale (the
schema or a command's help changed without regenerating it) or a key has no description."""

from __future__ import annotations

from pathlib import Path

from rlbatch.cli.main import app
from rlbatch.cli.reference import config_rows, reference_markdown
from rlbatch.core.config import Config

DOC = Path(__file__).resolve().parents[1] / "docs" / "reference.md"


def test_every_config_key_says_what_it_is():
    rows = config_rows(Config, Config().model_dump(mode="json"))
    assert len(rows) > 100
    assert [key for key, _, _, what in rows if not what.strip()] == []


def test_the_reference_doc_is_what_the_command_prints():
    """Regenerate with `rlbatch config reference > docs/reference.md`."""
    assert DOC.read_text() == reference_markdown(app), \
        "docs/reference.md is stale: run `rlbatch config reference > docs/reference.md`"


def test_the_reference_names_every_command(capsys):
    from helpers.cli import run_cli

    code, out, _ = run_cli(["config", "reference"], capsys)
    assert code == 0
    for name in ("train", "profile", "replay", "config show", "model build", "data export"):
        assert f"### `rlbatch {name}`" in out
