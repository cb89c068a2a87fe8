"""The CLI's surface for a newcomer: nothing long starts by accident, and the version is one
flag away."""

from __future__ import annotations

from helpers.cli import run_cli
from rlbatch import __version__


def test_profile_without_a_config_or_preset_prints_its_usage_and_exits_2(tmp_path, capsys,
                                                                            monkeypatch):
    """`rlbatch profile` alone used to start the quick preset's multi-minute profile."""
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["profile"], capsys)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert lines[0].startswith("Usage: rlbatch profile [OPTIONS]")
    assert lines[1].startswith("error: give a config file, or --preset NAME") and len(lines) == 2
    assert not (tmp_path / "profiles").exists()


def test_version_prints_the_packages_version(capsys):
    code, out, err = run_cli(["--version"], capsys)
    assert code == 0 and out == f"rlbatch {__version__}\n" and err == ""


def test_replay_scores_the_procedure_profile_runs_without_flags():
    """`rlbatch replay` with no --follow replays what `rlbatch profile` with no --follow
    decides: one default for both commands and for the library's replay()."""
    import inspect

    from rlbatch.cli.profile_cmds import profile
    from rlbatch.cli.replay_cmds import replay as replay_command
    from rlbatch.profile.replay import replay

    def default(fn, name):
        value = inspect.signature(fn).parameters[name].default
        return getattr(value, "default", value)  # a typer Option holds its default

    assert default(profile, "follow") == default(replay_command, "follow") \
        == default(replay, "follow")
