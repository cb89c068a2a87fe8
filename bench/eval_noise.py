"""How much of the seed-to-seed spread of log N* is evaluation noise (docs/analysis.md,
"Evaluation noise")?

Each seed trains one baseline run of PRESET, evaluated on twice its held-out prompts with
`eval.halves`: the first half is the preset's own evaluation set, the second a disjoint one
of the same size, so the two N* of a run differ only by which prompts measured the same
policies. With log N*_a = m_a + t + e_a and log N*_b = m_b + t + e_b (t the training's
seed-to-seed part, e_a and e_b independent evaluation errors of one sd s_e):

    s_e^2      = var(log N*_a - log N*_b) / 2     (a chi-square interval, n - 1 df)
    share      = s_e^2 / var(log N*_a)            (a percentile bootstrap over seeds)

and the whole set's N* (eval/accuracy on both halves) is what the preset would measure with
twice the prompts. The cost of a decision scales with the run-to-run variance of log T
(docs/analysis.md, "The information floor"), so var(whole) / var(a) is what a doubled
evaluation buys. `--coverage N` checks the bootstrap's 90% interval of the share on N
simulated studies of the same size with the measured components as the truth.

    python bench/eval_noise.py --seeds 12 --runs /tmp/eval-noise --coverage 400

Each half's target is its step-0 value (its mean over the seeds where the evaluation
samples) plus the gain, one target for every seed as a profile sets one; a run stops once
its own step-0 value plus the preset's gain is crossed on every half. Finished runs in --runs are reused (a killed study resumes).
Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from rlbatch.analysis.crossing import first_crossing, smooth_trailing
from rlbatch.core.loading import load_config
from rlbatch.core.runlog import STOP_FILE, read_json, read_jsonl, read_run

METRICS = {"a": "eval/accuracy_a", "b": "eval/accuracy_b", "whole": "eval/accuracy"}


def train(preset: str, seed: int, prompts: int, samples: int, gain: float, runs: Path) -> Path:
    """One seed's run, stopped (its STOP file) once every metric has crossed. A run of the
    seed in `runs` on which every metric crossed is reused, as is a finished one of the same
    budget (a run that never crossed one of them: censored); one stopped part-way resumes."""
    sets = [f"seed={seed}", f"eval.prompts={2 * prompts}", "eval.halves=true",
            "budget.stop_at_target=false", f"budget.max_samples={samples}"]
    out = runs / f"seed{seed}"
    resume = False
    for d in sorted(out.glob("*/summary.json")):
        status = read_json(d).get("status")
        if all(v is not None for v in crossings(d.parent, gain).values()):
            return d.parent
        same = read_run(d.parent).config["budget"]["max_samples"] == samples
        if same and status in ("budget_exhausted", "target_reached"):
            return d.parent
        resume = resume or (same and status == "running")
    cmd = [sys.executable, "-m", "rlbatch.cli.main", "train", "--preset", preset, "--out",
           str(out), "--json", *[w for s in sets for w in ("--set", s)]]
    if resume:
        cmd.append("--resume")
    env = {**os.environ, "RLBATCH_THREADS": os.environ.get("RLBATCH_THREADS", "1")}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    while proc.poll() is None:
        time.sleep(2.0)
        for d in out.glob("*/evals.jsonl"):
            if not (d.parent / STOP_FILE).exists() and all(
                    v is not None for v in crossings(d.parent, gain).values()):
                (d.parent / STOP_FILE).write_text("requested: eval_noise: every half crossed")
    stdout, stderr = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"seed {seed}: {stderr.strip()[-500:]}")
    return Path(json.loads(stdout.strip().splitlines()[-1])["run_dir"])


def crossings(run_dir: Path, gain: float, smooth: int = 1, base: dict | None = None) -> dict:
    """N* of each half and of the whole set: the first crossing of base + gain (base: each
    metric's step-0 value, the run's own without `base`) by the curve (its trailing mean
    over `smooth` evaluations, as `rlbatch analyze --smooth`)."""
    ev = read_jsonl(run_dir / "evals.jsonl")[0]
    if not ev:
        return dict.fromkeys(METRICS)
    s = [e["samples"] for e in ev]
    out = {}
    for name, metric in METRICS.items():
        v = [e[metric] for e in ev]
        start = v[0] if base is None else base[name]
        c = first_crossing(s, smooth_trailing(v, smooth), start + gain)
        out[name] = None if c.censored else c.samples
    return out


def share_ci(a: np.ndarray, b: np.ndarray, rng: np.random.Generator, draws: int) -> tuple:
    n = len(a)
    idx = rng.integers(0, n, size=(draws, n))
    va = a[idx].var(axis=1, ddof=1)
    ve = (a[idx] - b[idx]).var(axis=1, ddof=1) / 2
    ok = va > 0
    share = np.minimum(ve[ok] / va[ok], 1.0)
    return float(np.quantile(share, 0.05)), float(np.quantile(share, 0.95))


def coverage(n: int, sd_t: float, sd_e: float, sims: int, rng: np.random.Generator) -> float:
    """How often the bootstrap 90% interval holds the true share in `sims` simulated studies
    of n seeds with normal components sd_t (training) and sd_e (evaluation)."""
    truth = sd_e ** 2 / (sd_t ** 2 + sd_e ** 2)
    hits = 0
    for _ in range(sims):
        t = rng.normal(0, sd_t, n)
        a, b = t + rng.normal(0, sd_e, n), t + rng.normal(0, sd_e, n)
        lo, hi = share_ci(a, b, rng, 1000)
        hits += lo <= truth <= hi
    return hits / sims


def chi2_sd_interval(sd: float, df: int) -> tuple[float, float]:
    from scipy.stats import chi2

    return (sd * math.sqrt(df / chi2.ppf(0.95, df)), sd * math.sqrt(df / chi2.ppf(0.05, df)))


def decompose(rows: list[dict], rng: np.random.Generator, sims: int) -> dict | None:
    """The variance components of log N* over the seeds on which every metric crossed (None
    with fewer than 3 such seeds)."""
    full = [r for r in rows if all(r[k] for k in METRICS)]
    if len(full) < 3:
        return None
    a, b, w = (np.log([r[k] for r in full]) for k in ("a", "b", "whole"))
    n = len(full)
    sd_a, sd_b, sd_w = (float(x.std(ddof=1)) for x in (a, b, w))
    sd_e = float((a - b).std(ddof=1) / math.sqrt(2))
    lo, hi = share_ci(a, b, rng, 4000)
    sd_t = math.sqrt(max(sd_a ** 2 - sd_e ** 2, 0.0))
    doc = {"seeds": n, "censored_seeds": len(rows) - n,
           "sd_log_nstar": {"a": sd_a, "b": sd_b, "whole": sd_w},
           "sd_eval": sd_e, "sd_eval_ci90": chi2_sd_interval(sd_e, n - 1), "sd_train": sd_t,
           "eval_share": min(sd_e ** 2 / sd_a ** 2, 1.0), "eval_share_ci90": [lo, hi],
           "corr_a_b": float(np.corrcoef(a, b)[0, 1]),
           "cost_ratio_doubled_eval": sd_w ** 2 / sd_a ** 2,
           "cost_ratio_no_eval_noise": sd_t ** 2 / sd_a ** 2, "rows": rows}
    if sims:
        doc["share_ci90_coverage"] = coverage(n, sd_t, sd_e, sims, rng)
        doc["coverage_sims"] = sims
    return doc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="quick")
    ap.add_argument("--seeds", type=int, default=12)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--samples", type=int, default=24576,
                    help="samples per run (past where both halves cross)")
    ap.add_argument("--runs", type=Path, required=True, help="folder of the runs (reused)")
    ap.add_argument("--jobs", type=int, default=2, help="runs at once")
    ap.add_argument("--coverage", type=int, default=0, help="simulated studies (0: none)")
    ap.add_argument("--gains", type=lambda t: [float(x) for x in t.split(",")], default=[],
                    help="other gains to read the same runs at (comma-separated)")
    ap.add_argument("--smooth", type=lambda t: [int(x) for x in t.split(",")], default=[1],
                    help="trailing-mean windows of the curve, in evaluations (comma-separated)")
    args = ap.parse_args()
    cfg = load_config(preset=args.preset)
    gain, prompts = cfg.target.gain, cfg.eval.prompts
    if gain is None:
        raise SystemExit(f"{args.preset}: the study needs a relative target (target.gain)")
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    with ThreadPoolExecutor(args.jobs) as pool:
        dirs = list(pool.map(lambda s: train(args.preset, s, prompts, args.samples, gain,
                                                   args.runs),
                             seeds))
    # one target per metric for every seed, as a profile sets one (the step-0 values differ
    # between seeds only where the evaluation samples, eval.k > 1)
    starts = [read_jsonl(d / "evals.jsonl")[0][0] for d in dirs]
    base = {k: statistics.fmean(e[m] for e in starts) for k, m in METRICS.items()}
    rng = np.random.default_rng(0)
    table = []
    for g in [gain] + [x for x in args.gains if x != gain]:
        for w in args.smooth:
            rows = [{"seed": s, **crossings(d, g, w, base)}
                    for s, d in zip(seeds, dirs, strict=True)]
            t = decompose(rows, rng, args.coverage)
            if t is None:
                print(f"gain +{g:g}, smooth {w}: fewer than 3 seeds crossed on every metric "
                      "(the runs stop once the preset's gain is crossed; raise --samples)")
            else:
                table.append(t | {"gain": g, "smooth": w})
    if not table or table[0]["gain"] != gain:
        raise SystemExit(f"fewer than 3 seeds crossed +{gain:g} on both halves; raise --samples")
    print(f"{'seed':>4} {'N*_a':>8} {'N*_b':>8} {'N*_whole':>9}   (gain {gain:g})")
    for r in table[0]["rows"]:
        print(f"{r['seed']:>4} " + " ".join(f"{r[k]:>8.0f}" if r[k] else f"{'-':>8}"
                                             for k in ("a", "b", "whole")))
    print("\n| gain | smooth | seeds (censored) | sd log N*: a / b / whole | evaluation sd "
          "[chi-square 90%] | training sd | share of var(a) [bootstrap 90%] (coverage) | "
          "var(whole) / var(a) |\n|---|---|---|---|---|---|---|---|")
    for t in table:
        cov = f" ({t['share_ci90_coverage']:.2f})" if "share_ci90_coverage" in t else ""
        print(f"| +{t['gain']:g} | {t['smooth']} | {t['seeds']} ({t['censored_seeds']}) | "
              f"{t['sd_log_nstar']['a']:.3f} / {t['sd_log_nstar']['b']:.3f} / "
              f"{t['sd_log_nstar']['whole']:.3f} | {t['sd_eval']:.3f} "
              f"[{t['sd_eval_ci90'][0]:.3f}, {t['sd_eval_ci90'][1]:.3f}] | {t['sd_train']:.3f} | "
              f"{t['eval_share']:.2f} [{t['eval_share_ci90'][0]:.2f}, "
              f"{t['eval_share_ci90'][1]:.2f}]{cov} | {t['cost_ratio_doubled_eval']:.2f} |")
    doc = {"bench": "eval_noise", "preset": args.preset, "prompts_per_half": prompts,
           "table": table}
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
