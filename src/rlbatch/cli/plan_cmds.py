"""`rlbatch plan`: a batch-size sweep's settings for verl, OpenRLHF, TRL or prime-rl.

Thin: parse the flags (or read the framework's config file with `--base`), call
`interop.plan.make_plan`, print a table plus each candidate's overrides, or with `--json` one
JSON document as the last stdout line.
"""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from rlbatch.cli.common import print_json, whole_numbers
from rlbatch.interop.ingest import read_framework_config
from rlbatch.interop.plan import fmt, make_plan, merge_base


def render(doc: dict) -> None:
    """Table of candidates, then each candidate's settings, notes and the warnings."""
    base = doc["base"]
    console = Console()
    table = Table(title=f"{doc['framework']}: lr_scaling={doc['rule']}, eta = {fmt(base['lr'])} "
                        f"x (B/{base['sequences_per_step']})^{doc['exponent']:g}")
    for col in ("P prompts", "G", "B", "B/B0", "lr", "updates", "warm-up"):
        table.add_column(col, justify="right")
    for c in doc["candidates"]:
        table.add_row(str(c["prompts_per_step"]), str(c["samples_per_prompt"]),
                      str(c["sequences_per_step"]), f"{c['batch_ratio']:g}", fmt(c["lr"]),
                      f"{c['updates_per_step']:g}",
                      "-" if c["warmup_steps"] is None else str(c["warmup_steps"]))
    console.print(table)
    for c in doc["candidates"]:
        print(f"P={c['prompts_per_step']}:")
        for arg in c["args"]:
            print(f"  {arg}")
        for note in c["notes"]:
            print(f"  note: {note}")
    for w in doc["warnings"]:
        print(f"warning: {w}")


def plan(
    framework: str = typer.Option(..., "--framework", help="verl | openrlhf | trl | prime-rl"),
    prompts: str = typer.Option(..., help="comma-separated candidate prompts per rollout step P"),
    base_prompts: int | None = typer.Option(None, help="P0: prompts per rollout step of the base"),
    samples_per_prompt: int | None = typer.Option(None, help="G: samples per prompt (kept)"),
    base_lr: float | None = typer.Option(None, help="eta0: the base's actor learning rate"),
    rule: str = typer.Option("sqrt", help="sqrt | linear | none"),
    mini_batch_prompts: int | None = typer.Option(
        None, help="the base's prompts per optimizer update (default: the whole batch)"),
    base: str | None = typer.Option(
        None, "--base", help="the framework's config file to read the base from (verl YAML or "
        "Hydra overrides, OpenRLHF .sh, TRL GRPOConfig YAML/JSON, prime-rl TOML); flags given "
        "as well override it"),
    num_processes: int | None = typer.Option(None, help="TRL: training processes (GPUs)"),
    per_device_batch: int | None = typer.Option(
        None, help="TRL: per_device_train_batch_size, in completions"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
) -> None:
    """Per-candidate overrides with the LR scaled by eta0 (B/B0)^p and batch units converted."""
    file_config = None
    if base is not None:
        file_config = read_framework_config(framework, base, num_processes or 1)
    base_cfg = merge_base(framework, file_config, base_prompts, samples_per_prompt, base_lr,
                          mini_batch_prompts)
    doc = make_plan(base_cfg, whole_numbers(prompts, "--prompts"), rule,
                    num_processes=num_processes, per_device_batch=per_device_batch)
    if as_json:
        print_json(doc)
    else:
        render(doc)


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)
