"""Rollouts decoded ahead of the update: is the overlap real? (docs/benchmarks.md, "Stale
rollouts")

Trains the quick-saving workload at B0 = 64 (0.25 s of rollout latency per step) for
--steps steps at rollout.max_staleness 0 and then 1, with the machine's threads (at 1 the
update and the decoding worker get half each), and reads each run's own phase timers. Per
step at staleness 1: the step's wall time against the larger of its batch's decoding,
latency included (`rollout/decode_s`, timed on the worker), and the rest of the step (its
wall time less what it waited for the batch: reward, update, other). Run concurrently the
two overlap and the ratio is near 1; run one after the other they would add. Also the
median step time at 0 and at 1, and their ratio. The first --warmup steps are left out.

  python bench/overlap.py --steps 40
  python bench/overlap.py --steps 40 --set rollout.simulated_latency_s=0

Prints a table and one JSON line.
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


def train(out: Path, k: int, steps: int, sets: list[str]) -> list[dict]:
    samples = 64 * steps
    flags = ["batch.prompts_per_step=8", f"budget.max_samples={samples}", "budget.stop_at_target=false",
             f"eval.every_samples={samples}", f"checkpoint.every_samples={samples}",
             f"rollout.max_staleness={k}", *sets]
    cmd = [sys.executable, "-m", "rlbatch.cli.main", "train", "--preset", "quick-saving",
           "--out", str(out), "--json", *[x for f in flags for x in ("--set", f)]]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    return read_run(run).steps


def walls(rows: list[dict]) -> list[float]:
    out, before = [], 0.0
    for r in rows:
        out.append(r["train_s"] - before)
        before = r["train_s"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--set", action="append", default=[], help="a config override, a.b=c")
    args = ap.parse_args()
    if args.steps <= args.warmup + 2:
        ap.error("--steps must exceed --warmup by at least 3")
    with tempfile.TemporaryDirectory() as tmp:
        sync = train(Path(tmp) / "k0", 0, args.steps, args.set)
        ahead = train(Path(tmp) / "k1", 1, args.steps, args.set)
    w0, w1 = walls(sync)[args.warmup:], walls(ahead)[args.warmup:]
    rows = ahead[args.warmup:]
    decode = [r["rollout/decode_s"] for r in rows]
    rest = [w - r["time/rollout"] for w, r in zip(w1, rows)]
    ratio = [w / max(d, s) for w, d, s in zip(w1, decode, rest)]
    med = statistics.median
    fig = {"steps": len(rows), "median_step_s_staleness_0": med(w0),
           "median_step_s_staleness_1": med(w1), "step_time_ratio_1_over_0": med(w1) / med(w0),
           "median_decode_s": med(decode), "median_rest_s": med(rest),
           "median_wait_s": med(r["time/rollout"] for r in rows),
           "median_step_over_max": med(ratio), "max_step_over_max": max(ratio),
           "share_within_15pct": sum(x <= 1.15 for x in ratio) / len(ratio),
           "sets": args.set}
    print(f"{'':38}{'median':>10}")
    print(f"{'step time, staleness 0 (s)':38}{fig['median_step_s_staleness_0']:>10.3f}")
    print(f"{'step time, staleness 1 (s)':38}{fig['median_step_s_staleness_1']:>10.3f}")
    print(f"{'  its batch decoding + latency (s)':38}{fig['median_decode_s']:>10.3f}")
    print(f"{'  the rest of the step (s)':38}{fig['median_rest_s']:>10.3f}")
    print(f"{'  the wait for its batch (s)':38}{fig['median_wait_s']:>10.3f}")
    print(f"{'step / max(decode, rest)':38}{fig['median_step_over_max']:>10.3f}"
          f"  (max {fig['max_step_over_max']:.3f}; {fig['share_within_15pct']:.0%} of steps "
          "within 15%)")
    print(f"{'step time ratio, 1 over 0':38}{fig['step_time_ratio_1_over_0']:>10.3f}")
    print(json.dumps({"bench": "overlap", **fig}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
