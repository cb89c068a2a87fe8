"""`rlbatch ingest FRAMEWORK PATH --out RUN_DIR`: another framework's log as an rlbatch run.

Thin: parse -> check the flags -> `interop.ingest.ingest` (converts, writes atomically) ->
print a one-line summary (warnings on stderr), or with `--json` the summary as the last stdout
line. A numeric flag out of its range (P, G, counts below 1, a non-finite or non-positive LR,
a negative seed; the same upper bounds as the config's) is one line naming the flag, exit 2,
before anything is read or written: a `--samples-per-prompt 0` would otherwise become a run
with B = 0 that `analyze` ranks like any other.
"""

from __future__ import annotations

import math
import sys

import typer

from rlbatch.cli.common import print_json
from rlbatch.core.errors import ConfigError
from rlbatch.core.schema import MAX_COUNT, MAX_PROMPTS, MAX_SEQUENCES
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
    check_flags(locals())  # the flags as given, before anything is read or written
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


# flag -> (smallest, largest) for whole numbers; LRs are checked as finite, > 0 and <= 10
_INT_FLAGS = {"prompts_per_step": (1, MAX_PROMPTS), "samples_per_prompt": (1, MAX_COUNT),
              "num_processes": (1, MAX_COUNT), "updates_per_step": (1, MAX_COUNT),
              "reference_sequences": (1, MAX_SEQUENCES), "seed": (0, 2**32 - 1)}
_LR_FLAGS = ("lr", "reference_lr")
MAX_LR = 10.0  # as the config's optimizer.lr bound
ALGORITHMS = ("grpo", "ppo")


def check_flags(flags: dict) -> None:
    """A ConfigError naming the first numeric (or algorithm / reward-key) flag that is out of
    range; None-valued flags were not given and are skipped."""
    def bad(name: str, why: str, value) -> ConfigError:
        return ConfigError(f"--{name.replace('_', '-')}: {why}, got {value!r}")

    for name, (low, high) in _INT_FLAGS.items():
        value = flags.get(name)
        if value is not None and not low <= value <= high:
            raise bad(name, f"must be a whole number from {low} to {high:,}", value)
    for name in _LR_FLAGS:
        value = flags.get(name)
        if value is not None and not (math.isfinite(value) and 0 < value <= MAX_LR):
            raise bad(name, f"must be a finite learning rate > 0 and <= {MAX_LR:g}", value)
    p, g = flags.get("prompts_per_step"), flags.get("samples_per_prompt")
    if p is not None and g is not None and p * g > MAX_SEQUENCES:
        raise ConfigError(f"--prompts-per-step x --samples-per-prompt = {p * g:,} sequences per "
                          f"step is more than {MAX_SEQUENCES:,}")
    if flags.get("algorithm") is not None and flags["algorithm"] not in ALGORITHMS:
        raise bad("algorithm", f"use one of {', '.join(ALGORITHMS)}", flags["algorithm"])
    if flags.get("reward_key") is not None and not flags["reward_key"].strip():
        raise bad("reward_key", "must name a logged key", flags["reward_key"])


def register(app: typer.Typer) -> None:
    app.command("ingest")(ingest)
