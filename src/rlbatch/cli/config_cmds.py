"""`rlbatch config show|check|presets|reference` and `rlbatch lr-scale`."""

from __future__ import annotations

import sys

import typer
import yaml
from rich.console import Console
from rich.table import Table

from rlbatch.cli.common import PresetOption, SetOption, print_json, resolve, whole_numbers
from rlbatch.core.config import LR_EXPONENTS, scaled_lr
from rlbatch.core.errors import EXIT_USAGE, ConfigError, UserError
from rlbatch.core.loading import preset_names, preset_summary

config_app = typer.Typer(help="Resolve and validate configurations.", no_args_is_help=True)


@config_app.command("show")
def show(
    config: str | None = typer.Argument(None, help="YAML config file"),
    preset: str | None = PresetOption,
    set_: list[str] | None = SetOption,
    as_json: bool = typer.Option(False, "--json", help="print the resolved config as JSON"),
) -> None:
    """Print the resolved config, with derived values (B, updates per step, scaled LR)."""
    cfg = resolve(config, preset, set_)
    if as_json:
        print_json(cfg.resolved_dict())
    else:
        print(yaml.safe_dump(cfg.resolved_dict(), sort_keys=False), end="")


@config_app.command("check")
def check(
    config: str | None = typer.Argument(None, help="YAML config file"),
    preset: str | None = PresetOption,
    set_: list[str] | None = SetOption,
) -> None:
    """Validate a config, and what `rlbatch train` checks before it writes anything: the
    dataset, the reward function (imported, its signature bound), a local model folder, and
    eval.prompts against the held-out set. If anything is bad, exit 2 with one line per
    error, each naming its field or file:line."""
    try:
        cfg = resolve(config, preset, set_)
    except ConfigError as exc:
        for line in getattr(exc, "all_errors", None) or [str(exc)]:
            print(f"error: {line}", file=sys.stderr)
        raise typer.Exit(EXIT_USAGE)
    problems = _what_train_checks(cfg)
    for line in problems:
        print(f"error: {line}", file=sys.stderr)
    if problems:
        raise typer.Exit(EXIT_USAGE)
    print(f"ok: {cfg.algorithm} P={cfg.batch.prompts_per_step} G={cfg.batch.samples_per_prompt} "
          f"B={cfg.sequences_per_step} sequences, lr={cfg.actor_lr:.4g}")


def _what_train_checks(cfg) -> list[str]:
    """The errors `rlbatch train` would stop at before writing anything, beyond the config
    itself (the built-in tiny model is not built here); for a command trial, that its
    program and working directory exist."""
    from rlbatch.rollout.datasets import build_task, check_eval_prompts
    from rlbatch.rollout.models import resolve_model_path

    if cfg.backend == "command":  # the command's own model, data and reward: its program
        from rlbatch.backends.command.preflight import check_command
        from rlbatch.profile.trials import profile_prompts

        try:
            try:  # a profile's trials, where the config can be profiled
                prompts = profile_prompts(cfg)
            except UserError:
                prompts = None
            check_command(cfg, prompts)
        except UserError as exc:
            return [str(exc)]
        return []
    errors = []
    try:
        task = build_task(cfg.task)
        check_eval_prompts(task, cfg.eval.prompts, cfg.task.eval_path or cfg.task.path)
    except UserError as exc:
        errors.append(str(exc))
    if cfg.model != "tiny":
        try:
            resolve_model_path(cfg.model, cfg.task.name, cfg.task.digits)
        except UserError as exc:
            errors.append(str(exc))
    return errors


@config_app.command("presets")
def presets() -> None:
    """List the built-in presets, each with what it is for."""
    names = preset_names()
    width = max(len(n) for n in names)
    for name in names:
        print(f"{name:<{width}}  {preset_summary(name)}")


@config_app.command("reference")
def reference() -> None:
    """Every config key (type, default, what it is) and every command's options, as
    Markdown: docs/reference.md is this command's output."""
    from rlbatch.cli.main import app
    from rlbatch.cli.reference import reference_markdown

    sys.stdout.write(reference_markdown(app))


def lr_scale(
    reference_sequences: int = typer.Option(..., help="B0: sequences per step of the baseline"),
    reference_lr: float = typer.Option(..., help="eta0: learning rate at B0"),
    sequences: str = typer.Option(..., help="comma-separated candidate B values"),
    rule: str = typer.Option("sqrt", help="sqrt | linear | none"),
    as_json: bool = typer.Option(False, "--json", help="print the table as JSON"),
) -> None:
    """Table of learning rates eta(B) = eta0 * (B/B0)^p (p = 1/2, 1, 0 for sqrt, linear, none)."""
    if rule not in LR_EXPONENTS:
        raise ConfigError(f"--rule: unknown rule '{rule}'; use sqrt, linear or none")
    if reference_sequences <= 0 or reference_lr <= 0:
        raise ConfigError("--reference-sequences and --reference-lr must be positive")
    rows = [{"sequences": b, "lr": scaled_lr(reference_lr, reference_sequences, b, rule)}
            for b in whole_numbers(sequences, "--sequences")]
    if as_json:
        print_json({"rule": rule, "reference_sequences": reference_sequences,
                    "reference_lr": reference_lr, "rows": rows})
        return
    table = Table(title=f"lr_scaling={rule}: eta(B) = {reference_lr:g} * (B/{reference_sequences})"
                        f"^{LR_EXPONENTS[rule]:g}")
    table.add_column("sequences_per_step B", justify="right")
    table.add_column("B/B0", justify="right")
    table.add_column("lr", justify="right")
    for r in rows:
        table.add_row(str(r["sequences"]), f"{r['sequences'] / reference_sequences:g}",
                      f"{r['lr']:.4g}")
    Console().print(table)


def register(app: typer.Typer) -> None:
    app.add_typer(config_app, name="config")
    app.command("lr-scale")(lr_scale)
