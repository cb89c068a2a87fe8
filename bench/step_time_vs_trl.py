"""Step time of the built-in GRPO trainer against TRL's GRPOTrainer on the same workload.

Both trainers run the same config (default: `grpo-tiny`, the tiny model, 3-digit addition)
with the same P, G, max_new_tokens, scaled LR and one optimizer update per rollout step, no
evaluation and no intermediate checkpoints. They run side by side in one process and
alternate step by step: TRL drives its own loop (HF `Trainer`), and after each TRL step the
run-log callback (outside TRL's timed window) runs one built-in step, so machine noise hits
both alike. A step's time is its `steps.jsonl` wall time (the sum of its `time/*` phases);
the first --warmup steps of each are dropped; medians are reported, with the phase split
and the TRL / built-in ratio. Prints a table and one JSON line (last line).

Usage: python bench/step_time_vs_trl.py [--steps 20] [--prompts 16] [--samples-per-prompt 8]
       [--max-new-tokens 5] [--warmup 2] [--preset grpo-tiny] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile

import torch

from rlbatch.backends.builtin.trainer import Trainer
from rlbatch.backends.trl.run import TRLRun
from rlbatch.cli.common import resolve

PHASES = ("rollout", "reward", "actor_update", "reference", "other")


def _config(args, out: str, backend: str):
    b = args.prompts * args.samples_per_prompt
    sets = [f"batch.prompts_per_step={args.prompts}",
            f"batch.samples_per_prompt={args.samples_per_prompt}",
            "batch.minibatches_per_step=1", "batch.epochs_per_step=1",
            f"rollout.max_new_tokens={args.max_new_tokens}",
            f"budget.max_samples={args.steps * b}", "budget.stop_at_target=false",
            "eval.at_start=false", f"eval.every_samples={10 * args.steps * b}",
            *args.set, f"backend={backend}", f"output_dir={out}"]
    return resolve(None, args.preset, sets)


def _summarize(rows: list[dict], warmup: int) -> dict:
    steady = rows[warmup:]
    walls = [sum(r.get(f"time/{p}", 0.0) for p in PHASES) for r in steady]
    med = statistics.median(walls)
    return {
        "steps_timed": len(steady),
        "median_step_s": med,
        "phases_median_s": {p: statistics.median(r.get(f"time/{p}", 0.0) for r in steady)
                            for p in PHASES},
        "samples_per_s": rows[0]["samples"] / med,
        "mean_response_tokens": statistics.fmean(r["response/mean_length"] for r in steady),
        "first_step_s": sum(rows[0].get(f"time/{p}", 0.0) for p in PHASES),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--prompts", type=int, default=16, help="P")
    ap.add_argument("--samples-per-prompt", type=int, default=8, help="G")
    ap.add_argument("--max-new-tokens", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2, help="steps dropped from each backend")
    ap.add_argument("--preset", default="grpo-tiny")
    ap.add_argument("--set", action="append", default=[], help="extra config overrides")
    args = ap.parse_args()
    if args.steps <= args.warmup:
        ap.error("--steps must exceed --warmup")
    rows: dict[str, list[dict]] = {"builtin": [], "trl": []}
    with tempfile.TemporaryDirectory(prefix="rlbatch-bench-") as out:
        builtin = Trainer(_config(args, out, "builtin"), fresh=True)

        def after_trl_step(kind: str, row: dict) -> None:
            if kind != "step":
                return
            rows["trl"].append(row)
            b_row = builtin._step()  # one built-in step, outside TRL's timed window
            builtin.state.log_step(b_row)
            rows["builtin"].append(b_row)

        trl = TRLRun(_config(args, out, "trl"), fresh=True, callback=after_trl_step)
        trl.run()
        builtin.state.finish()
    cfg = trl.cfg
    res = {k: _summarize(v, args.warmup) for k, v in rows.items()}
    ratio = res["trl"]["median_step_s"] / res["builtin"]["median_step_s"]
    print(f"P={cfg.batch.prompts_per_step} G={cfg.batch.samples_per_prompt} "
          f"B={cfg.sequences_per_step} max_new_tokens={cfg.rollout.max_new_tokens} "
          f"lr={cfg.actor_lr:.3g} steps={args.steps} (first {args.warmup} dropped) "
          f"threads={torch.get_num_threads()}")
    head = ["backend", "median step s", *[f"{p} s" for p in PHASES], "samples/s", "resp tok"]
    print("  ".join(f"{h:>13}" for h in head))
    for name, r in res.items():
        cells = [name, f"{r['median_step_s']:.4f}",
                 *[f"{r['phases_median_s'][p]:.4f}" for p in PHASES],
                 f"{r['samples_per_s']:.0f}", f"{r['mean_response_tokens']:.2f}"]
        print("  ".join(f"{c:>13}" for c in cells))
    print(f"TRL / built-in median step time: {ratio:.2f}x")
    print(json.dumps({"bench": "step_time_vs_trl", "preset": args.preset,
                      "prompts_per_step": cfg.batch.prompts_per_step,
                      "samples_per_prompt": cfg.batch.samples_per_prompt,
                      "sequences_per_step": cfg.sequences_per_step,
                      "max_new_tokens": cfg.rollout.max_new_tokens, "actor_lr": cfg.actor_lr,
                      "steps": args.steps, "warmup": args.warmup,
                      "threads": torch.get_num_threads(), "device": trl.device,
                      "trl_over_builtin": ratio, **res}))


if __name__ == "__main__":
    main()
