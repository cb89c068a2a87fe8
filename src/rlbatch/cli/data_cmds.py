"""`rlbatch data check`: read a dataset file the way `task.name: dataset` would;
`rlbatch data export`: write a built-in task as a dataset folder (rollout/export.py).

Prints the row count, the layout found, one sample prompt/answer, and how the configured
reward scores each row's own reference answer. Malformed rows exit with status 2 and one line
naming the first bad `file:line` and how many more there are (a `DataError`). So does a reward
function that raises, times out, or returns a non-finite or non-numeric value on a reference
answer (it is called through the reward runner, as in training); a function that cannot be
imported or does not take (prompt, completion, example) is one line naming `task.reward`.
With `--model DIR` (a local checkpoint), a prompt that does not fit the model's context with
`--max-new-tokens` is one line naming its `file:line`, as `rlbatch train` would reject it.
"""

from __future__ import annotations

import typer

from rlbatch.cli.common import print_json
from rlbatch.core.errors import ConfigError
from rlbatch.core.schema import RolloutConfig, TaskConfig
from rlbatch.rollout.datasets import check_dataset

FORMATS = ("auto", "jsonl", "parquet", "verl")

data_app = typer.Typer(help="Inspect dataset files for task.name=dataset; export a built-in "
                       "task as one.", no_args_is_help=True)


def _short(text: str, limit: int = 200) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 3] + "..."


@data_app.command("check")
def check(
    path: str = typer.Argument(..., help="dataset file (.jsonl, .json, .parquet)"),
    fmt: str = typer.Option("auto", "--format", help="auto | jsonl | parquet | verl"),
    prompt_column: str = typer.Option("prompt", help="column holding the prompt"),
    answer_column: str = typer.Option("answer", help="column holding the reference answer"),
    reward: str = typer.Option(
        "exact", help="exact | numeric | gsm8k | boxed | module:function (imported from the "
        "Python path: the working directory under python -m, PYTHONPATH)"),
    tolerance: float = typer.Option(TaskConfig().tolerance,
                                    help="relative tolerance of numeric comparisons"),
    model: str | None = typer.Option(
        None, help="local checkpoint folder: check that every prompt fits its context"),
    max_new_tokens: int = typer.Option(
        RolloutConfig().max_new_tokens, help="rollout.max_new_tokens, with --model"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON"),
) -> None:
    """Validate a dataset file; exit 2 with one line naming the first malformed row."""
    if fmt not in FORMATS:
        raise ConfigError(f"--format: unknown format '{fmt}'; use {', '.join(FORMATS)}")
    if tolerance < 0:
        raise ConfigError("--tolerance must be >= 0")
    if max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    info = check_dataset(path, fmt, prompt_column, answer_column, reward, tolerance,
                         model=model, max_new_tokens=max_new_tokens)
    if as_json:
        print_json(info)
        return
    sample, scores = info["sample"], info["reward"]
    print(f"ok: {info['rows']} rows, {info['format']} ({info['layout']} layout): {path}")
    print(f"sample {sample['source']}")
    if sample["messages"]:
        print(f"  messages: {len(sample['messages'])} (prompt = last user message)")
    print(f"  prompt: {_short(sample['prompt'])}")
    print(f"  answer: {_short(sample['answer'])}")
    line = (f"reward '{scores['spec']}' on the reference answers: {scores['correct']} correct, "
            f"{scores['wrong']} wrong, {scores['unscorable']} unscorable")
    if scores["first_not_correct"]:
        line += f" (first: {scores['first_not_correct']})"
    print(line)


@data_app.command("export")
def export(
    out: str = typer.Argument(..., help="folder to write train.jsonl and test.jsonl into"),
    task: str = typer.Option("addition", help="addition | reverse | runsum"),
    digits: int | None = typer.Option(None, help="task.digits (default: the task's)"),
    train: int = typer.Option(65536, help="training examples (the stream for --seed)"),
    test: int = typer.Option(1024, help="held-out examples (never in the training stream)"),
    seed: int = typer.Option(0, help="seed of the training stream"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON"),
) -> None:
    """Write a built-in task as a dataset folder another framework trains on: `trl grpo
    --dataset_name OUT --reward_funcs rlbatch.rollout.export.task_reward` trains on the task
    rlbatch's own trainer uses (docs/integrations.md, "TRL")."""
    from rlbatch.rollout.export import export_task

    if task not in ("addition", "reverse", "runsum"):
        raise ConfigError(f"--task: unknown task '{task}'; use addition, reverse or runsum")
    if train < 1 or test < 1:
        raise ConfigError("--train and --test must be >= 1")
    info = export_task(task, digits, out, train, test, seed)
    if as_json:
        print_json(info)
        return
    print(f"wrote {info['train']:,} training and {info['test']:,} held-out examples of "
          f"{info['task']} (digits {info['digits']}) to {out}/train.jsonl and "
          f"{out}/test.jsonl")


def register(app: typer.Typer) -> None:
    app.add_typer(data_app, name="data")
