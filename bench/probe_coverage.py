"""Coverage of the probe strategy's prediction intervals against runs to the target
(docs/analysis.md, "Probe predictions").

A probe profile predicts each candidate's T / T_base from one seed of the candidate cut at
`fraction` x N*_base, against the baseline's two seeds (one run to the target, one probe of
the same length), through analysis/prediction.py. This script replays that on recorded runs
that all went to the target:

- **A/A**: baseline, baseline probe and "candidate" are three different seeds of the same
  configuration, so the true N* ratio r and T ratio are exactly 1;
- **candidates** (with `--candidates`): each seed of each other configuration against two
  seeds of the baseline; the truth is that configuration's geometric-mean N* (and T) over
  all its recorded seeds divided by the baseline's, itself an estimate (its standard error
  is printed beside the coverage).

Each round predicts every probe of the round, so that the intervals across probes
(`prediction.across_probes`, what the profile prints) can be formed as the profile forms
them. Prints, per fraction, how often the nominal-90% intervals of r and of the T ratio hold
the truth, both the bootstrap ones of a single probe and those across probes, and the sd of
the log prediction errors; last, one JSON line.

  python bench/probe_coverage.py pc/base --candidates pc/cand \
      --target eval/accuracy=+0.20 --fractions 0.15,0.3,0.6 --draws 300

(pc/base and pc/cand: the committed no-saving bank's baseline and sqrt-rule candidates, as
docs/analysis.md, "Probe predictions", lays them out.)
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np

from rlbatch.analysis import prediction
from rlbatch.analysis.analyze import group_configs
from rlbatch.analysis.crossing import parse_target, per_run_records
from rlbatch.analysis.prediction import BaselineCurves, predict
from rlbatch.analysis.runs import load_runs
from rlbatch.core.runlog import read_run
from rlbatch.profile.probing import curve_of, step_increments


def _loaded(path: str, target) -> list[dict]:
    """Per configuration: its runs that reached the target, each with its curve and steps."""
    frames = load_runs(path.split(","))
    records = [r for r in per_run_records(frames, target) if not r["censored"]]
    out = []
    for g in group_configs(records):
        runs = []
        for r in g["runs"]:
            run = read_run(r["run"])
            runs.append({"nstar": r["samples_to_target"], "time": r["time_to_target"],
                         "curve": curve_of(run, target.metric), "steps": step_increments(run)})
        out.append({"config": g["config"], "runs": runs})
    return out


def _cut(run: dict, length: float) -> tuple:
    s, v = run["curve"]
    keep = s <= length
    smp, sec = run["steps"]
    steps_keep = np.cumsum(smp) <= length
    return (s[keep], v[keep]), (smp[steps_keep], sec[steps_keep])


def _geo(xs) -> float:
    return float(math.exp(np.mean(np.log(xs))))


def _one(base: dict, probe: dict, cand: dict, fraction: float, seed: int) -> dict | None:
    length = fraction * base["nstar"]
    curves = BaselineCurves([base["curve"], _cut(probe, length)[0]], [base["nstar"]])
    curve, steps = _cut(cand, length)
    p = predict(curves, curve, steps, base_steps=_cut(base, length)[1], seed=seed)
    if p["problem"] is not None or p["time_ratio"] is None:
        return None
    return p


def _copy(base: dict, probe: dict, fraction: float, seed: int) -> dict | None:
    """The baseline's probe seed predicted against the baseline run alone, as the profile
    adds it to the spread (profile/probing.py)."""
    length = fraction * base["nstar"]
    curve, steps = _cut(probe, length)
    p = predict(BaselineCurves([base["curve"]] * 2, [base["nstar"]]), curve, steps,
                base_steps=_cut(base, length)[1], seed=seed)
    return p if p["problem"] is None and p["time_ratio"] is not None else None


def _inside(ci, truth) -> bool | None:
    lo, hi = ci
    return None if lo is None or hi is None else bool(lo <= truth <= hi)


def replay(base_runs: list[dict], cand_sets: list[dict], fraction: float, draws: int,
           seed: int, k: int) -> dict:
    """`draws` probe rounds: a baseline run, a baseline probe and k candidate probes (A/A:
    k other baseline seeds; else one seed of each candidate configuration), with the
    bootstrap intervals of each prediction (`within`) and those across the round's probes
    and the baseline probe's copy (`across`, prediction.across_probes, as the profile
    forms them)."""
    rng = np.random.default_rng(seed)
    rows = []
    base_n = _geo([r["nstar"] for r in base_runs])
    base_t = _geo([r["time"] for r in base_runs])
    for i in range(draws):
        if cand_sets:
            b, p = rng.choice(len(base_runs), 2, replace=False)
            probes = {c["config"]: (c["runs"][rng.integers(len(c["runs"]))],
                                    _geo([r["nstar"] for r in c["runs"]]) / base_n,
                                    _geo([r["time"] for r in c["runs"]]) / base_t)
                      for c in cand_sets}
        else:
            b, p, *cs = rng.choice(len(base_runs), 2 + k, replace=False)
            probes = {f"copy{j}": (base_runs[c], 1.0, 1.0) for j, c in enumerate(cs)}
        preds = {name: _one(base_runs[b], base_runs[p], run, fraction, seed + i)
                 for name, (run, _, _) in probes.items()}
        preds = {n: x for n, x in preds.items() if x is not None}
        copy = _copy(base_runs[b], base_runs[p], fraction, seed + i)
        across = prediction.across_probes(preds, {"copy": copy} if copy else None)
        for name, pred in preds.items():
            _, truth_r, truth_t = probes[name]
            rows.append({
                "within_r": _inside(pred["ratio_ci"], truth_r),
                "within_t": _inside(pred["time_ratio_ci"], truth_t),
                "across_r": _inside(across[name]["ratio_ci"], truth_r),
                "across_t": _inside(across[name]["time_ratio_ci"], truth_t),
                "width_t": _width(across[name]["time_ratio_ci"]),
                "log_err_r": math.log(pred["ratio"] / truth_r),
                "log_err_t": math.log(pred["time_ratio"] / truth_t)})

    def rate(key):
        xs = [r[key] for r in rows if r[key] is not None]
        return (float(np.mean(xs)) if xs else None), len(xs)
    out = {"fraction": fraction, "predictions": len(rows)}
    for key in ("within_r", "within_t", "across_r", "across_t"):
        out[f"{key}_coverage"], out[f"{key}_n"] = rate(key)
    widths = [r["width_t"] for r in rows if r["width_t"] is not None]
    out["across_t_median_width"] = float(np.median(widths)) if widths else None
    out["sd_log_err_r"] = float(np.std([r["log_err_r"] for r in rows], ddof=1))
    out["sd_log_err_t"] = float(np.std([r["log_err_t"] for r in rows], ddof=1))
    return out


def _width(ci) -> float | None:
    """hi / lo of an interval (None when unbounded)."""
    return None if None in ci else ci[1] / ci[0]


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("baseline", help="runs of the baseline configuration (dirs joined by commas)")
    ap.add_argument("--candidates", help="runs of other configurations (dirs joined by commas)")
    ap.add_argument("--target", required=True, help="e.g. eval/accuracy=+0.15")
    ap.add_argument("--fractions", default="0.15,0.3,0.6")
    ap.add_argument("--draws", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--k", type=int, default=3, help="A/A: candidate probes per round")
    args = ap.parse_args()
    target = parse_target(args.target)
    base_sets = _loaded(args.baseline, target)
    if len(base_sets) != 1:
        raise SystemExit(f"{args.baseline}: expected one configuration, found {len(base_sets)}")
    base_runs = base_sets[0]["runs"]
    cand_sets = _loaded(args.candidates, target) if args.candidates else []
    out = {"bench": "probe_coverage", "baseline_runs": len(base_runs), "results": []}
    for kind, sets in (("A/A", []), ("candidates", cand_sets)):
        if kind == "candidates" and not sets:
            continue
        if sets:
            s = float(np.std(np.log([r["nstar"] for r in base_runs]), ddof=1))
            se = [s * math.sqrt(1 / len(c["runs"]) + 1 / len(base_runs)) for c in sets]
            print(f"candidates ({len(sets)} per round): the truth (ratio of geometric "
                  f"means) has a log standard error near {np.mean(se):.2f}")
        for f in (float(x) for x in args.fractions.split(",")):
            res = replay(base_runs, sets, f, args.draws, args.seed, args.k) | {"kind": kind}
            out["results"].append(res)
            print(f"{kind:10s} fraction {f:.2f}: {res['predictions']} predictions; nominal-90% "
                  f"intervals holding the truth, r / T ratio: bootstrap "
                  f"{res['within_r_coverage']:.3f} / {res['within_t_coverage']:.3f}, across "
                  f"probes {_fmt(res['across_r_coverage'])} / {_fmt(res['across_t_coverage'])} "
                  f"(median T-ratio width x{_fmt(res['across_t_median_width'])}); sd of log "
                  f"error r {res['sd_log_err_r']:.3f}, T ratio {res['sd_log_err_t']:.3f}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
