"""The tiny model's build with and without screened checks, side by side.

Builds the default recipe twice in fresh folders, once as it is (checks far below the band
screen `screen_prompts` held-out prompts) and once with `screen_prompts=0` (every check on
all `check_prompts`), in alternating order over `--reps` rounds, and prints each build's
wall time, accepted SFT step and accuracy, then one JSON line. The two builds train the same
trajectory; what differs is the cost of the checks and, where a screen misses the start of
the jump, when the checks near the band come.

    .venv/bin/python bench/tiny_build.py [--reps 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from rlbatch.rollout.tiny_model import TinyRecipe, build_tiny


def build(recipe: TinyRecipe) -> dict:
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        facts = build_tiny(recipe, Path(tmp) / "model")
    return {"wall_s": time.perf_counter() - start, "sft_steps": facts["sft_steps"],
            "accuracy": facts["accuracy"], "checks": len(facts["history"]),
            "screened": sum(h["prompts"] < recipe.check_prompts for h in facts["history"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=1, help="rounds of the two builds (default 1)")
    args = ap.parse_args()
    recipes = {"screened": TinyRecipe(), "full checks": replace(TinyRecipe(), screen_prompts=0)}
    runs: dict[str, list[dict]] = {k: [] for k in recipes}
    for rep in range(args.reps):
        order = list(recipes) if rep % 2 == 0 else list(recipes)[::-1]
        for name in order:
            r = build(recipes[name])
            runs[name].append(r)
            print(f"{name:12s} {r['wall_s']:6.1f} s  accepted at SFT step {r['sft_steps']}, "
                  f"accuracy {r['accuracy']:.3f}, {r['checks']} checks ({r['screened']} "
                  "screened)", flush=True)
    med = {k: statistics.median(r["wall_s"] for r in v) for k, v in runs.items()}
    same = all(a["sft_steps"] == b["sft_steps"] and a["accuracy"] == b["accuracy"]
               for a, b in zip(runs["screened"], runs["full checks"]))
    print(f"median build: screened {med['screened']:.1f} s, full checks "
          f"{med['full checks']:.1f} s (ratio {med['screened'] / med['full checks']:.2f}); "
          f"same accepted model: {same}")
    print(json.dumps({"bench": "tiny_build", "reps": args.reps,
                      "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                      "threads": torch.get_num_threads(),
                      "median_s": {k: round(v, 1) for k, v in med.items()},
                      "ratio": round(med["screened"] / med["full checks"], 3),
                      "same_accepted_model": same, "runs": runs}))


if __name__ == "__main__":
    main()
