"""Banks of run logs written from known curves (no training), in the run-log format with the
configs `rlbatch bank` records (`bank_trials`): what tests of `rlbatch replay` and of the
replay table read."""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

from rlbatch.profile.bank import bank_trials

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from aa_bank import step_row, write_run  # one writer for runs made from known curves

__all__ = ["step_row", "write_bank"]


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
        write_run(t, cfg.budget.max_samples, 1e-4 / n, speed[b] / f, every_step)
