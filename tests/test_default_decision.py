"""What `rlbatch profile` and `rlbatch replay` run without flags: a sequential decision
capped at DEFAULT_BUDGET baseline runs (profile.default_sets; docs/analysis.md, "The
default decision"), the procedure the replays score; and its forecast, made whole."""

from __future__ import annotations

import pytest

from rlbatch.cli.profile_cmds import resolve_procedure
from rlbatch.core.errors import UserError
from rlbatch.profile import DEFAULT_BUDGET, forecast


def _resolve(*flags, sets=(), budget=None, sequential=False, follow=None):
    return resolve_procedure(None, "quick", [*sets, *flags], budget, sequential, follow)


def test_no_flags_is_a_sequential_decision_within_the_default_cap():
    cfg, follow, default = _resolve()
    assert (cfg.profile.budget, cfg.profile.sequential, follow, default) == (
        DEFAULT_BUDGET, True, 0, True)
    # --sequential alone is the same decision at the default cap
    cfg, _, default = _resolve(sequential=True)
    assert (cfg.profile.budget, cfg.profile.sequential, default) == (DEFAULT_BUDGET, True, True)


@pytest.mark.parametrize("how", ["follow", "budget", "set-budget", "probe"])
def test_a_procedure_the_command_names_is_run_as_named(how):
    """--follow N (N = 0: the first look alone), a budget from the flag or the config, and
    the probe strategy are not turned into the default decision."""
    kw = {"follow": {"follow": 0}, "budget": {"budget": "4"},
          "set-budget": {"sets": ["profile.budget=4"]},
          "probe": {"sets": ["profile.strategy=probe"]}}[how]
    cfg, follow, default = _resolve(**kw)
    assert not default and not cfg.profile.sequential
    assert cfg.profile.budget == {"budget": 4.0, "set-budget": 4.0}.get(how)
    assert follow == 0


def test_the_users_own_set_wins_over_the_default():
    cfg, _, default = _resolve(sets=["profile.sequential=false"])
    assert default and cfg.profile.budget == DEFAULT_BUDGET and not cfg.profile.sequential


def test_a_sequential_decision_with_the_decision_rules_looks_still_needs_a_cap():
    with pytest.raises(UserError, match="profile.sequential"):
        _resolve(sequential=True, follow=1)


def test_a_default_decision_continued_under_a_budget_stays_sequential(monkeypatch):
    """The command printed when the cap cannot pay for the next look carries --budget, which
    alone would not be sequential: --sequential is added unless the user gave it."""
    from rlbatch.cli import common, profile_cmds

    doc = {"decision": {"next_set": None, "budget": {
        "sequential": True, "next_look_budget_s": 130.0, "next_look_budget_runs": 13.04,
        "budget_seconds": None}}}
    monkeypatch.setattr(common, "INVOKED", ["profile", "--preset", "quick", "--out", "p"])
    assert profile_cmds._next_command(doc, "p") == (
        "rlbatch profile --preset quick --sequential --budget 13.1 --out p")
    doc["decision"]["budget"]["sequential"] = False
    assert profile_cmds._next_command(doc, "p") == (
        "rlbatch profile --preset quick --budget 13.1 --out p")


def test_the_sequential_forecast_is_a_median_cost_that_grows_with_the_spread():
    """decision_cost simulates the decision (profile/forecast.py): where runs hardly spread,
    the first look (one run of each, the candidates' stopped by the baseline's T) shows the
    fastest candidate faster, and it stops there once the baseline has two runs (with one,
    after one more run of the baseline and of that candidate, each candidate's T below
    the baseline's); where they spread as the banks' do, it takes more looks, and never
    costs more than its cap; repeatable for one seed."""
    kw = {"baseline_runs": 1, "candidates": 4, "cap": 12.0}
    first = 1 + 4 * forecast.candidate_cost(0)
    two = forecast.decision_cost(s=0.01, **{**kw, "baseline_runs": 2})
    assert two == pytest.approx(1 + first, abs=0.2)
    tight = forecast.decision_cost(s=0.01, **kw)
    assert first + 1 < tight < first + 2
    loose = forecast.decision_cost(s=0.35, **kw)
    assert tight + 3 < loose <= 12.0
    assert forecast.decision_cost(s=0.35, **kw) == loose
    assert forecast.decision_cost(s=0.35, **{**kw, "cap": 24.0}) > loose  # a larger cap pays
    # going on until the pick is 0.9 likely within 5% of its rivals costs more looks
    assert forecast.decision_cost(s=0.35, sure_within=0.9, **kw) > loose
    fc = forecast.forecast(baseline_runs=1, candidates=4, confirm=0, log_times=[0.0],
                           prior_sd=0.35, alpha=0.05, max_slower=0.25, budgeted=True, cap=12.0)
    assert fc["decide_runs"] == loose and fc["decide_most_runs"] == 12.0
    assert forecast.lines(fc)[0] == (f"forecast: this sequential decision costs about "
                                     f"{loose:.1f} baseline runs' time to target, at most 12 "
                                     "(its cap)")
    plain = forecast.forecast(baseline_runs=1, candidates=4, confirm=0, log_times=[0.0],
                              prior_sd=0.35, alpha=0.05, max_slower=0.25, budgeted=True)
    assert plain["decide_runs"] is None


def entry(config: str, crossed: list[float], stopped: tuple = ()) -> dict:
    """A pool entry (profile/budget.py): runs that crossed at `crossed`, runs stopped before
    the target at `stopped` (training seconds)."""
    runs = [{"censored": False, "time_to_target": t} for t in crossed]
    runs += [{"censored": True, "last_train_s": t} for t in stopped]
    return {"config": config, "runs": runs, "seeds": len(runs)}


def test_a_decision_that_goes_on_forecasts_its_whole_cost_from_its_runs():
    """remaining_cost (profile/forecast.py) after a first look: where the candidates' first
    runs came in well under the baseline's, the decision is forecast to end sooner than
    where every candidate was stopped at the baseline's time; both at least what was spent
    and at most the cap; a larger spread costs more; repeatable; None before the baseline
    has a run that crossed."""
    kw = {"spent": 4.0, "cap": 16.0, "prior_sd": 0.35}
    faster = [entry("b", [100.0]), entry("c", [66.0]), entry("d", [57.0]), entry("e", [76.0])]
    none = [entry("b", [100.0]), entry("c", [], (100.0,)), entry("d", [97.0]),
            entry("e", [], (100.0,))]
    soon, late = forecast.remaining_cost(faster, **kw), forecast.remaining_cost(none, **kw)
    assert 4.0 <= soon < late <= 16.0
    assert late > soon + 4
    assert forecast.remaining_cost(faster, **kw) == soon
    assert forecast.remaining_cost(faster, **{**kw, "prior_sd": 0.05}) < soon
    assert forecast.remaining_cost(faster, sure_within=0.9, **kw) > soon
    assert forecast.remaining_cost([entry("b", [], (100.0,)), faster[1]], **kw) is None
