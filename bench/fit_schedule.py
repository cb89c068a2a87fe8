"""A stepwise batch schedule fitted from a static grid's N*(B) and q(B) (issue 31, build 4: the
fallback when the noise scale is too noisy to steer by).

For each static configuration of the grid (runs at one B, sqrt-scaled LR) and each level
f = 1/L, 2/L, ..., 1 of the target's gain over the step-0 value, the samples each run
needed to first reach start + f x gain (interpolated, `analysis.crossing.first_crossing`),
averaged across its seeds (geometric mean; a run that never reached a level drops out of
that level), and its throughput q. Segment i (from level i-1 to level i) then costs
(N_B(f_i) - N_B(f_{i-1})) / q_B seconds at B; the schedule is the sequence of B, one per
segment and never falling (`--any-order` lifts that), with the least summed time, switching
at the samples the chosen path has used so far. It assumes a switch of B keeps each segment's cost as in the static runs (the LR follows
the rule), which the measured schedule then tests.

    python bench/fit_schedule.py PROFILE/runs --target eval/accuracy=+0.2 --levels 2 \\
        [--seeds 0,1,2] [--any-order]

Prints the per-level table, the schedule as a `profile.schedules` item, and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import numpy as np


def cheapest_path(costs: list[dict], monotone: bool) -> list[int]:
    """The B of each segment minimizing the summed seconds; with `monotone`, B never falls
    from one segment to the next (the critical batch grows as training progresses)."""
    best: dict[int, tuple[float, list[int]]] = {}  # last B -> (seconds so far, path)
    for seg in costs:
        nxt = {}
        for b, (sec, _) in seg.items():
            prev = [(t, p) for last, (t, p) in best.items() if not monotone or last <= b] \
                if best else [(0.0, [])]
            if prev:
                t, p = min(prev, key=lambda tp: tp[0])
                nxt[b] = (t + sec, [*p, b])
        if not nxt:
            break
        best = nxt
    return min(best.values(), key=lambda tp: tp[0])[1] if best else []


def fit(frames, target, levels: int, seeds: set[int] | None, monotone: bool = True) -> dict:
    from rlbatch.analysis.crossing import first_crossing, metric_curve, start_value, throughput

    table: dict[int, dict] = {}
    for _, run in frames.runs.iterrows():
        if run["schedule"] or (seeds is not None and int(run["seed"]) not in seeds):
            continue
        steps, evals = frames.run_steps(run["run"]), frames.run_evals(run["run"])
        s, v = metric_curve(evals, target.metric)
        start = start_value(s, v)
        if start is None:
            continue
        gain = target.gain if target.gain is not None else target.value - start
        marks = []
        for i in range(1, levels + 1):
            c = first_crossing(s, v, start + gain * i / levels)
            marks.append(None if c.censored else float(c.samples))
        entry = table.setdefault(int(run["sequences_per_step"]), {"marks": [], "q": []})
        entry["marks"].append(marks)
        entry["q"].append(throughput(steps, evals))
    rows = {}
    for b, e in sorted(table.items()):
        per_level = []
        for i in range(levels):
            got = [m[i] for m in e["marks"] if m[i] is not None and m[i] > 0]
            per_level.append(math.exp(np.mean(np.log(got))) if got else None)
        rows[b] = {"samples_at_level": per_level, "q": float(np.median(e["q"])),
                   "seeds": len(e["marks"])}
    costs = []
    for i in range(levels):
        seg = {}
        for b, r in rows.items():
            lo = 0.0 if i == 0 else r["samples_at_level"][i - 1]
            hi = r["samples_at_level"][i]
            if lo is not None and hi is not None and hi > lo:
                seg[b] = ((hi - lo) / r["q"], hi - lo)
        costs.append(seg)
    choice = cheapest_path(costs, monotone)
    path, used = [], 0.0
    for i, b in enumerate(choice):
        path.append({"level": (i + 1) / levels, "B": b, "from_samples": used,
                     "seconds": costs[i][b][0], "samples": costs[i][b][1],
                     "costs_s": {str(k): c[0] for k, c in costs[i].items()}})
        used += costs[i][b][1]
    steps = []
    for seg in path:
        if not steps or steps[-1][1] != seg["B"]:
            start = 0 if not steps else round(seg["from_samples"] / seg["B"]) * seg["B"]
            steps.append([start, seg["B"]])
    return {"rows": {str(b): r for b, r in rows.items()}, "path": path, "steps": steps}


def main() -> int:
    from rlbatch.analysis.crossing import parse_target
    from rlbatch.analysis.runs import load_runs

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--target", required=True, help="e.g. eval/accuracy=+0.2")
    ap.add_argument("--levels", type=int, default=4)
    ap.add_argument("--seeds", default=None, help="seeds to fit on, e.g. 0,1,2 (default all)")
    ap.add_argument("--any-order", action="store_true",
                    help="let B fall between segments (default: never falls)")
    args = ap.parse_args()
    seeds = None if args.seeds is None else {int(x) for x in args.seeds.split(",")}
    out = fit(load_runs(args.runs), parse_target(args.target), args.levels, seeds,
              monotone=not args.any_order)
    print(f"{'B':>6} {'seeds':>5} {'q':>8}  samples to each level")
    for b, r in out["rows"].items():
        marks = " ".join("-" if m is None else f"{m:,.0f}" for m in r["samples_at_level"])
        print(f"{b:>6} {r['seeds']:>5} {r['q']:>8.1f}  {marks}")
    for seg in out["path"]:
        print(f"level {seg['level']:.2f}: B={seg['B']} from {seg['from_samples']:,.0f} samples "
              f"({seg['samples']:,.0f} samples, {seg['seconds']:.2f} s)")
    print(f"schedule: {{steps: {json.dumps(out['steps'])}}}")
    print(json.dumps({"bench": "fit_schedule", **out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
