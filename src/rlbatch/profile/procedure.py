"""`rlbatch profile`: the "align, then accelerate" procedure as one resumable command.

Order (docs/design.md, Method): the decode-concurrency sweep (`decode.json`: the plateau C
that fits the memory budget); the baseline at (B0, eta0) with `profile.seeds` +
`profile.confirm_seeds` seeds, refused unless enough evaluations resolve its N*; screening
of each sqrt-scaled candidate and the fixed-LR control at 2 x B0, with early stops
(`no_crossing`, `cannot_win`); confirmation seeds for the challenger; then the analysis (the
function `rlbatch analyze` calls, so both give the same decision) and `profile.json` with
the decision, its evidence and the profiling cost. The state is the run directories plus
`journal.jsonl`: re-running the same command skips finished trials and resumes the others
from their checkpoints. The rules of each phase: docs/design.md, "Module notes".
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

import yaml

from rlbatch.core.config import Config
from rlbatch.core.errors import UserError
from rlbatch.core.runlog import atomic_write_json
from rlbatch.profile import budget
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
    trial_done,
    trial_status,
    trial_warnings,
)
from rlbatch.profile.trials import Trial, baseline_prompts, plan_trials


def early_stop_reason(st: dict, base_median_time: float, nstar_limit: float,
                      why: tuple[str, str] | None = None) -> str | None:
    """Why a running trial should stop ("<code>: <detail>"), or None. `st` is its status row
    (samples, train_s, target.reached). Codes: `no_crossing` (past `nstar_limit` samples
    without a crossing), `cannot_win` (past `base_median_time` training seconds without a
    crossing); `why` names the two limits in words (default: the `median` rule's, exp(margin)
    x the baseline's largest N* and its median time to target). Baseline trials are never
    stopped: every comparison is anchored on them."""
    if st.get("kind") == "baseline" or st["target"].get("reached"):
        return None
    n_why, t_why = why or ("exp(margin) x the baseline's largest N* =",
                           "the baseline's median time to target")
    if st["samples"] >= nstar_limit:
        return (f"no_crossing: no crossing by {st['samples']:,} samples, beyond {n_why} "
                f"{nstar_limit:,.0f}")
    if st["train_s"] > base_median_time:
        return (f"cannot_win: {st['train_s']:.1f} training seconds without a crossing, beyond "
                f"{t_why} {base_median_time:.1f} s")
    return None


def stop_limits(ev: dict, prof) -> tuple[float, float, tuple[str, str] | None]:
    """(time limit, samples limit, their words) of the screening's early stops.

    `median`: the baseline's median T, and exp(margin) x its largest N* (not within a
    budget, which stops by futility: budget.py).
    `futility`: a one-sided test with error `futility_alpha` per run. If the candidate's
    true T were the baseline's / (1 + smallest_effect), one of its runs would have log T
    ~ N(mean log T_base - log(1 + effect), s^2 (1 + 1/n)) around the baseline's n-seed
    mean, s the run-to-run sd (the baseline's, at least `futility_sd`): it is stopped past
    the (1 - alpha) quantile of that. Likewise in samples at the edge of alignment, N*
    ratio exp(margin)."""
    # within a budget the first look has one baseline seed: its time alone would stop every
    # candidate that is not faster than that one draw, so the budget stops by futility
    if prof.early_stop_rule == "median" and not budget.budgeted(prof):
        return ev["median_time"], ev["max_nstar"] * math.exp(prof.margin), None
    z = statistics.NormalDist().inv_cdf(1 - prof.futility_alpha)
    lt, ln = ev["log_times"], ev["log_nstars"]
    n = len(lt)
    widen = math.sqrt(1 + 1 / n)
    s_t = max(prof.futility_sd, statistics.stdev(lt) if n > 1 else 0.0)
    s_n = max(prof.futility_sd, statistics.stdev(ln) if n > 1 else 0.0)
    t_lim = math.exp(statistics.fmean(lt) - math.log1p(prof.smallest_effect) + z * s_t * widen)
    n_lim = math.exp(statistics.fmean(ln) + prof.margin + z * s_n * widen)
    conf = f"{1 - prof.futility_alpha:.0%}"
    return t_lim, n_lim, (
        (f"where a configuration needing exp(margin) x the baseline's N* crosses in {conf} of "
        "runs:"), (f"where a configuration {prof.smallest_effect:.0%} faster than the baseline "
        f"crosses in {conf} of runs:"))


def baseline_evidence(base: list[Trial], cfg: Config, failed: dict | None = None) -> dict:
    """N* and T of the baseline's runs from their logs: median T, largest N*, and the fewest
    evaluations before a crossing; `problem` when they cannot anchor a comparison. Only the
    runs that ended (`trial_done`) count; `failed`: the driver's failed trials and why."""
    from rlbatch.analysis.crossing import run_result
    from rlbatch.analysis.runs import frames_from_runs
    from rlbatch.core.runlog import read_run

    failed = failed or {}
    left_out = [t for t in base if not trial_done(t, failed)]
    base = [t for t in base if t not in left_out]
    if not base:
        first = left_out[0]
        why = failed.get(first.name) or trial_status(first)["failure"] or (
            f"no final status (status {trial_status(first)['status']})")
        return {"runs": 0, "reached": 0,
                "problem": f"every baseline trial failed (the first, {first.name}: {why}); "
                           + resume_advice(why, first)}
    frames = frames_from_runs([read_run(t.run_dir()) for t in base])
    res = [run_result(frames.run_steps(str(t.run_dir())), frames.run_evals(str(t.run_dir())),
                      target_of(cfg)) for t in base]
    crossed = [r for r in res if not r["censored"]]
    out = {"runs": len(res), "reached": len(crossed), "problem": None}
    if any(r["too_easy"] for r in res):
        first = min(r["first_evaluation_samples"] for r in res if r["too_easy"])
        out["problem"] = (f"target too easy: met by the first evaluation at {first:,.0f} "
                          "samples; raise the target (or target.gain) or evaluate more often")
        return out
    if 2 * len(crossed) <= len(res) and len(crossed) < len(res):
        out["problem"] = (f"the baseline reached the target in only {len(crossed)} of its "
                          f"{len(res)} seeds ({_short_advice(base, res)})")
        return out
    nstars = sorted(r["samples_to_target"] for r in crossed)
    evals = min(r["evaluations_before_target"] for r in crossed)
    out.update(median_time=statistics.median(r["time_to_target"] for r in crossed),
               median_nstar=statistics.median(nstars), max_nstar=nstars[-1],
               log_times=[math.log(r["time_to_target"]) for r in crossed],
               log_nstars=[math.log(x) for x in nstars],
               evaluations_before_target=evals)
    need = cfg.profile.min_evaluations
    if evals < need:
        # every seed, the earliest-crossing one included, gets `need` evaluations before N*
        out["dense_every"] = max(1, int(nstars[0] // (need + 1)))
    return out


def _short_advice(base: list[Trial], res: list[dict]) -> str:
    """What would let the baseline reach the target: a larger budget, unless a run that did
    not cross ended by its command's own step or epoch limit (stop_reason `ended_short`,
    backends/command/health.py), or diverged, which a larger budget does not move either;
    or a larger profile budget (--budget) where that stopped it."""
    censored = [(t, trial_status(t)) for t, r in zip(base, res, strict=True) if r["censored"]]
    diverged = [(t, st) for t, st in censored if st["status"] == "diverged"]
    if diverged:
        t, st = diverged[0]
        return (f"{t.name} diverged at {st['samples']:,} samples (a loss or gradient that is "
                "not finite): a larger budget does not change that; lower "
                "optimizer.reference_lr, or look at the run's warnings")
    spent = [t for t, st in censored if st["stop_code"] == "profile_budget"]
    if spent:
        return (f"{spent[0].name} was stopped by the profile's budget before the target: give "
                "--budget at least one baseline run's training time")
    short = [(t, st) for t, st in censored
             if str(st["stop_reason"] or "").startswith("ended_short")]
    if not short:
        return "raise budget.max_samples or lower the target"
    t, st = short[0]
    return (f"{t.name}'s command ended by its own step or epoch limit at {st['samples']:,} "
            f"samples, before budget.max_samples: a larger budget does not change that; "
            "raise the command's own step or epoch limit in command.argv, or lower the target")


def require_evaluations(ev: dict, cfg: Config) -> None:
    """Refuse a baseline whose N* was resolved by fewer than profile.min_evaluations
    evaluations, naming the cadence that resolves every seed's (`dense_every`)."""
    if ev.get("dense_every") is None:
        return
    every, need = ev["dense_every"], cfg.profile.min_evaluations
    raise UserError(
        f"eval.every_samples: the baseline's N* (median {ev['median_nstar']:,.0f} samples, "
        f"earliest {every * (need + 1):,.0f}) was resolved by only "
        f"{ev['evaluations_before_target']} evaluations (every {cfg.eval.every_samples:,} "
        f"samples); at least {need} are needed (profile.min_evaluations): set "
        f"eval.every_samples <= {every:,} (e.g. --set eval.every_samples={every}) and re-run")


def denser_baseline(cfg: Config, runs: Path, c: int, seeds: list[int], ev: dict,
                    driver: Driver, journal: Journal) -> tuple[list[Trial], dict] | None:
    """When the baseline's N* was resolved by too few evaluations: the same baseline seeds
    again at the cadence that resolves them (`dense_every`, at least one step). Evaluation
    does not touch training (its sampling is keyed apart from the rollouts'), so these runs
    learn exactly as the first ones did and cross where they did, now seen finely. None when
    the first cadence was enough; a UserError when even one evaluation per step is not."""
    if ev.get("dense_every") is None:
        return None
    step = baseline_prompts(cfg) * cfg.batch.samples_per_prompt
    if ev["dense_every"] < step or cfg.eval.every_samples <= step:
        raise UserError(
            f"target.gain: the baseline reached the target within "
            f"{ev['dense_every'] * (cfg.profile.min_evaluations + 1):,.0f} samples, fewer than "
            f"profile.min_evaluations ({cfg.profile.min_evaluations}) evaluations even at one "
            f"per step ({step:,} samples): raise the target")
    every = ev["dense_every"] // step * step
    base = plan_trials(cfg, runs, c, seeds, kinds=("baseline",), baseline_eval_every=every)
    journal.log("baseline_reevaluated", eval_every=every,
                evaluations_before_target=ev["evaluations_before_target"],
                trials=[t.name for t in base])
    driver.run(base)
    return base, baseline_evidence(base, cfg, driver.failed)


def candidate_eval_every(cfg: Config, median_nstar: float) -> int:
    """The candidates' evaluation interval: the configured one, or N*_base divided by
    profile.min_evaluations if smaller."""
    return max(1, min(cfg.eval.every_samples,
                      int(median_nstar // cfg.profile.min_evaluations)))


def challenger(result: dict) -> str | None:
    """The configuration to confirm against the baseline (analysis.selection.challenger)."""
    from rlbatch.analysis.selection import challenger as pick

    entries = result.get("configs", [])
    ref = next((e for e in entries if e["config"] == result["reference"]["config"]), None)
    best = pick(entries, ref) if ref is not None else None
    return best["config"] if best else None


def run_profile(cfg: Config, out: str | Path, executor, *, progress: Progress | None = None,
                poll_s: float = 0.5) -> dict:
    session = start_profile(cfg, out, executor, progress, poll_s)
    out, journal, decode, driver = session.out, session.journal, session.decode, session.driver
    prof, runs, c = cfg.profile, out / "runs", session.concurrency
    alpha = look_alpha(journal, prof)
    seeds = list(range(cfg.seed, cfg.seed + prof.seeds))
    # within a budget every seed is a look's own (budget.py): no confirmation seeds
    confirm = 0 if budget.budgeted(prof) else prof.confirm_seeds
    extra = list(range(cfg.seed + prof.seeds, cfg.seed + prof.seeds + confirm))
    guard = budget_guard(out, prof, decode)
    # the baseline's confirmation seeds run first: the early stops are then anchored on more
    # than one seed of it (its median T, its largest N*), at no extra cost
    base = baseline_trials(plan_trials(cfg, runs, c, seeds + extra, kinds=("baseline",)), out)
    driver.run(base, guard.stop, guard.admit)
    ev = baseline_evidence(base, cfg, driver.failed)
    if ev["problem"]:
        return _finish(cfg, out, driver, decode, None, ev["problem"])
    sparse = []
    if (dense := denser_baseline(cfg, runs, c, seeds + extra, ev, driver, journal)):
        sparse, (base, ev) = base, dense
        require_evaluations(ev, cfg)
    every = candidate_eval_every(cfg, ev["median_nstar"])
    journal.log("baseline_measured", median_time=ev["median_time"],
                max_nstar=ev["max_nstar"], candidate_eval_every=every)
    cands = plan_trials(cfg, runs, c, seeds, kinds=("sqrt", "control", "schedule"),
                        eval_every=every)
    if prof.follow_up != "all" and (closed := closed_configs(out, prof.follow_up)):
        skipped = [t.name for t in cands if label(t) in closed and not t.run_dir().exists()]
        cands = [t for t in cands if t.name not in skipped]
        journal.log("closed_configs_skipped", configs=sorted(closed), trials=skipped)
    first_forecast(cfg, journal, driver, ev, len(cands), len(extra))
    t_limit, n_limit, why = stop_limits(ev, prof)
    journal.log("stop_limits", rule=prof.early_stop_rule, time_s=t_limit, samples=n_limit)
    guard.limit = budget_limit(prof, base)

    def stopper(st: dict) -> str | None:
        spent = guard.stop(st)  # first: it keeps the budget's count of every running trial
        early = early_stop_reason(st, t_limit, n_limit, why) if prof.early_stop else None
        return early or spent

    driver.run(cands, stopper, guard.admit)
    decided = [t for t in driver.all if t not in sparse]  # the sparse baseline is superseded
    result = analyze_trials(cfg, out, _reference(base, driver.failed), decided, alpha,
                            driver.failed)
    chosen = challenger(result) if extra else None
    winner = next((t for t in cands if chosen is not None and _config_id(result, t) == chosen),
                  None)
    if winner is not None:
        confirm = [t for t in plan_trials(cfg, runs, c, extra, kinds=(winner.kind,),
                                          eval_every=every)
                   if t.name.rsplit("-s", 1)[0] == winner.name.rsplit("-s", 1)[0]]
        journal.log("confirming", challenger=chosen, trials=[t.name for t in confirm])
        driver.run(confirm, stopper, guard.admit)
        result = analyze_trials(cfg, out, _reference(base, driver.failed),
                                [t for t in driver.all if t not in sparse], alpha,
                                driver.failed)
    return _finish(cfg, out, driver, decode, result, result.get("problem"),
                   [t for t in driver.all if t not in sparse])


def look_alpha(journal: Journal, prof) -> float:
    """The decision's one-sided level at this look: the number of decisions this folder
    made before (each re-run that follows `next` is one more look at growing data). With
    profile.alpha_spending, look k spends alpha / 2^(k+1), so that every look together
    recommends a configuration that is not faster with probability at most alpha (a union
    bound, whatever the looks' dependence); otherwise every look tests at alpha."""
    from rlbatch.analysis.selection import DEFAULT_ALPHA

    look = sum(e.get("event") == "profile_finished" for e in journal.events())
    journal.log("look", index=look)
    return DEFAULT_ALPHA / 2 ** (look + 1) if prof.alpha_spending else DEFAULT_ALPHA


def first_forecast(cfg: Config, journal: Journal, driver: Driver, ev: dict, candidates: int,
                   confirm: int) -> None:
    """At the first look, once the baseline has run: the forecast (profile/forecast.py),
    in the journal and, for someone watching (a live profile, not a replay), on stderr."""
    from rlbatch.analysis.selection import DEFAULT_ALPHA
    from rlbatch.profile import forecast

    if any(e.get("event") == "profile_finished" for e in journal.events()):
        return
    prof = cfg.profile
    cap = None  # a sequential decision's cap, in baseline runs, forecast whole
    if prof.sequential and ev["log_times"]:
        unit = math.exp(statistics.median(ev["log_times"]))
        cap = prof.budget if prof.budget is not None else prof.budget_seconds / unit
    fc = forecast.forecast(baseline_runs=ev["runs"], candidates=candidates,
                           confirm=confirm if candidates else 0, log_times=ev["log_times"],
                           prior_sd=prof.futility_sd, alpha=DEFAULT_ALPHA,
                           max_slower=prof.budget_max_slower, budgeted=budget.budgeted(prof),
                           cap=cap, sure_within=prof.budget_sure_within)
    journal.log("forecast", **fc)
    if driver.progress is not None:
        for line in forecast.lines(fc):
            print(line, file=sys.stderr, flush=True)


def budget_limit(prof, base: list[Trial]) -> float | None:
    """The budget in seconds once the baseline has run: its unit as the profile's cost
    counts it, the median of the baseline's times to target."""
    if not budget.budgeted(prof):
        return None
    times = baseline_times([trial_status(t) for t in base])
    return budget.limit_s(prof, statistics.median(times) if times else None)


def budget_guard(out: Path, prof, decode: dict) -> budget.Guard:
    """The budget's hold on this look's trials (budget.Guard; no limit without a budget).
    It counts every run of the folder (earlier looks' included); its limit in baseline runs
    is from the previous look's baseline time to target (none at the first look: the
    baseline's first seeds always run, and set the unit)."""
    from rlbatch.core.runlog import read_json

    if not budget.budgeted(prof):
        return budget.Guard(None)
    base_time = (read_json(out / "profile.json").get("cost") or {}).get(
        "baseline_time_to_target_s")
    return budget.Guard(budget.limit_s(prof, base_time), out / "runs",
                        decode.get("seconds") or 0.0)


def label(trial: Trial) -> str:
    """A trial's configuration within the profile: its name without the seed (sqrt-P32)."""
    return trial.name.rsplit("-s", 1)[0]


def closed_configs(out: Path, mode: str = "open") -> set[str]:
    """Configurations (trial labels) the previous decision in this folder no longer needs.
    `open`: those neither open nor shown faster (rejected, ruled out by one seed, or outside
    the baseline's LR-scaling family, as the fixed-LR control); `challenger`: every one but
    the previous challenger (the open one with the lowest point T) and those shown faster.
    A follow-up with more seeds gives its new seeds to the baseline and the others only."""
    from rlbatch.core.runlog import read_json

    prev = read_json(out / "profile.json")
    rec = (prev.get("analysis") or {}).get("recommendation")
    if not rec:
        return set()
    within_budget = (prev.get("decision") or {}).get("budget") or {}
    if within_budget.get("challenger"):  # a budget's look: the configurations it runs
        keep = set(within_budget.get("look_configs") or [within_budget["challenger"]])
    elif mode == "challenger":
        keep = {challenger(prev["analysis"])} - {None}
    else:
        keep = {o["config"] for o in rec.get("open") or []}
    keep |= set(rec.get("shown_faster") or [])
    by_dir = {t["run_dir"]: t["trial"].rsplit("-s", 1)[0] for t in prev.get("trials") or []
              if t.get("kind") != "baseline"}
    closed = set()
    for e in prev["analysis"]["configs"]:
        if e["config"] not in keep:
            closed |= {by_dir[r["run"]] for r in e["runs"] if r["run"] in by_dir}
    return closed


def baseline_trials(base: list[Trial], out: Path) -> list[Trial]:
    """This look's baseline trials: all of `base`, unless the previous look in this folder,
    within a budget, gave its new seeds to two candidates and none to the baseline
    (budget.look_configs): then only those already started."""
    from rlbatch.core.runlog import read_json

    prev = read_json(out / "profile.json")
    if not ((prev.get("decision") or {}).get("budget") or {}).get("baseline_rests"):
        return base
    return [t for t in base if t.run_dir().exists()]


def challenger_follow_up(result: dict) -> dict:
    """profile.follow_up: challenger: when the decision is not_enough, the follow-up gives
    its seeds to the baseline and the challenger only, as many as the challenger's own plan
    asks for (`follow_up`, and `next_set` for the printed command); {} otherwise."""
    from rlbatch.analysis.selection import next_seeds

    rec = result["recommendation"]
    chosen = challenger(result)
    plan = [p for p in rec.get("plan") or [] if p["config"] == chosen]
    if rec["evidence"] != "not_enough" or not plan:
        return {}
    ref = next(e for e in result["configs"] if e["config"] == result["reference"]["config"])
    seeds = next_seeds(plan, ref)
    if seeds is None:
        return {}
    return {"follow_up": {"configs": [chosen], "seeds": seeds},
            "next_set": {"profile.seeds": seeds}}


def _reference(base: list[Trial], failed: dict) -> Trial:
    """The baseline run the analysis names as its reference: the first that ended
    (`trial_done`)."""
    return next((t for t in base if trial_done(t, failed)), base[0])


def _config_id(result: dict, trial: Trial) -> str | None:
    for entry in result.get("configs", []):
        if any(Path(r["run"]).name == trial.run_id for r in entry.get("runs", [])):
            return entry["config"]
    return None


def _finish(cfg: Config, out: Path, driver: Driver, decode: dict, result: dict | None,
            problem: str | None, decided: list[Trial] | None = None) -> dict:
    """profile.json: the decision, its evidence, the trials (those failed named with why),
    the warnings of the trials in the analysis (`trial_warnings`) and the cost."""
    trials = [trial_status(t) for t in driver.all]
    warned = trial_warnings(driver.all if decided is None else decided, driver.failed)
    cost = profile_cost(trials, decode, result)
    rec = (result or {}).get("recommendation")
    decision = None
    if rec:
        entry = next(e for e in result["configs"] if e["config"] == rec["config"])
        run_cfg = _read_run_config(entry)
        decision = {"prompts_per_step": run_cfg["batch"]["prompts_per_step"],
                    "samples_per_prompt": run_cfg["batch"]["samples_per_prompt"],
                    "batch_schedule": run_cfg["batch"].get("schedule"),
                    "max_staleness": run_cfg["rollout"].get("max_staleness", 0),
                    "sequences_per_step": rec["sequences_per_step"], "lr": rec["lr"],
                    "generation_concurrency": decode["chosen"] if decode.get(
                        "passed_to_command", True) else None, **rec}
    if decision is not None and cfg.profile.follow_up == "challenger":
        decision.update(challenger_follow_up(result))
    if decision is not None and budget.budgeted(cfg.profile):
        b = _budget_block(cfg, result, cost)
        decision.pop("follow_up", None)
        decision["budget"] = b
        decision["next_set"] = b["next_set"]
        if b["next_set"]:
            decision["follow_up"] = {"configs": b["look_configs"],
                                     "seeds": b["next_set"]["profile.seeds"]}
    if decision is not None:
        decision["trial_warnings"] = warned
    forecast = next((e for e in reversed(driver.journal.events())
                     if e.get("event") == "forecast"), None)
    doc = {"config": cfg.name, "target": target_of(cfg).as_dict(),
           "problem": problem, "decision": decision, "decode": decode, "trials": trials,
           "forecast": None if forecast is None else {k: v for k, v in forecast.items()
                                                      if k not in ("time", "event")},
           "failed_trials": driver.failed, "trial_warnings": warned, "cost": cost,
           "analysis": result}
    atomic_write_json(out / "profile.json", doc)
    driver.journal.log("profile_finished", decision=None if decision is None else rec["config"])
    return doc


def _budget_block(cfg: Config, result: dict, cost: dict) -> dict:
    """profile.json's `decision.budget` (budget.block); a sequential decision that goes on
    also forecasts its whole cost from the runs it has (`forecast_runs`, baseline runs:
    forecast.remaining_cost)."""
    from rlbatch.profile import forecast

    base_time = cost["baseline_time_to_target_s"]
    b = budget.block(result, cfg.profile, spent=cost["total_s"], base_time=base_time)
    if b["sequential"] and b["next_set"] and b["spent_runs"]:
        b["forecast_runs"] = forecast.remaining_cost(
            budget.pool(result), spent=b["spent_runs"], cap=b["limit_s"] / base_time,
            prior_sd=cfg.profile.futility_sd, sure_within=cfg.profile.budget_sure_within)
    return b


def _read_run_config(entry: dict) -> dict:
    run_dir = Path(entry["runs"][0]["run"])
    return yaml.safe_load((run_dir / "config.yaml").read_text())
