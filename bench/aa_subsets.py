"""A/A on real runs: seeds of one configuration split in two halves, one half relabelled as
another configuration, and every k-vs-k subset analysed as `rlbatch analyze` would
(analyze.judge, selection.recommend). Each subset that calls the copy different is a false
claim (docs/study.md, "A/A on real runs"). `halves`: every k-subset of the first half of the
seeds against every k-subset of the second (one fixed split, so the rates carry that split's
luck); `disjoint`: random pairs of disjoint k-subsets of all the seeds.

  python bench/aa_subsets.py study-runs/aa-quick --target eval/accuracy=+0.15 --sizes 2,3
  python bench/aa_subsets.py study-runs/aa-long --target eval/accuracy=+0.05 --statistic stretch

Prints, per k, how often the N*, q and T ratio intervals exclude 1, how often the copy is
`departed` or recommended, how often the analysis makes any claim in words about the copy
(`departed`, `fewer_samples` or recommended), and the spread of N* over all seeds; last,
one JSON line.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys

import numpy as np

from rlbatch.analysis import registration, selection
from rlbatch.analysis.analyze import group_configs, judge
from rlbatch.analysis.crossing import metric_curve, parse_target, per_run_records
from rlbatch.analysis.invariance import DEFAULT_MARGIN
from rlbatch.analysis.runs import load_runs

RATIOS = (("N* ratio", "samples_ratio_ci"), ("q ratio", "throughput_ratio_ci"),
          ("T ratio", "time_ratio_ci"))


def split_pairs(runs: list[dict], k: int):
    """Every k-subset of the first half against every k-subset of the second."""
    half = len(runs) // 2
    for sa in itertools.combinations(runs[:half], k):
        for sb in itertools.combinations(runs[half:2 * half], k):
            yield sa, sb


def disjoint_pairs(runs: list[dict], k: int, draws: int, seed: int):
    """`draws` random pairs of disjoint k-subsets of all the seeds (no fixed split)."""
    rng = np.random.default_rng(seed)
    for _ in range(draws):
        pick = rng.permutation(len(runs))[:2 * k]
        yield [runs[i] for i in pick[:k]], [runs[i] for i in pick[k:]]


def subsets(pairs, k: int, meta: dict, margin: float, ci: float,
            curves: dict | None = None) -> dict:
    """The rates over `pairs`; with `curves` (run -> its curve), each pair's N* and T are the
    registration's (--statistic stretch), fitted on that pair's runs alone, as
    `rlbatch analyze` fits them on the runs it is given."""
    counts = {name: 0 for name, _ in RATIOS} | {"departed": 0, "recommended": 0, "any": 0,
                                                "t_or_departed": 0, "claim": 0}
    total, widths = 0, []
    for sa, sb in pairs:
        groups = [{**meta, "config": "A", "runs": list(sa)},
                  {**meta, "config": "B", "runs": list(sb)}]
        if curves is not None:
            groups = registration.stretched_groups(groups, curves, "A")
        entries, _, _ = judge(groups, "A", margin, ci)
        copy = next(e for e in entries if e["config"] == "B")
        rec = selection.recommend(entries, "A")
        vs = copy["vs_reference"]
        hit = False
        for name, key in RATIOS:
            lo, hi = vs[key]
            out = (lo is not None and lo > 1) or (hi is not None and hi < 1)
            counts[name] += out
            hit |= out and name != "q ratio"
        lo, hi = vs["samples_ratio_ci"]
        if lo and hi:
            widths.append(hi / lo)
        lo, hi = vs["time_ratio_ci"]
        t_out = (lo is not None and lo > 1) or (hi is not None and hi < 1)
        recommended = rec is not None and rec["config"] == "B"
        counts["departed"] += copy["verdict"] == "departed"
        counts["recommended"] += recommended
        counts["any"] += hit or copy["verdict"] == "departed"
        counts["t_or_departed"] += t_out or copy["verdict"] == "departed"
        counts["claim"] += recommended or copy["verdict"] in ("departed", "fewer_samples")
        total += 1
    return {"k": k, "subsets": total, **{n: c / total for n, c in counts.items()},
            "nstar_ratio_width": float(np.median(widths)) if widths else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--target", required=True)
    ap.add_argument("--sizes", default="2,3")
    ap.add_argument("--margin", type=float, default=DEFAULT_MARGIN)
    ap.add_argument("--ci", type=float, default=0.90)
    ap.add_argument("--draws", type=int, default=3000,
                    help="random disjoint subset pairs of all seeds, per size")
    ap.add_argument("--statistic", default="crossing", choices=("crossing", "stretch"),
                    help="a run's N*, as `rlbatch analyze --statistic`")
    args = ap.parse_args()
    frames = load_runs(args.runs)
    target = parse_target(args.target)
    records = per_run_records(frames, target)
    curves = None if args.statistic == "crossing" else \
        {r["run"]: metric_curve(frames.run_evals(r["run"]), target.metric) for r in records}
    groups = group_configs(records)
    if len(groups) != 1:
        print(f"error: expected runs of one configuration, found {len(groups)}",
              file=sys.stderr)
        return 2
    meta = {k: v for k, v in groups[0].items() if k not in ("config", "runs")}
    runs = sorted(groups[0]["runs"], key=lambda r: r["seed"])
    nstar = [r["samples_to_target"] for r in runs]
    crossed = np.array([x for x in nstar if x is not None], dtype=float)
    spread = {"seeds": len(runs), "censored": sum(x is None for x in nstar),
              "nstar": nstar,
              "cv": float(crossed.std(ddof=1) / crossed.mean()) if len(crossed) > 1 else None,
              "sd_log": float(np.log(crossed).std(ddof=1)) if len(crossed) > 1 else None,
              "throughput": [r["throughput_to_target"] for r in runs]}
    print(f"{len(runs)} seeds; N*: {', '.join('censored' if x is None else f'{x:,.0f}' for x in nstar)}")
    if spread["cv"] is not None:
        print(f"N* coefficient of variation {spread['cv']:.3f}, sd of log N* {spread['sd_log']:.3f}")
    rows = []
    for k in map(int, args.sizes.split(",")):
        rows.append({"pairs": "halves", **subsets(split_pairs(runs, k), k, meta, args.margin,
                                                   args.ci, curves)})
        rows.append({"pairs": "disjoint", **subsets(disjoint_pairs(runs, k, args.draws, k),
                                                     k, meta, args.margin, args.ci, curves)})
    print("| subsets | seeds per side | count | N* ratio excludes 1 | q ratio excludes 1 | "
          "T ratio excludes 1 | N* or T excludes 1, or departed | T excludes 1, or departed "
          "| a claim in words | departed | copy recommended "
          "| median N* ratio interval width (hi / lo) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['pairs']} | {r['k']} | {r['subsets']} | {r['N* ratio']:.3f} | "
              f"{r['q ratio']:.3f} | "
              f"{r['T ratio']:.3f} | {r['any']:.3f} | {r['t_or_departed']:.3f} | "
              f"{r['claim']:.3f} | {r['departed']:.3f} | "
              f"{r['recommended']:.3f} | {r['nstar_ratio_width']:.2f} |")
    print(json.dumps({"spread": spread, "subsets": rows},
                     default=lambda x: None if isinstance(x, float) and math.isnan(x) else x))
    return 0


if __name__ == "__main__":
    sys.exit(main())
