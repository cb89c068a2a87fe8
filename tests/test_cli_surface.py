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
    """`rlbatch replay` with no --follow or --budget replays what `rlbatch profile` with
    none decides: both leave --follow unset (the default decision;
    tests/test_default_decision.py), and the library's replay() follows as the CLIs do
    once --follow is given."""
    import inspect

    from rlbatch.cli import profile_cmds, replay_cmds
    from rlbatch.profile import DEFAULT_FOLLOW
    from rlbatch.profile.replay import replay

    def default(fn, name):
        value = inspect.signature(fn).parameters[name].default
        return getattr(value, "default", value)  # a typer Option holds its default

    assert default(profile_cmds.profile, "follow") is None
    assert default(replay_cmds.replay, "follow") is None
    assert default(replay, "follow") == DEFAULT_FOLLOW  # the replay CLI with no flags:
    # tests/test_budget.py::test_rlbatch_replay_budget_prints_the_grid_within_it_and_the_...
