"""Replay the probe strategy on an exhaustive grid's recorded runs: the decision, its cost
and its prediction errors under given probe settings, without training anything.

Takes a profile directory whose runs went to the target (`rlbatch profile --seeds 3 --set
profile.early_stop=false --set profile.confirm_seeds=0`). It plays `profile.strategy: probe`
round by round with the real predictor (`analysis.prediction.predict`) and the real spending
rule (`profile.spending.plan_next`), on the recorded runs cut where a probe would stop:

- the reference configuration's seed 0 is the baseline run to the target; its seed 1 is the
  second baseline seed, a probe;
- seed 0 of every sqrt-scaled configuration (and of the fixed-LR control with `--control`)
  is a candidate's probe: its steps and evaluations up to the first step at or past the
  probe's length (a probe stops there, profile/probing.py);
- a confirmed winner's measured ratio is its seed-0 time to target over the baseline's.

Cost: training seconds at each cut plus the baseline's time to target, a confirmation's (to
the target, or stopped as `cannot_win` past the baseline's time, or where `--budgets` ends
it) and the grid's own decode sweep (its profile.json `decode.seconds`), as a multiple of
the baseline's time to target. Under a budget (`profile.probe_budget`), extensions are
granted by `spending.fit_budget` as in the profile. The grid's own decision and its
3-seed medians are the truth it is compared with; the replay's runs are seeds of that same
grid, so agreement is measured in-sample (the real probe profile's runs are fresh seeds).
Prints one block per setting and one JSON line.

    .venv/bin/python bench/probe_replay.py /tmp/p14/quick-grid --fractions 0.15,0.25 \\
        --extend promising,undecided --budgets 2,none

With a grid wider than the profile (the study's 6-configuration grids), `--batches` keeps
the candidates the profile would probe and `--truth` takes `rlbatch analyze --json` of the
same subset of runs, whose decision is then the one compared with.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from rlbatch.analysis.prediction import BaselineCurves, predict
from rlbatch.core.runlog import read_run
from rlbatch.profile.probing import budget_due, curve_of, longest_step, step_increments
from rlbatch.profile.spending import Candidate, fit_budget, plan_next

METRIC = "eval/accuracy"


def confirmation_end(run, t_win: float | None, t_base: float,
                     allowance: float = math.inf, step_s: float = 0.0) -> tuple[float, str]:
    """Training seconds at which a confirmation ends (profile/probing.py), and why: at the
    target if it gets there before a stop is asked; otherwise a stop asked at the first step
    past the baseline's time (`cannot_win`) or at the first step from which two more
    (`step_s` each, the longest step of its probe) would reach what the profile's budget
    leaves it (`profile_budget`), whichever comes first, takes effect at the next step (as the real
    trainer honours a STOP file); or the end of its own budget."""
    ts = [float(r["train_s"]) for r in run.steps]
    past = next((i for i, s in enumerate(ts) if s > t_base), None)
    spent = next((i for i, s in enumerate(ts) if budget_due(s, allowance, step_s)), None)
    asks = [(i, why) for i, why in ((past, "cannot_win"), (spent, "profile_budget"))
            if i is not None]
    if not asks:
        return (t_win, "target") if t_win is not None else (ts[-1], "end")
    i, why = min(asks)
    if t_win is not None and t_win <= ts[i]:
        return t_win, "target"
    end = ts[min(i + 1, len(ts) - 1)]
    if t_win is not None and t_win <= end:
        return t_win, "target"
    return end, why


def cut_run(run, limit: float):
    """The run as a probe of `limit` samples would have left it (the run itself when it
    reached the target first), and the training seconds spent."""
    steps = []
    for r in run.steps:
        steps.append(r)
        if r["samples"] >= limit:
            break
    last = steps[-1]["samples"]
    evals = [e for e in run.evals if e["samples"] <= last]
    return SimpleNamespace(steps=steps, evals=evals), steps[-1]["train_s"]


def truth_analysis(doc: dict) -> tuple[dict, dict]:
    """The analysis the replay is judged against (`doc["truth"]`, an `rlbatch analyze --json`
    of a subset of the grid's runs, when given; else the grid's own) and its reference."""
    an = doc.get("truth") or doc["analysis"]
    return an, next(c for c in an["configs"] if c["config"] == an["reference"]["config"])


def grid_truth(doc: dict) -> tuple[dict, str, str]:
    """Per B-and-LR configuration its 3-seed median T and T / T_ref; the chosen configuration
    and the reference of the analysis judged against."""
    an, ref_c = truth_analysis(doc)
    ref, t_ref = ref_c["config"], ref_c["time_to_target"]
    truth = {}
    for c in an["configs"]:
        t, n, q = c["time_to_target"], c["samples_to_target"], c["throughput"]
        truth[(c["sequences_per_step"], round(c["lr"], 12))] = {
            "config": c["config"], "T": t, "ratio": None if t is None or not t_ref else t / t_ref,
            "r": None if n is None else n / ref_c["samples_to_target"],
            "q_ratio": None if not q else ref_c["throughput"] / q}
    choice = doc["truth"]["recommendation"]["config"] if doc.get("truth") \
        else doc["decision"]["config"]
    return truth, choice, ref


def replay(doc: dict, fraction: float, max_fraction: float, extend: str, control: bool,
           batches: set[int] | None = None, budget: float | None = None) -> dict:
    by = {}
    for t in doc["trials"]:
        by[(t["kind"], t["B"], t["seed"])] = t
    base_t = by[("baseline", min(t["B"] for t in doc["trials"] if t["kind"] == "baseline"), 0)]
    base_run = read_run(base_t["run_dir"])
    an_runs = {r["run"]: r for c in doc["analysis"]["configs"] for r in c["runs"]}
    b_res = an_runs[base_t["run_dir"]]
    nstar, t_base = b_res["samples_to_target"], b_res["time_to_target"]
    sweep_s = float((doc.get("decode") or {}).get("seconds") or 0.0)
    budget_s = math.inf if budget is None else budget * t_base
    first = max(1, int(fraction * nstar))
    cap = max(first, int(max_fraction * nstar))
    kinds = ("sqrt", "control") if control else ("sqrt",)
    cands = {t["trial"]: t for t in doc["trials"] if t["kind"] in kinds and t["seed"] == 0
             and (batches is None or t["B"] in batches)}
    family = [n for n, t in cands.items() if t["kind"] == "sqrt"]
    base_probe = by[("baseline", base_t["B"], 1)]
    limits = {n: first for n in [base_probe["trial"], *cands]}
    dropped: set[str] = set()
    runs = {n: read_run(t["run_dir"]) for n, t in cands.items()}
    runs[base_probe["trial"]] = read_run(base_probe["run_dir"])
    rounds = []
    while True:
        cut = {n: cut_run(runs[n], limits[n]) for n in limits}
        curves = BaselineCurves([curve_of(base_run, METRIC),
                                 curve_of(cut[base_probe["trial"]][0], METRIC)], [nstar])
        preds = {n: predict(curves, curve_of(cut[n][0], METRIC), step_increments(cut[n][0]),
                            base_steps=step_increments(base_run)) for n in cands}
        live = [Candidate(n, int(cut[n][0].steps[-1]["samples"]), preds[n], train_s=cut[n][1])
                for n in family if n not in dropped]
        plan = plan_next(live, cap=cap, extend=extend)
        refused = {}
        if plan.extend and budget_s < math.inf:
            left = budget_s - (t_base + sweep_s + sum(c[1] for c in cut.values()))
            granted, refused = fit_budget(plan, live, left_s=left, base_time=t_base)
            plan = replace(plan, extend=granted) if granted else \
                plan_next(live, cap=0, extend=extend)
        rounds.append({"limits": dict(limits), "extend": plan.extend, "drop": list(plan.drop),
                       "refused": list(refused), "confirm": plan.confirm,
                       "outcome": plan.outcome})
        dropped |= set(plan.drop)
        if not plan.extend:
            break
        limits.update(plan.extend)
    spent = t_base + sweep_s + sum(c[1] for c in cut.values())
    chosen = None
    if plan.confirm:
        res = an_runs[cands[plan.confirm]["run_dir"]]
        t_win, probe_s = res["time_to_target"], cut[plan.confirm][1]
        allowance = budget_s - (spent - probe_s)
        step_s = longest_step(cut[plan.confirm][0])
        if not budget_due(probe_s, allowance, step_s):
            # the confirmation continues the probe: to the target, or until it cannot win
            # or the budget ends
            end, why = confirmation_end(runs[plan.confirm], t_win, t_base, allowance, step_s)
            spent += end - probe_s
        else:
            why = "profile_budget"  # not started: the budget is spent
        ratio = t_win / t_base if why == "target" else float("inf")
        cut_short = why == "profile_budget"
        plan = plan_next([Candidate(plan.confirm, 0, preds[plan.confirm],
                                    measured_ratio=None if cut_short else ratio,
                                    over_budget=cut_short)], cap=cap)
        rounds.append({"confirmed_ratio": None if cut_short else ratio, "ended": why,
                       "outcome": plan.outcome})
        chosen = plan.winner
    truth, grid_choice, ref = grid_truth(doc)
    errors = []
    for n, p in preds.items():
        t = cands[n]
        real = truth.get((t["B"], round(t["lr"], 12)))
        if not real or real["T"] is None or p["time_to_target"] is None:
            continue
        errors.append({"trial": n, "B": t["B"], "kind": t["kind"],
                       "predicted_ratio": p["time_ratio"], "measured_ratio": real["ratio"],
                       "predicted_T": p["time_to_target"], "measured_T": real["T"],
                       "predicted_r": p["ratio"], "measured_r": real["r"],
                       "predicted_q_ratio": p["base_throughput"] / p["throughput"],
                       "measured_q_ratio": real["q_ratio"],
                       "T_error": p["time_to_target"] / real["T"] - 1,
                       "ratio_error": p["time_ratio"] / real["ratio"] - 1,
                       # the same probe's q with r = 1 (alignment assumed, as the sqrt rule
                       # intends): what the fitted r adds, or costs, against it
                       "q_only_ratio_error": p["base_throughput"] / p["throughput"]
                       / real["ratio"] - 1,
                       "inside": p["time_ratio_ci"][0] is not None
                       and p["time_ratio_ci"][0] <= real["ratio"] <= p["time_ratio_ci"][1]})
    pick = ref if chosen is None else next(
        v["config"] for (b, lr), v in truth.items()
        if b == cands[chosen]["B"] and lr == round(cands[chosen]["lr"], 12))
    return {"fraction": fraction, "max_fraction": max_fraction, "extend": extend,
            "control": control, "budget": budget, "sweep_x_baseline": sweep_s / t_base,
            "decision": pick, "grid_decision": grid_choice,
            "same_decision": pick == grid_choice, "outcome": plan.outcome,
            "cost_x_baseline": spent / t_base, "rounds": rounds, "errors": errors,
            "median_abs_T_error": statistics.median(abs(e["T_error"]) for e in errors)
            if errors else None,
            "median_abs_ratio_error": statistics.median(abs(e["ratio_error"]) for e in errors)
            if errors else None,
            "median_abs_q_only_ratio_error": statistics.median(
                abs(e["q_only_ratio_error"]) for e in errors) if errors else None}


def one_seed_floor(doc: dict, batches: set[int] | None = None) -> dict:
    """The error a probe could not beat with one seed per candidate: each sqrt candidate's
    seed-s time to target over the baseline's seed-s time (every candidate run to the target
    with one seed, paired by seed), against the grid's 3-seed-median ratio."""
    an, ref = truth_analysis(doc)
    base = {r["seed"]: r["time_to_target"] for r in ref["runs"]}
    errors = []
    for c in an["configs"]:
        if c is ref or c["lr_scaling"] != "sqrt" or not c["time_to_target"] \
                or (batches is not None and c["sequences_per_step"] not in batches):
            continue
        measured = c["time_to_target"] / ref["time_to_target"]
        errors += [abs(r["time_to_target"] / base[r["seed"]] / measured - 1) for r in c["runs"]
                   if r["time_to_target"] and base.get(r["seed"])]
    return {"runs": len(errors),
            "median_abs_ratio_error": statistics.median(errors) if errors else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("grid", type=Path, help="profile directory of the exhaustive grid")
    ap.add_argument("--fractions", default="0.15",
                    help="first probe lengths to compare, x N*_base (profile.probe_fraction)")
    ap.add_argument("--max-fraction", type=float, default=0.6, help="probe cap, x N*_base")
    ap.add_argument("--extend", default="promising",
                    help="spending extension rules to compare (plan_next's extend)")
    ap.add_argument("--control", action="store_true", help="probe the fixed-LR control too")
    ap.add_argument("--budgets", default="2",
                    help="profile.probe_budget values to compare, x baseline T ('none': no limit)")
    ap.add_argument("--batches", default=None,
                    help="candidate B values to keep (default: every configuration of the grid)")
    ap.add_argument("--truth", type=Path, default=None,
                    help="`rlbatch analyze --json` of the runs to compare with (default: the "
                         "grid's own analysis); use it with --batches")
    args = ap.parse_args()
    doc = json.loads((args.grid / "profile.json").read_text())
    if args.truth:
        doc["truth"] = json.loads(args.truth.read_text().strip().splitlines()[-1])
    keep = None if args.batches is None else {int(b) for b in args.batches.split(",")}
    out = []
    budgets = [None if b == "none" else float(b) for b in args.budgets.split(",")]
    settings = [(f, rule, b) for f in (float(x) for x in args.fractions.split(","))
                for rule in args.extend.split(",") for b in budgets]
    for f, rule, b in settings:
        r = replay(doc, f, args.max_fraction, rule, args.control, keep, budget=b)
        out.append(r)
        print(f"fraction {f} cap {args.max_fraction} extend {rule} budget {b}: decision "
              f"{r['decision']} (grid: {r['grid_decision']}, same: {r['same_decision']}), "
              f"outcome {r['outcome']}, cost {r['cost_x_baseline']:.2f}x baseline T "
              f"(decode sweep {r['sweep_x_baseline']:.2f}x of it)")
        for e in r["errors"]:
            print(f"    {e['trial']:>18} B={e['B']:<4} predicted T/T_ref "
                  f"{e['predicted_ratio']:.2f} measured {e['measured_ratio']:.2f} "
                  f"(error {e['ratio_error']:+.0%}, inside interval: {e['inside']}); r "
                  f"{e['predicted_r']:.2f} against {e['measured_r']:.2f}, q_ref / q "
                  f"{e['predicted_q_ratio']:.2f} against {e['measured_q_ratio']:.2f}")
        if r["errors"]:
            print(f"    median |T error| {r['median_abs_T_error']:.0%}, median |ratio "
                  f"error| {r['median_abs_ratio_error']:.0%}; with r = 1 (q alone) "
                  f"{r['median_abs_q_only_ratio_error']:.0%}")
    floor = one_seed_floor(doc, keep)
    if floor["runs"]:
        print(f"one seed of each candidate run to the target (paired with the baseline's seed):"
              f" median |ratio error| {floor['median_abs_ratio_error']:.0%} against the 3-seed "
              f"medians, over {floor['runs']} runs")
    print(json.dumps({"bench": "probe_replay", "grid": str(args.grid), "one_seed_floor": floor,
                      "runs": [{k: v for k, v in r.items() if k != "rounds"} for r in out]},
                     default=lambda x: float(x) if isinstance(x, np.floating) else str(x)))


if __name__ == "__main__":
    main()
