"""`rlbatch model build`: build (or load from cache) the warm-started tiny default model."""

from __future__ import annotations

import typer
from rich.console import Console

from rlbatch.cli.common import print_json

model_app = typer.Typer(help="The built-in tiny default model.", no_args_is_help=True)
err = Console(stderr=True)


@model_app.command("build")
def build(
    task: str = typer.Option("addition", help="built-in task: addition | reverse"),
    digits: int = typer.Option(None, help="difficulty (default 3 for addition, 6 for reverse)"),
    force: bool = typer.Option(False, "--force", help="rebuild even if cached"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Build the tiny Llama model + tokenizer offline and warm-start it on the task by SFT
    until held-out accuracy is in the warm-start band; print parameters, time, accuracy."""
    import shutil

    from rlbatch.core.config import DEFAULT_DIGITS
    from rlbatch.core.errors import ConfigError
    from rlbatch.rollout.tiny_model import (TinyRecipe, cache_root, read_build_facts,
                                            tiny_model_path)

    if task not in DEFAULT_DIGITS:
        raise ConfigError(f"--task: unknown built-in task '{task}'; use addition or reverse")
    recipe = TinyRecipe(task=task, digits=digits or DEFAULT_DIGITS[task])
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
    if as_json:
        print_json(out)
        return
    print(f"model: {path}{' (cached)' if cached else ''}\n"
          f"parameters: {out['parameters']:,}  build: {out['build_s']:.1f} s  "
          f"SFT steps: {out['sft_steps']}\n"
          f"starting accuracy: {out['accuracy']:.3f} on {out['eval_prompts']} held-out prompts "
          f"(band {recipe.band_low}-{recipe.band_high}, in band: {out['in_band']})\n"
          f"per-position accuracy: {[round(x, 3) for x in out['position_accuracy']]}")


def register(app: typer.Typer) -> None:
    app.add_typer(model_app, name="model")
