"""An A/A bank: every configuration a profile of CONFIG runs, written from one known
distribution (no training), so that no candidate is faster than the baseline and any
recommendation `rlbatch replay` counts on it is a false one, every look of `next` included
(docs/analysis.md, "Replays": "Looks and A/A"). With `--t-ratio`, a planted bank: each
configuration's throughput divided by its given T ratio, curves unchanged (none departs).

Each run's accuracy rises linearly in samples, 0.30 + samples x 1e-5 / n, so with a target
gain g its N* is g x 1e5 x n; it trains at `--speed` x f samples per second. n and f are
log-normal with sds `--sd-nstar` and `--sd-q`, drawn independently for every configuration
and seed (same-seed runs are not correlated), the same distribution at every B: the true T
ratio of every configuration is 1 (or its `--t-ratio`). Runs are evaluated at every step
up to the budget, in the run-log format and with the configs `rlbatch bank` records.

  python bench/aa_bank.py bench/banks/no-saving.yaml --seeds 24 --out banks/aa
  rlbatch replay bench/banks/no-saving.yaml banks/aa --strategy full --replicates 300 --json
  python bench/aa_bank.py bench/banks/no-saving.yaml --seeds 48 --seed 21 \
      --t-ratio 1,0.85,0.70,0.76,1.0 --out banks/planted21

Prints one JSON line: the bank's folder, seeds and configurations.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from pathlib import Path

from rlbatch.core.loading import load_config
from rlbatch.core.runlog import RunWriter
from rlbatch.profile.bank import bank_trials


def step_row(step: int, samples: int, train_s: float) -> dict:
    return {"step": step, "samples": samples, "prompts": samples // 8, "tokens": samples * 5,
            "train_s": train_s, "time/rollout": 0.0, "time/reward": 0.0,
            "time/actor_update": 0.0, "time/critic_update": 0.0, "time/other": 0.0,
            "reward/mean": 0.0, "actor/lr": 1e-4, "actor/grad_norm": 1.0, "actor/loss": 0.0}


def write_run(t, budget: int, rise: float, speed: float, every_step: bool = True) -> None:
    """Trial `t`'s run: accuracy 0.30 + samples x `rise`, `speed` samples per second, steps
    up to `budget`, evaluated at every step (or every other one)."""
    b, d = t.sequences_per_step, t.run_dir()
    with RunWriter(d) as w:
        w.write_config(t.config.resolved_dict())
        w.write_manifest({"run_id": d.name, "seed": t.seed})
        w.log_eval({"step": 0, "samples": 0, "train_s": 0.0, "eval/accuracy": 0.30})
        k = 0
        while k * b < budget:
            k += 1
            s = k * b
            w.log_step(step_row(k, s, s / speed))
            if every_step or k % 2 == 0:
                w.log_eval({"step": k, "samples": s, "train_s": s / speed,
                            "eval/accuracy": 0.30 + s * rise})
        w.write_summary({"status": "budget_exhausted"})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("--seeds", type=int, default=24)
    ap.add_argument("--sd-nstar", type=float, default=0.2, help="sd of log N* per run")
    ap.add_argument("--sd-q", type=float, default=0.1, help="sd of log q per run")
    ap.add_argument("--speed", type=float, default=1000.0, help="median samples per second")
    ap.add_argument("--t-ratio", default="",
                    help="T ratios against the baseline, comma-separated, one per "
                         "configuration in the bank's order (the baseline first): a planted "
                         "difference in throughput; empty: every ratio 1 (A/A)")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    cfg = load_config(a.config)
    out = Path(a.out)
    trials = bank_trials(cfg, out, list(range(cfg.seed, cfg.seed + a.seeds)))
    per_seed = len(trials) // a.seeds
    ratios = [float(x) for x in a.t_ratio.split(",")] if a.t_ratio else [1.0] * per_seed
    if len(ratios) != per_seed or min(ratios) <= 0:
        ap.error(f"--t-ratio: {per_seed} positive ratios needed, one per configuration")
    out.mkdir(parents=True, exist_ok=False)
    rng = random.Random(a.seed)
    for i, t in enumerate(trials):
        n = math.exp(rng.gauss(0.0, a.sd_nstar))
        speed = a.speed * math.exp(rng.gauss(0.0, a.sd_q)) / ratios[i % per_seed]
        write_run(t, cfg.budget.max_samples, 1e-5 / n, speed)
    print(json.dumps({"bench": "aa_bank", "bank": str(out), "seeds": a.seeds,
                      "configurations": len(trials) // a.seeds,
                      "runs": len(trials)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
