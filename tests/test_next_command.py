"""The command a profile prints to continue itself: the same arguments, the same folder."""

from __future__ import annotations

import shlex

from rlbatch.analysis.selection import next_seeds
from rlbatch.cli.profile_cmds import continue_command


def test_continue_command_keeps_every_setting_and_names_the_folder():
    argv = ["profile", "--preset", "quick", "--set", "eval.every_samples=256",
            "--batches", "8,32", "--seeds", "2", "--out", "p/q"]
    cmd = continue_command(argv, "p/q", seeds=4)
    assert shlex.split(cmd) == ["rlbatch", "profile", "--preset", "quick", "--set",
                                "eval.every_samples=256", "--batches", "8,32", "--seeds", "4",
                                "--out", "p/q"]


def test_continue_command_with_equals_forms_and_a_default_folder():
    argv = ["profile", "my config.yaml", "--seeds=3", "--out=old", "--json"]
    cmd = continue_command(argv, "old", sets={"profile.probe_budget": 2.7})
    assert shlex.split(cmd) == ["rlbatch", "profile", "my config.yaml", "--json", "--set",
                                "profile.probe_budget=2.7", "--out", "old"]
    # the folder the profile chose is made explicit, so the command works from anywhere
    assert shlex.split(continue_command(["profile"], "profiles/quick")) == \
        ["rlbatch", "profile", "--out", "profiles/quick"]


def _plan(need, ratio, detect):
    return {"sequences_per_step": 256, "seeds_per_side_needed": need, "time_ratio": ratio,
            "detectable_time_ratio": detect}


def test_next_seeds_follows_the_plan():
    ref = {"seeds": 2}
    assert next_seeds([], ref) is None
    assert next_seeds([_plan(6, 0.7, 0.5), _plan(4, 0.6, 0.5)], ref) == 6
    # nothing resolvable: more seeds would not settle it
    assert next_seeds([_plan(None, 0.99, 0.6)], ref) is None
    # no estimate of the spread yet: one more seed than the reference has
    assert next_seeds([_plan(None, None, None)], ref) == 3


def test_the_command_line_is_the_one_main_was_given(capsys):
    import pytest

    from rlbatch.cli import common
    from rlbatch.cli.main import main

    with pytest.raises(SystemExit):
        main(["config", "presets", "--help"])
    capsys.readouterr()
    assert common.INVOKED == ["config", "presets", "--help"]  # not pytest's own argv


def test_a_probe_pick_is_named_as_something_to_try_not_a_verdict():
    """The probe strategy's pick rests on probes and one seed to the target against the
    baseline's: its line says to try it and what would show it, never "use"."""
    from rlbatch.cli.profile_cmds import probe_decision_line

    d = {"is_reference": False, "sequences_per_step": 256, "lr": 2e-4, "outcome": "indicated",
         "evidence": "probes + one seed to the target", "predicted_time_ratio": 0.7,
         "predicted_time_ratio_ci": [0.3, 1.6]}
    line = probe_decision_line(d)
    assert line.startswith("decision: try B=256 lr 0.0002 (indicated by one seed")
    assert "use B=" not in line and "--strategy full" in line
    keep = probe_decision_line({**d, "is_reference": True, "sequences_per_step": 128})
    assert keep.startswith("decision: keep the baseline B=128")


def test_a_challenger_follow_up_is_printed_as_a_seeds_command_naming_what_it_runs(
        capsys, monkeypatch):
    """profile.follow_up: challenger: the decision's `next_set` becomes `--seeds N` in the
    command to continue, and a line says the follow-up runs the baseline and the challenger
    only."""
    from rlbatch.cli import common
    from rlbatch.cli.profile_cmds import _labels, _next_command, _print_decision

    monkeypatch.setattr(common, "INVOKED", ["profile", "c.yaml", "--out", "p"])
    doc = {"decision": {"next_set": {"profile.seeds": 5},
                        "follow_up": {"configs": ["grpo-B256"], "seeds": 5}},
           "analysis": {"recommendation": {"next_seeds": 7}}, "strategy": "full"}
    assert shlex.split(_next_command(doc, "p")) == ["rlbatch", "profile", "c.yaml", "--seeds",
                                                    "5", "--out", "p"]
    doc.update(cost={"total_s": 1.0}, problem="x", analysis=None)
    _print_decision(doc, "p", as_json=False)
    out = capsys.readouterr().out
    assert "the follow-up runs 5 seeds of the baseline and of grpo-B256 only" in out
    assert out.strip().endswith("rlbatch profile c.yaml --seeds 5 --out p")
    named = {"analysis": {"configs": [{"config": "grpo-B256", "sequences_per_step": 256,
                                       "lr": 1.41e-4, "lr_scaling": "sqrt"}]}}
    assert _labels(named, ["grpo-B256", "other"]) == ["B256 lr0.000141", "other"]
