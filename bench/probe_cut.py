"""The probe predictor on probes cut from full runs: how far the fitted sample-efficiency
ratio r lands from each run's own measured N* ratio, at a given probe length.

Takes a profile directory whose runs went to the target (the exhaustive grid:
`rlbatch profile --seeds 3 --set profile.early_stop=false --set profile.confirm_seeds=0`).
The reference configuration's first two seeds play the probe profile's baseline (the first
one's N* sets the probe length); every seed of every other configuration, cut at
`fraction` x that N*, plays a probe. Prints one line per probe and the median errors, then
one JSON line.

    .venv/bin/python bench/probe_cut.py /tmp/p14/quick-grid --fractions 0.25,0.6
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

from rlbatch.analysis.prediction import BaselineCurves, predict
from rlbatch.core.runlog import read_run
from rlbatch.profile.probing import curve_of, step_increments


def cut(profile_dir: Path, fraction: float, metric: str) -> list[dict]:
    an = json.loads((profile_dir / "profile.json").read_text())["analysis"]
    ref = next(c for c in an["configs"] if c["config"] == an["reference"]["config"])
    base = [read_run(r["run"]) for r in ref["runs"][:2]]
    nstar = ref["runs"][0]["samples_to_target"]
    curves = BaselineCurves([curve_of(b, metric) for b in base], [nstar])
    rows = []
    for c in an["configs"]:
        if c is ref:
            continue
        for r in c["runs"]:
            run = read_run(r["run"])
            s, v = curve_of(run, metric)
            keep = s <= fraction * nstar
            p = predict(curves, (s[keep], v[keep]), step_increments(run))
            own = r["samples_to_target"] / nstar if r["samples_to_target"] else None
            rows.append({"B": c["sequences_per_step"], "lr_scaling": c["lr_scaling"],
                         "seed": r["seed"], "r": p["ratio"], "r_ci": p["ratio_ci"],
                         "own_ratio": own})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", type=Path)
    ap.add_argument("--fractions", default="0.25,0.6")
    ap.add_argument("--metric", default="eval/accuracy")
    args = ap.parse_args()
    out = {"bench": "probe_cut", "profile": str(args.profile), "fractions": {}}
    for f in (float(x) for x in args.fractions.split(",")):
        rows = cut(args.profile, f, args.metric)
        for r in rows:
            lo, hi = r["r_ci"]
            own = "-" if r["own_ratio"] is None else f"{r['own_ratio']:.2f}"
            print(f"fraction {f}: B={r['B']} {r['lr_scaling']} seed {r['seed']}: r {r['r']:.2f} "
                  f"[{lo:.2f}, {hi:.2f}], the run's own N* ratio {own}")
        pairs = [(r["r"], r["own_ratio"]) for r in rows if r["r"] and r["own_ratio"]]
        logs = [math.log(a / b) for a, b in pairs]
        inside = sum(1 for r in rows if r["own_ratio"] and r["r_ci"][0] is not None
                     and r["r_ci"][0] <= r["own_ratio"] <= r["r_ci"][1])
        summary = {"probes": len(pairs),
                   "median_abs_error": statistics.median(abs(a / b - 1) for a, b in pairs),
                   "median_log_error": statistics.median(logs), "inside_interval": inside}
        print(f"fraction {f}: {summary}")
        out["fractions"][str(f)] = summary
    print(json.dumps(out))


if __name__ == "__main__":
    main()
