"""`rlbatch ingest FRAMEWORK PATH --out RUN_DIR`: another framework's log as an rlbatch run.

Thin: parse -> `interop.ingest.ingest` (converts, writes atomically) -> print a one-line
summary (warnings on stderr), or with `--json` the summary as the last stdout line.
"""

from __future__ import annotations

import sys

import typer

from rlbatch.cli.common import print_json
from rlbatch.interop.ingest import IngestOptions
from rlbatch.interop.ingest import ingest as ingest_log


def ingest(
    framework: str = typer.Argument(..., help="verl | openrlhf | trl | prime-rl"),
    path: str = typer.Argument(..., help="verl file-logger JSONL; OpenRLHF/TRL TensorBoard dir or "
                               "event file; TRL trainer_state.json (or its checkpoint dir); "
                               "prime-rl metrics.jsonl (or a dir holding them)"),
    out: str = typer.Option(..., "--out", help="run directory to create"),
    prompts_per_step: int | None = typer.Option(None, help="P: prompts per rollout step"),
    samples_per_prompt: int | None = typer.Option(None, help="G: samples per prompt"),
    lr: float | None = typer.Option(None, help="the actor learning rate the run used"),
    seed: int | None = typer.Option(None, help="the run's seed"),
    config: str | None = typer.Option(None, help="the run's own config file (read for P, G, LR)"),
    num_processes: int = typer.Option(1, help="TRL: training processes (with --config)"),
    updates_per_step: int | None = typer.Option(
        None, help="TRL: optimizer steps per generation batch (default 1, or from --config)"),
    reward_key: str | None = typer.Option(None, help="source key to use as reward/mean"),
    algorithm: str | None = typer.Option(None, help="grpo | ppo (default: from the log)"),
    lr_scaling: str | None = typer.Option(None, help="sqrt | linear | none, if the LR was scaled"),
    reference_sequences: int | None = typer.Option(None, help="B0 the LR was scaled from"),
    reference_lr: float | None = typer.Option(None, help="eta0 at B0"),
    force: bool = typer.Option(False, "--force", help="replace RUN_DIR if it exists"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON"),
) -> None:
    """Convert a verl / OpenRLHF / TRL / prime-rl log into steps.jsonl, evals.jsonl,
    config.yaml, manifest.json and summary.json (written atomically)."""
    opts = IngestOptions(
        prompts_per_step=prompts_per_step, samples_per_prompt=samples_per_prompt, lr=lr,
        seed=seed, config=config, num_processes=num_processes, updates_per_step=updates_per_step,
        reward_key=reward_key, algorithm=algorithm, lr_scaling=lr_scaling,
        reference_sequences=reference_sequences, reference_lr=reference_lr)
    summary = ingest_log(framework, path, out, opts, force=force)
    for w in summary["ingest"]["warnings"]:
        print(f"warning: {w}", file=sys.stderr)
    if as_json:
        print_json(summary)
        return
    train_s = summary.get("train_s")
    print(f"ingested {framework} log {path} -> {summary['run_dir']}: "
          f"{summary['ingest']['step_rows']} steps, {summary['ingest']['eval_rows']} evaluations, "
          f"{summary.get('samples', 0):,} samples"
          + (f", {train_s:.1f} training seconds" if isinstance(train_s, (int, float)) else ""))


def register(app: typer.Typer) -> None:
    app.command("ingest")(ingest)
