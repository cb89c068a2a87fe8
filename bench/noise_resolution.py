"""Is the gradient noise scale good enough to steer a batch schedule by? (issue 31, build 4)

For each workload and each B an adaptive ramp passes through, one run from the warm start
with `noise_scale.enabled`, and per run: in how many steps the smoothed B_simple was resolved
(|G|^2 > 0, so B_simple is defined), its median over the second half, its median ratio to the
optimizer minibatch (what the adaptive rule compares with `threshold`), how many steps the
rule's condition (ratio >= 1, resolved) held, and the longest such run of steps (what
`patience` waits for).

    python bench/noise_resolution.py                               # all three workloads
    python bench/noise_resolution.py --workloads grpo-tiny --samples 4096

Prints a table and one JSON line; the runs go to a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# workload -> (preset, G, the ramp's sizes B, micro-batch)
WORKLOADS = {
    "grpo-tiny": ("grpo-tiny", 8, [32, 64, 128, 256, 512, 1024], 16),
    "ppo-tiny": ("ppo-tiny", 8, [32, 64, 128, 256, 512, 1024], 16),
    "grpo-long": ("grpo-long", 8, [16, 32, 64, 128, 256], 8),
}


def one(preset: str, g: int, b: int, micro: int, samples: int, seed: int, out: Path) -> dict:
    sets = [f"batch.prompts_per_step={b // g}", "noise_scale.enabled=true",
            f"batch.micro_batch_sequences={micro}", f"budget.max_samples={samples}",
            "budget.stop_at_target=false", f"eval.every_samples={samples}", f"seed={seed}"]
    cmd = [sys.executable, "-m", "rlbatch.cli.main", "train", "--preset", preset, "--out",
           str(out), "--json", *[w for s in sets for w in ("--set", s)]]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise SystemExit(f"{preset} B={b}: {res.stderr.strip()[-500:]}")
    run_dir = Path(json.loads(res.stdout.strip().splitlines()[-1])["run_dir"])
    rows = [json.loads(x) for x in (run_dir / "steps.jsonl").read_text().splitlines()]
    out_row = {"preset": preset, "B": b, "steps": len(rows)}
    for role in ("actor", "critic"):
        key = f"{role}/noise_scale"
        if not any(key in r for r in rows):
            continue
        values = [r.get(key) for r in rows]
        ok = [v is not None and math.isfinite(v) and v > 0 for v in values]
        second = [v for v, o in zip(values[len(values) // 2:], ok[len(ok) // 2:]) if o]
        met = [o and v >= b for v, o in zip(values, ok)]  # minibatch = B (one update per step)
        longest = run = 0
        for m in met:
            run = run + 1 if m else 0
            longest = max(longest, run)
        out_row[role] = {"resolved": sum(ok), "median_2nd_half": statistics.median(second)
                         if second else None,
                         "median_ratio": statistics.median(v / b for v, o in zip(values, ok)
                                                           if o) if any(ok) else None,
                         "condition_steps": sum(met), "longest_streak": longest}
    return out_row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--samples", type=int, default=8192, help="samples per run")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    results = []
    print(f"{'workload':>10} {'B':>5} {'steps':>5}  {'role':>6} {'resolved':>9} "
          f"{'B_simple 2nd half':>17} {'ratio':>6} {'cond':>5} {'streak':>6}", flush=True)
    with tempfile.TemporaryDirectory(prefix="rlbatch-noise-") as tmp:
        for name in args.workloads.split(","):
            preset, g, sizes, micro = WORKLOADS[name]
            for b in sizes:
                r = one(preset, g, b, micro, args.samples, args.seed, Path(tmp) / name)
                results.append(r)
                for role in ("actor", "critic"):
                    x = r.get(role)
                    if x is None:
                        continue
                    med = "-" if x["median_2nd_half"] is None else f"{x['median_2nd_half']:.0f}"
                    ratio = "-" if x["median_ratio"] is None else f"{x['median_ratio']:.2f}"
                    print(f"{name:>10} {b:>5} {r['steps']:>5}  {role:>6} "
                          f"{x['resolved']:>4}/{r['steps']:<4} {med:>17} {ratio:>6} "
                          f"{x['condition_steps']:>5} {x['longest_streak']:>6}", flush=True)
    print(json.dumps({"bench": "noise_resolution", "samples": args.samples, "seed": args.seed,
                      "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
