"""`rlbatch model build`: build (or load from cache) the warm-started tiny default model, or
with `--random` a randomly initialized throughput-only model (`rollout.random_model`)."""

from __future__ import annotations

import typer
from rich.console import Console

from rlbatch.cli.common import print_json

model_app = typer.Typer(help="The built-in tiny default model and random throughput models.",
                        no_args_is_help=True)
err = Console(stderr=True)


@model_app.command("build")
def build(
    task: str = typer.Option("addition", help="built-in task: addition | reverse | runsum"),
    digits: int = typer.Option(None, help="difficulty (default 3 for addition, 6 for reverse, "
                                "1 digit per item for runsum)"),
    force: bool = typer.Option(False, "--force", help="rebuild even if cached"),
    as_json: bool = typer.Option(False, "--json", help="print the model's path and build "
                                 "record as JSON"),
    path_only: bool = typer.Option(False, "--path", help="print only the model's folder "
                                   "(for a shell variable: MODEL=$(rlbatch model build --path))"),
    random: bool = typer.Option(False, "--random", help="a randomly initialized Llama for "
                                "throughput figures only (no SFT, no download)"),
    size: str = typer.Option(None, help="with --random: tiny | 0.5b (default tiny)"),
    layout: str = typer.Option(None, help="with --random: hidden=..,layers=..,heads=..,"
                               "kv_heads=..,mlp=..,vocab=..[,tie=1]"),
    dtype: str = typer.Option("float32", help="with --random: saved dtype, float32 | bfloat16"),
    seed: int = typer.Option(0, help="with --random: initialization seed"),
    out: str = typer.Option(None, help="with --random: write here instead of the cache"),
) -> None:
    """Build the tiny Llama model + tokenizer offline and warm-start it on the task by SFT
    until held-out accuracy is in the warm-start band; print parameters, time, accuracy.
    With --random: build a random model of --size or --layout instead (throughput only)."""
    if random and path_only:
        from rlbatch.core.errors import ConfigError

        raise ConfigError("--path: for the tiny model only; with --random use --json")
    if random:
        _build_random(size, layout, dtype, seed, out, force, as_json)
        return
    if size or layout or out:
        from rlbatch.core.errors import ConfigError

        raise ConfigError("--size, --layout and --out need --random")
    _build_tiny(task, digits, force, "path" if path_only else "json" if as_json else "text")


def _build_tiny(task: str, digits: int | None, force: bool, show: str) -> None:
    """`rlbatch model build` without --random: the warm-started tiny model of `task`."""
    import shutil

    from rlbatch.core.config import DEFAULT_DIGITS
    from rlbatch.core.errors import ConfigError
    from rlbatch.rollout.tiny_model import cache_root, read_build_facts, recipe_for, tiny_model_path

    if task not in DEFAULT_DIGITS:
        raise ConfigError(f"--task: unknown built-in task '{task}'; use addition, reverse "
                          "or runsum")
    recipe = recipe_for(task, digits or DEFAULT_DIGITS[task])
    target = cache_root() / "models" / recipe.key()
    if force and target.exists():
        shutil.rmtree(target)
    cached = (target / "rlbatch_build.json").exists()
    with err.status(f"building tiny model for {task} ({recipe.digits} digits)...") as status:
        def progress(step: int, loss: float, acc: float | None) -> None:
            extra = f", held-out accuracy {acc:.3f}" if acc is not None else ""
            status.update(f"SFT step {step}: loss {loss:.3f}{extra}")
        path = tiny_model_path(recipe, progress=progress)
    facts = read_build_facts(path)
    out = {"path": str(path), "cached": cached, "task": task, "digits": recipe.digits,
           "parameters": facts["parameters"], "build_s": facts["build_s"],
           "sft_steps": facts["sft_steps"], "accuracy": facts["accuracy"],
           "eval_prompts": facts["eval_prompts"], "in_band": facts["in_band"],
           "band": [recipe.band_low, recipe.band_high],
           "position_accuracy": facts["position_accuracy_1024"]}
    if show == "path":
        print(path)
        return
    if show == "json":
        print_json(out)
        return
    print(f"model: {path}{' (cached)' if cached else ''}\n"
          f"parameters: {out['parameters']:,}  build: {out['build_s']:.1f} s  "
          f"SFT steps: {out['sft_steps']}\n"
          f"starting accuracy: {out['accuracy']:.3f} on {out['eval_prompts']} held-out prompts "
          f"(band {recipe.band_low}-{recipe.band_high}, in band: {out['in_band']})\n"
          f"per-position accuracy: {[round(x, 3) for x in out['position_accuracy']]}")


def _build_random(size, layout, dtype, seed, out, force, as_json) -> None:
    from pathlib import Path

    from rlbatch.rollout.random_model import layout_for, random_model_path
    from rlbatch.rollout.tiny_model import read_build_facts

    name, lay = layout_for(size, layout)
    with err.status(f"building random {name} model..."):
        path, cached = random_model_path(name, lay, seed=seed, dtype=dtype,
                                         out=Path(out) if out else None, force=force)
    facts = read_build_facts(path)
    result = {"path": str(path), "cached": cached, "random": True, "size": name,
              "layout": facts["layout"], "dtype": facts["dtype"], "seed": facts["seed"],
              "parameters": facts["parameters"], "build_s": facts["build_s"]}
    if as_json:
        print_json(result)
        return
    lay_text = ", ".join(f"{k} {v}" for k, v in facts["layout"].items())
    print(f"model: {path}{' (cached)' if cached else ''}\n"
          f"random {name} ({facts['dtype']}, seed {facts['seed']}): {lay_text}\n"
          f"parameters: {facts['parameters']:,}  build: {facts['build_s']:.1f} s "
          "(throughput figures only: the weights are untrained)")


def register(app: typer.Typer) -> None:
    app.add_typer(model_app, name="model")
