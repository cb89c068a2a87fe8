"""Render eval curves of run directories to a PNG and print them as a markdown table.

Usage: python bench/plot_runs.py OUT.png RUN_OR_SWEEP_DIR... [--metric eval/accuracy]
The x-axis is cumulative samples (docs/design.md); one line per run, labelled by B and LR.
"""

from __future__ import annotations

import argparse

from rlbatch.core.runlog import find_runs, read_run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--metric", default="eval/accuracy")
    ap.add_argument("--title", default="")
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for d in find_runs(args.paths):
        run = read_run(d)
        rows = [e for e in run.evals if e.get(args.metric) is not None]
        der = run.config.get("derived", {})
        label = (f"{run.config.get('algorithm')} B={der.get('sequences_per_step')} "
                 f"lr={der.get('actor_lr', 0):.3g} {run.config.get('optimizer', {}).get('lr_scaling')} seed {run.config.get('seed')}")
        xs, ys = [e["samples"] for e in rows], [e[args.metric] for e in rows]
        ax.plot(xs, ys, marker="o", ms=3, label=label)
        print(f"\n{label} ({d.name})\n\n| samples | train_s | {args.metric} |\n|---:|---:|---:|")
        for e in rows:
            print(f"| {e['samples']:,} | {e['train_s']:.1f} | {e[args.metric]:.3f} |")
    ax.set_xlabel("cumulative samples")
    ax.set_ylabel(args.metric)
    ax.set_title(args.title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)


if __name__ == "__main__":
    main()
