"""Which sample-efficiency statistic gives the narrower interval on recorded runs: each run's
first crossing of the target (N*, what `rlbatch analyze` uses), or a stretch of the samples
axis fitted to the whole curve, pooled across seeds (docs/analysis.md, "Which statistic").

The stretch is analysis/registration.py's shape-invariant registration (the one `rlbatch
analyze --statistic stretch` uses); exp(a_i) plays the role of N*_i / N*_ref. `--from F`
registers only the rising segment of each curve: its points from the last evaluation below
start + F x gain on (analyze uses F = 0.8).

Both statistics enter the same pooled log-normal model (one spread pooled over the
configurations, df = runs - configurations), so their intervals at a given seed count
differ only by that spread: the statistic with the smaller pooled sd has the narrower
interval. Each positional argument is one set of runs (a directory, or several joined by
commas). Prints, per set, the pooled sd of each statistic, its interval half-width
at 2, 3 and 5 seeds per side, and the correlation of the two per run; last, one JSON line.
Runs that did not reach the target are left out of both.

  python bench/curve_statistic.py study-runs/aa-quick \
      "$(ls -d study-runs/aa-quick/*-s[0-7]-* | paste -sd,),study-runs/grid-quick" \
      --target eval/accuracy=+0.15 --from 0,0.5,0.8
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
from scipy import stats as sps

from rlbatch.analysis.analyze import group_configs
from rlbatch.analysis.crossing import parse_target, per_run_records
from rlbatch.analysis.registration import register, rising
from rlbatch.analysis.runs import load_runs
from rlbatch.core.runlog import read_run
from rlbatch.profile.probing import curve_of


def _until(s: np.ndarray, v: np.ndarray, nstar: float):
    """The curve up to the first evaluation at or past N* (where a run that stops at the
    target ends)."""
    k = int(np.searchsorted(s, nstar - 1e-9)) + 1
    return s[:k], v[:k]


def pooled_sd(values: np.ndarray, groups: np.ndarray) -> tuple[float, int]:
    dev, df = 0.0, 0
    for g in np.unique(groups):
        x = values[groups == g]
        if len(x) > 1:
            dev += float(((x - x.mean()) ** 2).sum())
            df += len(x) - 1
    return (math.sqrt(dev / df) if df else math.nan), df


def directory(path: str, target_text: str, fracs: list[float], cut: bool = False) -> dict:
    """The two statistics on one set of runs: `path` is a directory, or several (run or
    sweep) directories joined by commas, analysed together."""
    target = parse_target(target_text)
    frames = load_runs(path.split(","))
    records = [r for r in per_run_records(frames, target) if not r["censored"]]
    groups = group_configs(records)
    ref_id = groups[0]["config"] if len(groups) == 1 else next(
        (g["config"] for g in groups if g["sequences_per_step"] == g["reference_sequences"]),
        groups[0]["config"])
    runs = [(g["config"], r) for g in groups for r in g["runs"]]
    cfg = np.array([c for c, _ in runs])
    log_n = np.log([r["samples_to_target"] for _, r in runs])
    out = {"dir": path, "runs": len(runs), "configs": len(groups)}
    sd, df = pooled_sd(log_n, cfg)
    out["crossing"] = {"sd": sd, "df": df}
    curves = [curve_of(read_run(r["run"]), target.metric) for _, r in runs]
    if cut:  # as if every run had stopped at its crossing (budget.stop_at_target)
        curves = [_until(s, v, r["samples_to_target"]) for (s, v), (_, r) in zip(curves, runs)]
    for f in fracs:
        segs = [rising((s, v), float(v[0]) + float(target.gain), f) for s, v in curves]
        a = register(segs, cfg == ref_id)
        sd_a, _ = pooled_sd(a, cfg)
        out[f"stretch_from_{f:g}"] = {"sd": sd_a, "df": df,
                                      "corr_with_crossing": float(np.corrcoef(a, log_n)[0, 1])}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--target", required=True, help="e.g. eval/accuracy=+0.15")
    ap.add_argument("--from", dest="fracs", default="0,0.5,0.8",
                    help="register each curve from its last point below start + F x gain")
    ap.add_argument("--cut-at-target", action="store_true",
                    help="cut each curve at its first crossing, as runs that stop at the "
                         "target end")
    args = ap.parse_args()
    fracs = [float(x) for x in args.fracs.split(",")]
    results = []
    for d in args.dirs:
        res = directory(d, args.target, fracs, args.cut_at_target)
        results.append(res)
        name = d if len(d) < 60 else d[:28] + "..." + d[-28:]
        print(f"{name}: {res['runs']} runs in {res['configs']} configuration(s), "
              f"df = {res['crossing']['df']}")
        for name, v in res.items():
            if not isinstance(v, dict):
                continue
            t = sps.t.ppf(0.95, max(v["df"], 1))
            widths = " ".join(f"n={n}: x/{math.exp(t * v['sd'] * math.sqrt(2 / n)):.2f}"
                              for n in (2, 3, 5))
            corr = f", corr with crossing {v['corr_with_crossing']:.2f}" \
                if "corr_with_crossing" in v else ""
            print(f"  {name:20s} pooled sd of log {v['sd']:.3f}; 90% ratio interval "
                  f"{widths}{corr}")
    print(json.dumps({"bench": "curve_statistic", "target": args.target, "results": results}))


if __name__ == "__main__":
    main()
