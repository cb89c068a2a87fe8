"""Banks of run logs written from known curves (no training), in the run-log format with the
configs `rlbatch bank` records (`bank_trials`): what tests of `rlbatch replay` and of the
replay table read."""

from __future__ import annotations

import math
import random
from pathlib import Path

from rlbatch.core.runlog import RunWriter
from rlbatch.profile.bank import bank_trials


def step_row(step: int, samples: int, train_s: float) -> dict:
    return {"step": step, "samples": samples, "prompts": samples // 8, "tokens": samples * 5,
            "train_s": train_s, "time/rollout": 0.0, "time/reward": 0.0,
            "time/actor_update": 0.0, "time/critic_update": 0.0, "time/other": 0.0,
            "reward/mean": 0.0, "actor/lr": 1e-4, "actor/grad_norm": 1.0, "actor/loss": 0.0}


def write_bank(cfg, bank: Path, seeds, speed: dict[int, float], rate: dict[int, float] | None = None,
               every_step: bool = True):
    """Bank runs of `cfg`'s configurations: accuracy 0.30 + samples x 1e-4 / n (a gain g
    over step 0 at g x 10,000 n samples; n the seed's factor times `rate[B]`), `speed[B]`
    samples per second times the seed's factor; each run evaluated at every step (or every
    other one) up to the budget."""
    rng = random.Random(7)
    noise = {s: (math.exp(rng.gauss(0, 0.15)), math.exp(rng.gauss(0, 0.1))) for s in seeds}
    for t in bank_trials(cfg, bank, list(seeds)):
        b = t.sequences_per_step
        n, f = noise[t.seed]
        n *= (rate or {}).get(b, 1.0)
        d = t.run_dir()
        with RunWriter(d) as w:
            w.write_config(t.config.resolved_dict())
            w.write_manifest({"run_id": d.name, "seed": t.seed})
            w.log_eval({"step": 0, "samples": 0, "train_s": 0.0, "eval/accuracy": 0.30})
            k = 0
            while k * b < cfg.budget.max_samples:
                k += 1
                s = k * b
                w.log_step(step_row(k, s, s / speed[b] * f))
                if every_step or k % 2 == 0:
                    w.log_eval({"step": k, "samples": s, "train_s": s / speed[b] * f,
                                "eval/accuracy": 0.30 + s * 1e-4 / n})
            w.write_summary({"status": "budget_exhausted"})
