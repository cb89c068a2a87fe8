"""The profile's whole adaptive procedure, simulated on synthetic candidates with a known
truth: how often it recommends a configuration that is not faster, and how often it finds
one that is (docs/analysis.md, "The whole procedure").

Per replicate, as `rlbatch profile` runs it (profile/procedure.py): the baseline's
`seeds + confirm_seeds` runs; one screening seed of each sqrt-scaled candidate, stopped
early by the profile's own rule (procedure.early_stop_reason: `no_crossing` past exp(margin)
x the baseline's largest N*, `cannot_win` past its median time to target), which censors
the run there; the challenger (selection.challenger, the open candidate with the lowest
point T) gets `confirm_seeds` more seeds under the same stops; then the decision
(analyze.judge, selection.recommend). N* is log-normal at the given CV, q at CV 0.05.

  python bench/procedure_sim.py              # the table of docs/analysis.md
  python bench/procedure_sim.py --reps 300   # quicker

Prints a table and, last, one JSON line.
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
from rlbatch.profile.procedure import early_stop_reason

Q_CV = 0.05
B0 = 128

SPREAD = ["pooled"]  # analyze.judge's spread (--spread)


def sigma(cv: float) -> float:
    return math.sqrt(math.log(1.0 + cv * cv))


def one_run(rng, nstar: float, q: float, cv: float, seed: int, stops=None) -> dict:
    """A run to its target, or stopped where the profile's rule stops it (censored)."""
    n = nstar * math.exp(rng.normal(0.0, sigma(cv)))
    rate = q * math.exp(rng.normal(0.0, sigma(Q_CV)))
    end, code = n, None
    if stops is not None:
        median_time, limit = stops
        # the run crosses at n; the rule checks each step: first of the limit in samples,
        # the baseline's median time in seconds
        at_limit, at_time = limit, median_time * rate
        first = min(at_limit, at_time)
        if first < n:
            st = {"samples": first + 1e-9, "train_s": first / rate + 1e-9,
                  "target": {"reached": False}}
            code = (early_stop_reason(st, median_time, limit) or "").split(":")[0] or None
            end = first
    cens = code is not None
    return {"run": f"s{seed}", "seed": seed, "censored": cens, "too_easy": False,
            "stop_code": code, "samples_to_target": None if cens else n,
            "time_to_target": None if cens else n / rate,
            "last_samples": end, "last_train_s": end / rate, "throughput_to_target": rate}


def group(name: str, b: int, runs: list[dict]) -> dict:
    """One configuration as analyze.group_configs builds it from per-run records: each run is
    a row of the `runs` frame (every key of runs.RUN_COLUMNS, None where unknown, as
    runs.run_row leaves it: `schedule` None is a run at one B) plus its run result."""
    meta = {"config": name, "algorithm": "grpo", "prompts_per_step": b // 8,
            "samples_per_prompt": 8, "sequences_per_step": b, "minibatch_sequences": b,
            "lr": 1e-4 * math.sqrt(b / B0), "lr_scaling": "sqrt", "reference_sequences": B0}
    (g,) = group_configs([{**dict.fromkeys(RUN_COLUMNS), **meta, **r} for r in runs])
    return g


def profile_once(rng, truths: dict, cv: float, seeds: int, confirm: int) -> dict | None:
    """truths: config name -> (B, N*, q); 'ref' is the baseline. Returns the recommendation."""
    _, n0, q0 = truths["ref"]
    base = [one_run(rng, n0, q0, cv, s) for s in range(seeds + confirm)]
    median_time = float(np.median([r["time_to_target"] for r in base]))
    limit = max(r["samples_to_target"] for r in base) * math.exp(DEFAULT_MARGIN)
    runs = {"ref": base}
    for name, (_, n, q) in truths.items():
        if name != "ref":
            runs[name] = [one_run(rng, n, q, cv, s, (median_time, limit)) for s in range(seeds)]

    def decide():
        groups = [group(c, truths[c][0], r) for c, r in runs.items()]
        entries, _, _ = judge(groups, "ref", DEFAULT_MARGIN, 0.90, SPREAD[0])
        return entries

    entries = decide()
    if confirm:
        ref = next(e for e in entries if e["config"] == "ref")
        chosen = selection.challenger(entries, ref)
        if chosen is not None:
            name = chosen["config"]
            _, n, q = truths[name]
            runs[name] += [one_run(rng, n, q, cv, s, (median_time, limit))
                           for s in range(seeds, seeds + confirm)]
            entries = decide()
    return selection.recommend(entries, "ref")


CASES = {
    "3 candidates, all equal to B0": {"a": (256, 1.0, 1.0), "b": (512, 1.0, 1.0),
                                      "c": (1024, 1.0, 1.0)},
    "one 1.5x faster (same N*, 1.5x q), two equal": {"a": (256, 1.0, 1.5), "b": (512, 1.0, 1.0),
                                                     "c": (1024, 1.0, 1.0)},
    "one 1.33x slower, two equal": {"a": (256, 1.33, 1.0), "b": (512, 1.0, 1.0),
                                    "c": (1024, 1.0, 1.0)},
    "one 2x faster (same N*, 2x q), two equal": {"a": (256, 1.0, 2.0), "b": (512, 1.0, 1.0),
                                                 "c": (1024, 1.0, 1.0)},
}


def run_case(rng, spec: dict, cv: float, seeds: int, confirm: int, reps: int) -> dict:
    truths = {"ref": (B0, 4000.0, 1000.0)}
    truths.update({k: (b, 4000.0 * nr, 1000.0 * qr) for k, (b, nr, qr) in spec.items()})
    faster = {k for k, (_, nr, qr) in spec.items() if nr / qr < 1.0}
    wrong = right = kept = 0
    for _ in range(reps):
        rec = profile_once(rng, truths, cv, seeds, confirm)
        if rec is None or rec["is_reference"]:
            kept += 1
        elif rec["config"] in faster:
            right += 1
        else:
            wrong += 1
    return {"recommended_not_faster": wrong / reps, "recommended_faster": right / reps,
            "kept_baseline": kept / reps}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--spread", choices=("pooled", "pair", "larger"), default="pooled",
                    help="analyze.judge's spread (the published table: pooled, the analysis's "
                         "default when it was made)")
    args = ap.parse_args()
    SPREAD[0] = args.spread
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    rows = []
    print(f"The whole procedure ({args.reps} replicates per row)")
    print("| case | CV | seeds + confirmation seeds | recommends one not faster | "
          "recommends a faster one | keeps B0 |")
    print("|---|---|---|---|---|---|")
    for name, spec in CASES.items():
        for cv, seeds, confirm in ((0.3, 1, 1), (0.3, 2, 2), (0.15, 1, 1), (0.15, 2, 2)):
            r = run_case(rng, spec, cv, seeds, confirm, args.reps)
            rows.append({"case": name, "cv": cv, "seeds": seeds, "confirm_seeds": confirm, **r})
            print(f"| {name} | {cv} | {seeds} + {confirm} | {r['recommended_not_faster']:.3f} | "
                  f"{r['recommended_faster']:.3f} | {r['kept_baseline']:.3f} |", flush=True)
    print(json.dumps({"reps": args.reps, "rows": rows,
                      "seconds": round(time.perf_counter() - t0, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
