"""Samples per training second against the batch B on a workload, side by side in one run.

For each repetition and each B (the order rotated every repetition, so no B always runs
first or last), `rlbatch train` runs the preset from its built model for `--samples`
samples at B = P x G (sqrt-scaled LR, as `rlbatch profile` would run it), with evaluations
reduced to one tiny final one (excluded from train_s anyway). From each run's step log:

- q: samples per training second over the steps after the first (the first step pays
  one-off allocation);
- the phase shares of a step (time/* keys over the step's wall time, `train_s`);
- response lengths (mean of `response/mean_length`, median of `response/p50_length`, of
  `response/p90_length`, max of `response/max_length`);
- the share of decode seconds spent at fewer than 8 active sequences
  (`rollout/low_concurrency_share`, weighted by each step's rollout seconds).

Prints a table (medians over repetitions) and one JSON line. Run on an idle machine:

    .venv/bin/python bench/long_batches.py --preset grpo-long --batches 32,64,128,256,512
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rlbatch.core.runlog import read_run

PHASES = ("rollout", "reward", "actor_update", "critic_values", "critic_update", "other")


def run_one(preset: str, group: int, batch: int, samples: int, seed: int, out: Path,
            extra: list[str]) -> Path:
    sets = [f"batch.prompts_per_step={batch // group}", f"budget.max_samples={samples}",
            "budget.stop_at_target=false", "eval.at_start=false",
            f"eval.every_samples={10 * samples}", "eval.prompts=8", "eval.k=1",
            "target.value=1.0", "target.gain=null", f"seed={seed}", *extra]
    cmd = [sys.executable, "-m", "rlbatch.cli.main", "train", "--preset", preset,
           "--out", str(out), "--json", *[x for s in sets for x in ("--set", s)]]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {done.stderr.strip().splitlines()[-1:]}")
    return Path(json.loads(done.stdout.strip().splitlines()[-1])["run_dir"])


def measure(run_dir: Path) -> dict:
    logged = read_run(run_dir).steps
    steps = logged[1:]  # the first step pays one-off allocation
    wall = logged[-1]["train_s"] - logged[0]["train_s"]
    samples = logged[-1]["samples"] - logged[0]["samples"]
    rollout = sum(r["time/rollout"] for r in steps)
    low = [r.get("rollout/low_concurrency_share") for r in steps]
    return {
        "q": samples / wall,
        "shares": {k: sum(r.get(f"time/{k}", 0.0) for r in steps) / wall for k in PHASES},
        "mean_length": statistics.fmean(r["response/mean_length"] for r in steps),
        "p50_length": statistics.median(r["response/p50_length"] for r in steps),
        "p90_length": statistics.median(r["response/p90_length"] for r in steps),
        "max_length": max(r["response/max_length"] for r in steps),
        "low_concurrency_share": (None if None in low else
                                  sum(s * r["time/rollout"] for s, r in zip(low, steps))
                                  / rollout),
        "steps": len(steps),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="grpo-long")
    ap.add_argument("--batches", default="32,64,128,256,512", help="B values (sequences)")
    ap.add_argument("--group", type=int, default=8, help="G, samples per prompt")
    ap.add_argument("--base", type=int, default=64, help="B0, for the q ratios")
    ap.add_argument("--samples", type=int, default=4096, help="samples per run")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--concurrency", default="preset",
                    help="decode concurrency C per run: 'preset' (the preset's), 'B' (C = B, "
                         "every sequence of a step decodes at once) or a number")
    ap.add_argument("--set", dest="extra", action="append", default=[],
                    help="extra config override for every run (repeatable)")
    args = ap.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    if args.base not in batches:
        ap.error(f"--base {args.base} must be one of --batches")
    results: dict[int, list[dict]] = {b: [] for b in batches}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            order = batches[rep % len(batches):] + batches[:rep % len(batches)]
            for b in order:
                extra = list(args.extra)
                if args.concurrency != "preset":
                    c = b if args.concurrency == "B" else int(args.concurrency)
                    extra.append(f"rollout.generation_concurrency={c}")
                run_dir = run_one(args.preset, args.group, b, args.samples, rep,
                                  Path(tmp) / f"r{rep}", extra)
                results[b].append(measure(run_dir))
                print(f"rep {rep} B={b}: q {results[b][-1]['q']:.1f} samples/s", flush=True)
    rows = []
    for b in batches:
        rs = results[b]
        med = {k: statistics.median(r[k] for r in rs) for k in
               ("q", "mean_length", "p50_length", "p90_length", "max_length")}
        lows = [r["low_concurrency_share"] for r in rs if r["low_concurrency_share"] is not None]
        rows.append({"B": b, **med, "q_all": [round(r["q"], 2) for r in rs],
                     "rollout_share": statistics.median(r["shares"]["rollout"] for r in rs),
                     "update_share": statistics.median(r["shares"]["actor_update"] for r in rs),
                     "low_concurrency_share": statistics.median(lows) if lows else None,
                     "steps": rs[0]["steps"]})
    q0 = next(r["q"] for r in rows if r["B"] == args.base)
    print(f"\n{args.preset}: median of {args.reps} repetitions, {args.samples} samples a run, "
          f"decode concurrency {args.concurrency}")
    print(f"{'B':>5} {'q':>8} {'q/q0':>6} {'rollout':>8} {'update':>7} {'<8 share':>9} "
          f"{'mean len':>9} {'p50':>5} {'p90':>5} {'max':>5}")
    for r in rows:
        r["q_ratio"] = r["q"] / q0
        low = "-" if r["low_concurrency_share"] is None else f"{r['low_concurrency_share']:.2f}"
        print(f"{r['B']:>5} {r['q']:>8.1f} {r['q_ratio']:>6.2f} {r['rollout_share']:>8.2f} "
              f"{r['update_share']:>7.2f} {low:>9} {r['mean_length']:>9.1f} "
              f"{r['p50_length']:>5.0f} {r['p90_length']:>5.0f} {r['max_length']:>5.0f}")
    print(json.dumps({"bench": "long_batches", "preset": args.preset, "base": args.base,
                      "concurrency": args.concurrency,
                      "samples": args.samples, "reps": args.reps, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
