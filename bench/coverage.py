"""Measured coverage of every interval `rlbatch analyze` prints, and the error rates of its
decision, by simulation with a known truth (docs/analysis.md, "Intervals across seeds").

Each replicate draws runs of two configurations (reference and candidate): N* log-normal
with the given coefficient of variation, q log-normal (CV 0.05), T = N*/q per run; a run
whose N* passes the budget is censored there (its last samples; its seconds = budget / q).
The budget sits at the reference's (1 - censoring) quantile of N*. The replicates go
through the analysis's own code (analyze.judge, selection.recommend), so what is measured
is what the CLI prints.

  python bench/coverage.py              # the tables of docs/analysis.md
  python bench/coverage.py --reps 400   # quicker

Prints four tables and, last, one JSON line with every figure. The fourth runs a family of
three candidates, one of them noisier than the rest, under each `spread` of analyze.judge.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import numpy as np

from rlbatch.analysis import selection
from rlbatch.analysis.analyze import group_configs, judge
from rlbatch.analysis.invariance import DEFAULT_MARGIN
from rlbatch.analysis.runs import RUN_COLUMNS

Q_CV = 0.05
CI = 0.90
# q's spread across seeds of the quick preset's B0 and its correlation with log N*, from the
# 8-seed grid of docs/study.md 9.2 (the "q as measured" rows)
MEASURED_Q = (0.07, 0.4)


def sigma(cv: float) -> float:
    return math.sqrt(math.log(1.0 + cv * cv))


def draw_runs(rng, n: int, nstar: float, q: float, cv: float, budget: float,
              q_cv: float = Q_CV, rho: float = 0.0) -> list[dict]:
    """n runs of one configuration (records as crossing.run_result gives them); `rho` is the
    correlation of log q with log N* across runs."""
    zn = rng.normal(0.0, 1.0, n)
    zq = rho * zn + math.sqrt(1.0 - rho * rho) * rng.normal(0.0, 1.0, n)
    ns = nstar * np.exp(sigma(cv) * zn)
    qs = q * np.exp(sigma(q_cv) * zq)
    runs = []
    for i, (a, b) in enumerate(zip(ns, qs)):
        cens = bool(a > budget)
        runs.append({"run": f"r{i}", "seed": i, "censored": cens, "too_easy": False,
                     "stop_code": None,
                     "samples_to_target": None if cens else float(a),
                     "time_to_target": None if cens else float(a / b),
                     "last_samples": float(budget) if cens else float(a),
                     "last_train_s": float(budget / b) if cens else float(a / b),
                     "throughput_to_target": float(b)})
    return runs


def group(name: str, b: int, runs: list[dict]) -> dict:
    """One configuration as analyze.group_configs builds it from per-run records: each run is
    a row of the `runs` frame (every key of runs.RUN_COLUMNS, None where unknown, as
    runs.run_row leaves it: `schedule` None is a run at one B) plus its run result."""
    meta = {"config": name, "algorithm": "grpo", "prompts_per_step": b // 8,
            "samples_per_prompt": 8, "sequences_per_step": b, "minibatch_sequences": b,
            "lr": 1e-4 * math.sqrt(b / 128), "lr_scaling": "sqrt", "reference_sequences": 128}
    (g,) = group_configs([{**dict.fromkeys(RUN_COLUMNS), **meta, **r} for r in runs])
    return g


def replicate(rng, n: int, cv: float, cens: float, n_ratio: float, q_ratio: float,
              cand_cv: float | None = None, cand_n: int | None = None,
              q_noise: tuple[float, float] = (Q_CV, 0.0)) -> dict:
    """One analysis of reference (B0) vs candidate with true N* ratio and q ratio (the
    candidate's CV and seed count default to the reference's; `q_noise` is q's CV and its
    correlation with N*)."""
    nstar, q = 4000.0, 1000.0
    budget = nstar * math.exp(sigma(cv) * _z(1.0 - cens)) if cens > 0 else math.inf
    c_cv, c_n = cand_cv or cv, cand_n or n
    groups = [group("ref", 128, draw_runs(rng, n, nstar, q, cv, budget, *q_noise)),
              group("cand", 256, draw_runs(rng, c_n, nstar * n_ratio, q * q_ratio, c_cv,
                                           budget, *q_noise))]
    entries, _, _ = judge(groups, "ref", DEFAULT_MARGIN, CI)
    rec = selection.recommend(entries, "ref")
    return {"entries": {e["config"]: e for e in entries}, "rec": rec,
            "truth": {"ref": (nstar, q, nstar / q),
                      "cand": (nstar * n_ratio, q * q_ratio, nstar * n_ratio / (q * q_ratio))}}


def _z(p: float) -> float:
    from scipy.stats import norm
    return float(norm.ppf(p))


def _covers(ci, truth) -> bool | None:
    lo, hi = ci
    if lo is None and hi is None:
        return None
    return (lo is None or lo <= truth) and (hi is None or truth <= hi)


KEYS = (("N*", "samples_to_target_ci", 0), ("q", "throughput_ci", 1),
        ("T", "time_to_target_ci", 2))
RATIOS = (("N* ratio", "samples_ratio_ci", 0), ("q ratio", "throughput_ratio_ci", 1),
          ("T ratio", "time_ratio_ci", 2))


def coverage_cell(rng, n, cv, cens, reps, cand_cv=None, cand_n=None) -> dict:
    """Coverage of each printed interval when the candidate equals the reference in N* and
    has 1.25x its q (so the T ratio is 0.8). The per-configuration intervals are the
    candidate's (its CV and seed count may differ from the reference's)."""
    hits = {k: [] for k, _, _ in KEYS + RATIOS}
    printed = {k: 0 for k in hits}
    for _ in range(reps):
        r = replicate(rng, n, cv, cens, 1.0, 1.25, cand_cv, cand_n)
        cand = r["entries"]["cand"]
        for name, key, i in KEYS:
            c = _covers(cand[key], r["truth"]["cand"][i])
            if c is not None:
                hits[name].append(c)
                printed[name] += 1
        vs = cand["vs_reference"]
        for name, key, i in RATIOS:
            c = _covers(vs[key], r["truth"]["cand"][i] / r["truth"]["ref"][i])
            if c is not None:
                hits[name].append(c)
                printed[name] += 1
    return {k: (float(np.mean(v)) if v else None) for k, v in hits.items()} | {
        "printed_share": {k: printed[k] / reps for k in printed}}


def decision_cell(rng, n, cv, cens, n_ratio, q_ratio, reps,
                  q_noise: tuple[float, float] = (Q_CV, 0.0)) -> dict:
    """How often the analysis excludes 1 from each ratio interval, calls the candidate
    departed, recommends it, makes a claim in words about it (departed, fewer_samples or
    recommended), and how P(faster) is spread."""
    excl = {k: 0 for k, _, _ in RATIOS}
    departed = recommended = excl_any = t_or_departed = claims = 0
    p95 = p90 = 0
    for _ in range(reps):
        r = replicate(rng, n, cv, cens, n_ratio, q_ratio, q_noise=q_noise)
        cand = r["entries"]["cand"]
        vs = cand["vs_reference"]
        any_excl = False
        for name, key, _ in RATIOS:
            lo, hi = vs[key]
            out = (lo is not None and lo > 1.0) or (hi is not None and hi < 1.0)
            excl[name] += out
            any_excl |= out and name != "q ratio"
        excl_any += any_excl or cand["verdict"] == "departed"
        lo, hi = vs["time_ratio_ci"]
        t_out = (lo is not None and lo > 1.0) or (hi is not None and hi < 1.0)
        t_or_departed += t_out or cand["verdict"] == "departed"
        departed += cand["verdict"] == "departed"
        rec = r["rec"] is not None and r["rec"]["config"] == "cand"
        recommended += rec
        claims += rec or cand["verdict"] in ("departed", "fewer_samples")
        p = vs["p_faster"]
        p95 += p is not None and p >= 0.95
        p90 += p is not None and p >= 0.90
    return {**{f"excludes_1/{k}": v / reps for k, v in excl.items()},
            "departed": departed / reps, "N* or T interval excludes 1, or departed":
            excl_any / reps, "T interval excludes 1, or departed": t_or_departed / reps,
            "a claim in words": claims / reps, "recommended": recommended / reps,
            "P(faster)>=0.95": p95 / reps, "P(faster)>=0.90": p90 / reps}


SPREADS = ("pooled", "pair", "larger", "paired")


def family_cell(rng, n: int, cv: float, noisy: float, fast_q: float, reps: int,
                spread: str) -> dict:
    """A family as a profile compares it: the reference (B0) and three candidates, n seeds
    each. Candidate `noisy` has `noisy` x the others' CV and the reference's T; `quiet` has
    the reference's CV and T; `fast` has the reference's CV and `fast_q` x its q (T ratio
    1 / fast_q; 1.0: as fast as the reference). Through judge (with `spread`) and recommend:
    coverage of each candidate's T-ratio interval, and how often each is recommended."""
    nstar, q = 4000.0, 1000.0
    hits = {k: [] for k in ("noisy", "quiet", "fast")}
    picked = {k: 0 for k in hits}
    for _ in range(reps):
        groups = [group("ref", 128, draw_runs(rng, n, nstar, q, cv, math.inf)),
                  group("noisy", 256, draw_runs(rng, n, nstar, q, cv * noisy, math.inf)),
                  group("quiet", 512, draw_runs(rng, n, nstar, q, cv, math.inf)),
                  group("fast", 1024, draw_runs(rng, n, nstar, q * fast_q, cv, math.inf))]
        entries, _, _ = judge(groups, "ref", DEFAULT_MARGIN, CI, spread)
        by = {e["config"]: e for e in entries}
        for k, truth in (("noisy", 1.0), ("quiet", 1.0), ("fast", 1.0 / fast_q)):
            c = _covers(by[k]["vs_reference"]["time_ratio_ci"], truth)
            if c is not None:
                hits[k].append(c)
        rec = selection.recommend(entries, "ref")
        if rec is not None and not rec["is_reference"]:
            picked[rec["config"]] += 1
    return {**{f"T-ratio coverage/{k}": float(np.mean(v)) if v else None
               for k, v in hits.items()},
            **{f"recommended/{k}": v / reps for k, v in picked.items()}}


def fmt(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2000, help="replicates per cell")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--family-only", action="store_true",
                    help="only the fourth table (a family with one noisier candidate)")
    ap.add_argument("--spreads", default=",".join(SPREADS),
                    help="the spreads of the fourth table, comma-separated")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    out: dict = {"reps": args.reps, "ci": CI, "q_cv": Q_CV, "coverage": [], "decisions": []}

    if args.family_only:
        return family_table(rng, args, out, t0)
    print(f"Coverage of nominal {CI:.0%} intervals ({args.reps} replicates per row; "
          "candidate: same N*, 1.25x q)")
    names = [k for k, _, _ in KEYS + RATIOS]
    print("| CV | censored | n | " + " | ".join(names) + " |")
    print("|---|---|---|" + "---|" * len(names))
    for cv in (0.15, 0.3):
        for cens in (0.0, 0.1, 0.2):
            for n in (2, 3, 5, 10):
                cell = coverage_cell(rng, n, cv, cens, args.reps)
                out["coverage"].append({"cv": cv, "censored": cens, "n": n, **cell})
                print(f"| {cv} | {cens:.0%} | {n} | "
                      + " | ".join(fmt(cell[k]) for k in names) + " |", flush=True)
    # outside the model: the candidate has half the reference's CV, or a single seed
    for label, cv, n, c_cv, c_n in (("0.3 (ref), 0.15 (cand)", 0.3, 3, 0.15, None),
                                    ("0.15 (ref), 0.3 (cand)", 0.15, 3, 0.3, None),
                                    ("0.3, cand 1 seed", 0.3, 3, None, 1)):
        cell = coverage_cell(rng, n, cv, 0.0, args.reps, c_cv, c_n)
        out["coverage"].append({"cv": label, "censored": 0.0, "n": n, **cell})
        print(f"| {label} | 0% | {n} | " + " | ".join(fmt(cell[k]) for k in names) + " |",
              flush=True)

    cases = [("A/A", 0.3, 2, 1.0, 1.0), ("A/A", 0.3, 3, 1.0, 1.0), ("A/A", 0.15, 2, 1.0, 1.0),
             ("A/A", 0.15, 3, 1.0, 1.0), ("A/A, 20% censored", 0.3, 3, 1.0, 1.0),
             ("same N*, 1.5x q", 0.15, 4, 1.0, 1.5), ("same N*, 1.5x q", 0.3, 4, 1.0, 1.5),
             ("1.33x slower", 0.15, 4, 1.33, 1.0), ("1.33x slower", 0.3, 4, 1.33, 1.0),
             ("1.4x the samples, 1.2x q", 0.3, 3, 1.4, 1.2),
             ("A/A, q as measured", 0.15, 2, 1.0, 1.0), ("A/A, q as measured", 0.15, 3, 1.0, 1.0)]
    print(f"\nDecisions ({args.reps} replicates per row)")
    cols = ["excludes_1/N* ratio", "excludes_1/q ratio", "excludes_1/T ratio",
            "N* or T interval excludes 1, or departed", "T interval excludes 1, or departed",
            "a claim in words", "departed", "recommended",
            "P(faster)>=0.95", "P(faster)>=0.90"]
    print("| case | CV | seeds per side | " + " | ".join(cols) + " |")
    print("|---|---|---|" + "---|" * len(cols))
    for name, cv, n, nr, qr in cases:
        cens = 0.2 if "censored" in name else 0.0
        q_noise = MEASURED_Q if "q as measured" in name else (Q_CV, 0.0)
        cell = decision_cell(rng, n, cv, cens, nr, qr, args.reps, q_noise)
        out["decisions"].append({"case": name, "cv": cv, "n": n, **cell})
        print(f"| {name} | {cv} | {n} | " + " | ".join(fmt(cell[c]) for c in cols) + " |",
              flush=True)
    return family_table(rng, args, out, t0)


def family_table(rng, args, out: dict, t0: float) -> int:
    """The fourth table: one spread for the family, or each comparison's own
    (analyze.judge `spread`); then the JSON line."""
    out["family"] = []
    fam_cols = ["T-ratio coverage/noisy", "T-ratio coverage/quiet", "T-ratio coverage/fast",
                "recommended/noisy", "recommended/quiet", "recommended/fast"]
    print(f"\nA family of three candidates, one noisier ({args.reps} replicates per row): "
          "noisy and quiet as fast as the reference; fast at 1 / fast_q")
    print("| spread | CV | noisy x CV | fast_q | seeds | " + " | ".join(fam_cols) + " |")
    print("|---|---|---|---|---|" + "---|" * len(fam_cols))
    for cv, noisy, fast_q, n in ((0.25, 2.5, 1.0, 3), (0.25, 2.5, 1.0, 4), (0.25, 1.0, 1.5, 3),
                                 (0.25, 1.0, 1.5, 4), (0.25, 2.5, 1.5, 4)):
        for spread in args.spreads.split(","):
            cell = family_cell(rng, n, cv, noisy, fast_q, args.reps, spread)
            out["family"].append({"spread": spread, "cv": cv, "noisy": noisy, "fast_q": fast_q,
                                  "n": n, **cell})
            print(f"| {spread} | {cv} | {noisy} | {fast_q} | {n} | "
                  + " | ".join(fmt(cell[c]) for c in fam_cols) + " |", flush=True)
    out["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
