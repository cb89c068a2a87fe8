"""`rlbatch profile` with `profile.strategy: probe`: the decision from short probes.

The full procedure (procedure.py) runs every candidate towards the target; this one spends
a fraction of that (docs/design.md, Method, "Probes"). Phases: the decode sweep; the
baseline at (B0, eta0), one seed to the target (its N* sets every probe's length); probe
rounds (a second baseline seed and one seed of each sqrt-scaled candidate, stopped at
`profile.probe_fraction` x N*_base samples, predicted by analysis/prediction.py, then
dropped or extended by spending.py); the confirmation of the predicted winner to the target;
and `profile.json` with the decision, every round, the analysis of all runs and the cost.
All of it within `profile.probe_budget` x T_base training seconds. Resumable like the full
procedure. Stop codes, the budget rules and what profile.json holds: docs/design.md,
"Module notes".
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from rlbatch.analysis.crossing import run_result
from rlbatch.analysis.prediction import BaselineCurves, across_probes, predict
from rlbatch.analysis.runs import frames_from_runs
from rlbatch.core.config import Config
from rlbatch.core.runlog import STOP_FILE, Run, atomic_write_json, read_run
from rlbatch.profile.driver import (
    Driver,
    Journal,
    Progress,
    analyze_trials,
    baseline_times,
    profile_cost,
    resume_advice,
    start_profile,
    target_of,
    trial_status,
    trial_warnings,
)
from rlbatch.profile.procedure import (
    baseline_evidence,
    candidate_eval_every,
    early_stop_reason,
    require_evaluations,
)
from rlbatch.profile.spending import Candidate, Plan, fit_budget, plan_next
from rlbatch.profile.trials import Trial, plan_trials

PROBE_CODE = "probe"
BUDGET_CODE = "profile_budget"
GRID_SEEDS = 3  # the exhaustive grid the cost is compared with: every configuration, 3 seeds


def probe_stop_reason(st: dict, limit: int) -> str | None:
    """Stop a probe once it has run `limit` samples (unless it already reached the target)."""
    if st["target"].get("reached") or st["samples"] < limit:
        return None
    return f"{PROBE_CODE}: {st['samples']:,} samples, the probe's length {limit:,}"


def budget_due(train_s: float, allowance_s: float, step_s: float) -> bool:
    """Whether a confirmation at `train_s` must be asked to stop to end within `allowance_s`,
    what the profile's budget leaves it: a stop asked after one step takes effect after the
    next, which is under way by then, so it is due once two more steps (`step_s` each, the
    longest its probe took) would reach the allowance."""
    return train_s + 2 * step_s >= allowance_s


def budget_stop_reason(st: dict, allowance_s: float, step_s: float = 0.0) -> str | None:
    """Stop a confirmation when `budget_due` (unless it already reached the target)."""
    if st["target"].get("reached") or not budget_due(st["train_s"], allowance_s, step_s):
        return None
    return (f"{BUDGET_CODE}: {st['train_s']:.1f} training seconds, all that "
            f"profile.probe_budget leaves this confirmation")


def longest_step(run: Run, skip_steps: int = 1) -> float:
    """The longest step's training seconds after the first `skip_steps` (warm-up), or the
    longest of all when there are no others: what the next step may take."""
    secs = step_increments(run)[1]
    rest = secs[skip_steps:] if len(secs) > skip_steps else secs
    return float(rest.max()) if len(rest) else 0.0


def reopen(trial: Trial) -> None:
    """Let a stopped probe continue: its STOP file goes, and `rlbatch train --resume` then
    continues it from its last checkpoint (runstate.open_run)."""
    (trial.run_dir() / STOP_FILE).unlink(missing_ok=True)


def curve_of(run: Run, metric: str) -> tuple[np.ndarray, np.ndarray]:
    rows = [(r.get("samples"), r.get(metric)) for r in run.evals]
    rows = [(float(s), float(v)) for s, v in rows
            if isinstance(s, (int, float)) and isinstance(v, (int, float))]
    return np.array([s for s, _ in rows]), np.array([v for _, v in rows])


def step_increments(run: Run) -> tuple[np.ndarray, np.ndarray]:
    """Per-step (samples, training seconds) from the cumulative counters of steps.jsonl."""
    s = np.array([0.0] + [float(r["samples"]) for r in run.steps])
    t = np.array([0.0] + [float(r["train_s"]) for r in run.steps])
    return np.diff(s), np.diff(t)


def _measured(trial: Trial, cfg: Config) -> dict:
    frames = frames_from_runs([read_run(trial.run_dir())])
    d = str(trial.run_dir())
    return run_result(frames.run_steps(d), frames.run_evals(d), target_of(cfg))


class BaselineFailed(Exception):
    """A baseline trial failed: no prediction can be anchored (the profile's problem)."""


@dataclass
class _Probing:
    """What the phases of a probe profile share once the baseline has run."""

    cfg: Config
    journal: Journal
    driver: Driver
    decode: dict
    base: Trial
    base_probe: Trial  # the baseline's second seed, probed like a candidate
    cands: list[Trial]
    family: list[Trial]  # the sqrt-scaled candidates (controls are reported only)
    limits: dict[str, int]  # each probe's length in samples
    cap: int
    t_base: float
    budget_s: float

    def spent(self) -> float:
        return (sum(trial_status(t)["train_s"] for t in self.driver.all)
                + (self.decode.get("seconds") or 0.0))


def run_probe_profile(cfg: Config, out: str | Path, executor, *,
                      progress: Progress | None = None, poll_s: float = 0.5) -> dict:
    """Phases: set-up and decode sweep, baseline, probe rounds (with extensions),
    confirmation of the predicted winner, decision (module docstring)."""
    session = start_profile(cfg, out, executor, progress, poll_s, strategy="probe")
    out, journal, decode, driver = session.out, session.journal, session.decode, session.driver
    c = session.concurrency
    base = plan_trials(cfg, out / "runs", c, [cfg.seed], kinds=("baseline",))[0]
    driver.run([base])
    ev = baseline_evidence([base], cfg, driver.failed)
    require_evaluations(ev, cfg)
    if ev["problem"]:
        return _write(cfg, out, driver, decode, None, ev["problem"], [], {})
    pr = _plan_probes(cfg, out / "runs", c, ev, journal, driver, decode, base)
    try:
        rounds, plan, preds = _probe_rounds(pr)
    except BaselineFailed as exc:
        return _write(cfg, out, driver, decode, None, str(exc), [], {})
    cut_name = None  # the confirmation the budget stopped, if any
    if plan.confirm:
        plan, cut_name, enough = _confirm(pr, plan, preds, rounds)
    decision = _decision(cfg, base, pr.family, plan, preds, ev, c, cut=cut_name)
    if cut_name is not None:
        decision["next_set"] = {"profile.probe_budget": math.ceil(enough * 10) / 10}
        decision["next"] = (f"re-run the same command with a larger profile.probe_budget, "
                            f"at least {math.ceil(enough * 10) / 10:g} (what lets this "
                            f"confirmation alone run to the baseline's time; longer probes "
                            f"of the others may take some of it): it continues from these "
                            f"runs, the stopped confirmation of {cut_name} read as a longer "
                            f"probe")
    return _write(cfg, out, driver, decode, decision, None, rounds, preds, base=base)


def _plan_probes(cfg: Config, runs: Path, c: int, ev: dict, journal: Journal, driver: Driver,
                 decode: dict, base: Trial) -> _Probing:
    """The probes and their first length, from the baseline's N* and time to target."""
    prof = cfg.profile
    nstar = ev["median_nstar"]
    every = candidate_eval_every(cfg, nstar)
    first = max(1, int(prof.probe_fraction * nstar))
    cap = max(first, int(prof.probe_max_fraction * nstar))
    base_probe = plan_trials(cfg, runs, c, [cfg.seed + 1], kinds=("baseline",))[0]
    kinds = ("sqrt", "control") if prof.probe_control else ("sqrt",)
    cands = plan_trials(cfg, runs, c, [cfg.seed], kinds=kinds, eval_every=every)
    family = [t for t in cands if t.kind == "sqrt"]
    limits = {t.name: first for t in [base_probe, *cands]}
    t_base = ev["median_time"]
    budget_s = math.inf if prof.probe_budget is None else prof.probe_budget * t_base
    journal.log("probing", nstar_base=nstar, first=first, cap=cap, eval_every=every,
                budget_s=None if budget_s == math.inf else budget_s)
    return _Probing(cfg, journal, driver, decode, base, base_probe, cands, family, limits,
                    cap, t_base, budget_s)


def _probe_rounds(pr: _Probing) -> tuple[list[dict], Plan, dict]:
    """Run the probes to their lengths, predict, and extend what spending extends (within the
    budget) until nothing is extended: the rounds, the last plan and its predictions."""
    rounds: list[dict] = []
    dropped: set[str] = set()
    while True:
        todo = [t for t in [pr.base_probe, *pr.cands] if t.name not in dropped]
        for t in todo:
            if trial_status(t)["samples"] < pr.limits[t.name]:
                reopen(t)
        pr.driver.run(todo, lambda st: probe_stop_reason(st, pr.limits[st["trial"]]))
        if pr.base_probe.name in pr.driver.failed:
            why = pr.driver.failed[pr.base_probe.name]
            raise BaselineFailed(f"the baseline's probe {pr.base_probe.name} failed ({why}); "
                                 + resume_advice(why, pr.base_probe, "it"))
        dropped |= set(pr.driver.failed)  # a failed probe is left out, named in the trials
        preds = _predictions(pr.cfg, pr.base, pr.base_probe,
                             [t for t in pr.cands if t.name not in pr.driver.failed])
        live = [Candidate(t.name, st["samples"], preds[t.name], train_s=st["train_s"])
                for t in pr.family if t.name not in dropped for st in [trial_status(t)]]
        plan = plan_next(live, cap=pr.cap)
        refused: dict = {}
        if plan.extend and pr.budget_s < math.inf:
            granted, refused = fit_budget(plan, live, left_s=pr.budget_s - pr.spent(),
                                          base_time=pr.t_base)
            # nothing fits: settle on the probes as they stand (no more extensions)
            plan = replace(plan, extend=granted) if granted else \
                plan_next(live, cap=0)
        rounds.append(_round(plan, preds, pr.limits, refused=refused))
        pr.journal.log("spending", **rounds[-1]["plan"])
        dropped |= set(plan.drop)
        if not plan.extend:
            return rounds, plan, preds
        pr.limits.update(plan.extend)


def _confirm(pr: _Probing, plan: Plan, preds: dict,
             rounds: list[dict]) -> tuple[Plan, str | None, float | None]:
    """Continue the predicted winner's probe to the target (or until it cannot win, or the
    budget ends) and settle the outcome: the final plan (its round appended to `rounds`),
    the winner's name when the budget cut it, and then the budget that would settle it."""
    t_base = pr.t_base
    winner = next(t for t in pr.family if t.name == plan.confirm)
    probe_s = trial_status(winner)["train_s"]
    allowance = pr.budget_s - (pr.spent() - probe_s)
    step_s = longest_step(read_run(winner.run_dir()))
    started = not budget_due(probe_s, allowance, step_s)
    if started:
        reopen(winner)
        pr.journal.log("confirming", trial=winner.name,
                       allowance_s=None if allowance == math.inf else allowance)
        # stopped (`cannot_win`) once past the baseline's time without the target: its
        # ratio is then above 1 whatever follows, and the outcome (`not_confirmed`) is
        # settled; or stopped where the budget ends (`over_budget`: nothing measured)
        pr.driver.run([winner], lambda st: early_stop_reason(st, t_base, math.inf)
                      or budget_stop_reason(st, allowance, step_s))
    t_win, st = _measured(winner, pr.cfg)["time_to_target"], trial_status(winner)
    cut = t_win is None and (not started or st["stop_code"] == BUDGET_CODE)
    enough = None
    if cut:
        # what would settle it: the confirmation runs at most to the baseline's time
        enough = (pr.spent() - st["train_s"] + t_base) / t_base
    ratio = t_win / t_base if t_win is not None else float("inf")
    plan = plan_next([Candidate(winner.name, st["samples"], preds[winner.name],
                                measured_ratio=None if cut else ratio,
                                over_budget=cut)], cap=pr.cap)
    # without a crossing, the training seconds it ran bound its ratio from below
    at_least = {} if t_win is not None or cut else {winner.name: st["train_s"] / t_base}
    rounds.append(_round(plan, preds, pr.limits, measured={} if cut else {winner.name: ratio},
                         at_least=at_least,
                         budget_cut={winner.name: {"samples": st["samples"],
                                                   "train_s": st["train_s"]}}
                         if cut else None))
    pr.journal.log("spending", **rounds[-1]["plan"])
    return plan, winner.name if cut else None, enough


def _predictions(cfg: Config, base: Trial, base_probe: Trial, cands: list[Trial]) -> dict:
    metric = cfg.target.metric
    b_run, p_run = read_run(base.run_dir()), read_run(base_probe.run_dir())
    measured = _measured(base, cfg)
    curves = BaselineCurves([curve_of(b_run, metric), curve_of(p_run, metric)],
                            [measured["samples_to_target"]])
    out = {}
    for t in cands:
        run = read_run(t.run_dir())
        out[t.name] = predict(curves, curve_of(run, metric), step_increments(run),
                              base_steps=step_increments(b_run), margin=cfg.profile.margin)
        out[t.name].update(kind=t.kind, sequences_per_step=t.sequences_per_step,
                           lr=t.config.actor_lr, samples=trial_status(t)["samples"])
    alone = BaselineCurves([curve_of(b_run, metric)] * 2, [measured["samples_to_target"]])
    copy = predict(alone, curve_of(p_run, metric), step_increments(p_run),
                   base_steps=step_increments(b_run), margin=cfg.profile.margin)
    return across_probes(out, {base_probe.name: copy}, margin=cfg.profile.margin)


def _round(plan: Plan, preds: dict, limits: dict, measured: dict | None = None,
           at_least: dict | None = None, refused: dict | None = None,
           budget_cut: dict | None = None) -> dict:
    return {"plan": {"extend": plan.extend, "drop": plan.drop, "open": plan.open,
                     "confirm": plan.confirm, "outcome": plan.outcome, "winner": plan.winner,
                     "measured_ratio": measured or {},
                     "measured_ratio_at_least": at_least or {},
                     "refused_for_budget": refused or {},
                     "stopped_by_budget": budget_cut or {}},
            "predicted_ratio": {k: p["time_ratio"] for k, p in preds.items()},
            "limits": dict(limits)}


def _decision(cfg: Config, base: Trial, family: list[Trial], plan: Plan, preds: dict,
              ev: dict, concurrency: int, cut: str | None = None) -> dict:
    """The configuration to use and what the choice rests on."""
    chosen = next((t for t in family if t.name == plan.winner), base)
    pred = preds.get(chosen.name) if chosen is not base else None
    if cut:  # the baseline is kept, but the prediction that was not confirmed is shown
        pred = preds.get(cut)
    return {"trial": chosen.name, "is_reference": chosen is base,
            "prompts_per_step": chosen.prompts_per_step,
            "samples_per_prompt": cfg.batch.samples_per_prompt,
            "sequences_per_step": chosen.sequences_per_step, "lr": chosen.config.actor_lr,
            "generation_concurrency": concurrency, "outcome": plan.outcome,
            "evidence": "probes" + (" + one seed to the target" if pred and not cut else "")
            + (f"; the confirmation of {cut} was stopped by profile.probe_budget"
               if cut else ""),
            "unconfirmed": cut,
            "predicted_time_ratio": pred["time_ratio"] if pred else None,
            "predicted_time_ratio_ci": pred["time_ratio_ci"] if pred else None,
            "baseline_time_to_target": ev["median_time"],
            "rule": "lowest predicted T / T_base among candidates aligned with the baseline "
                    "whose whole ratio interval is below 1 (failing that, the undecided one "
                    "with the lowest point ratio below 1), confirmed by running it to the "
                    "target (measured ratio < 1); otherwise keep the baseline"}


def _grid_cost(trials: list[dict], preds: dict, base_time: float | None) -> float | None:
    """What every configuration to the target with GRID_SEEDS seeds would have cost: each
    configuration's measured time to target where it reached it, else its predicted one."""
    if base_time is None:
        return None
    per_config: dict[str, float] = {"base": base_time}
    for t in trials:
        if t["kind"] == "baseline":
            continue
        reached = t["target"].get("train_s") if t["target"].get("reached") else None
        pred = (preds.get(t["trial"]) or {}).get("time_ratio")
        guess = reached if reached is not None else (pred * base_time if pred else None)
        if guess is not None:
            per_config[t["trial"]] = guess
    return GRID_SEEDS * sum(per_config.values())


def _write(cfg: Config, out: Path, driver: Driver, decode: dict, decision: dict | None,
           problem: str | None, rounds: list[dict], preds: dict, base: Trial | None = None
           ) -> dict:
    trials = [trial_status(t) for t in driver.all]
    result = (analyze_trials(cfg, out, base, driver.all, failed=driver.failed)
              if base is not None else None)
    cost = profile_cost(trials, decode, result)
    grid = _grid_cost(trials, preds, cost["baseline_time_to_target_s"])
    cost.update(grid_estimate_s=grid,
                fraction_of_grid=cost["total_s"] / grid if grid else None)
    base_times = baseline_times(trials)
    doc = {"config": cfg.name, "strategy": "probe", "target": target_of(cfg).as_dict(),
           "problem": problem, "decision": decision, "decode": decode, "trials": trials,
           "failed_trials": driver.failed,
           "trial_warnings": trial_warnings(driver.all, driver.failed), "predictions": preds,
           "rounds": rounds, "cost": cost, "analysis": result,
           "baseline_times": base_times,
           "baseline_time_median": statistics.median(base_times) if base_times else None}
    atomic_write_json(out / "profile.json", doc)
    driver.journal.log("profile_finished", decision=None if decision is None
                       else decision["trial"])
    return doc
