"""Dataset tasks: prompts and reference answers read from user files (JSONL, Parquet, verl).

`DatasetTask` implements the Task interface of `rollout/tasks.py` over the rows of a JSONL
or Parquet file, with configurable prompt and answer columns (a dotted name reaches into
nested objects), and the verl layout (a chat-message prompt, the answer in
`reward_model.ground_truth`), forced by `format: verl` or detected. Malformed rows are all
collected into one `DataError` naming the first as `file:line`. The held-out set is
`eval_path` or a deterministic split independent of the run seed; `train_stream(seed)`
visits every training row once per epoch. Deviations: files are read whole into memory, and
`eval_set(n)` may return fewer than n examples. Columns, detection, the split and the row
checks: docs/design.md, "Module notes".
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from rlbatch.core.config import RewardConfig, TaskConfig
from rlbatch.core.errors import ConfigError, DataError, missing
from rlbatch.rollout.reward_runner import Call, RewardRunner
from rlbatch.rollout.rewards import RewardFn, make_reward, reference_completion
from rlbatch.rollout.tasks import BUILTIN_TASKS, EVAL_SEED_OFFSET, Example

MAX_HELD_OUT = 1024
VERL_ANSWER = "reward_model.ground_truth"
_MISSING = object()
_LISTED = 10  # line numbers listed in an error message


@dataclass(frozen=True)
class LoadedRows:
    """The rows of one file and how they were read."""

    path: str
    container: str  # "jsonl" | "parquet"
    layout: str  # "columns" | "verl"
    examples: list[Example]


# ---------------------------------------------------------------- reading files

def container_of(path: str, fmt: str) -> str:
    """`jsonl` or `parquet`: from `fmt`, else from the file extension."""
    if fmt in ("jsonl", "parquet"):
        return fmt
    suffix = Path(path).suffix.lower()
    if suffix in (".jsonl", ".json"):
        return "jsonl"
    if suffix in (".parquet", ".pq"):
        return "parquet"
    raise DataError(f"cannot tell the format from the extension '{suffix}'; "
                    "set task.format (--format) to jsonl, parquet or verl", where=path)


def read_jsonl(path: str) -> tuple[list[tuple[int, Any]], list[tuple[int, str]]]:
    """(line, object) pairs and (line, problem) pairs; lines are 1-based, blanks skipped."""
    records, errors = [], []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                errors.append((lineno, "not UTF-8 text"))
                continue
            if not line.strip():
                continue
            try:
                records.append((lineno, json.loads(line.rstrip("\r\n"))))
            except json.JSONDecodeError as exc:
                errors.append((lineno, f"invalid JSON ({exc.msg} at column {exc.pos + 1})"))
            except RecursionError:
                errors.append((lineno, "invalid JSON (nested too deep)"))
    return records, errors


def read_parquet(path: str) -> list[tuple[int, Any]]:
    """(row, dict) pairs, rows 0-based; nested struct columns become dicts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError, UnicodeDecodeError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(f"not a readable Parquet file ({first})", where=path) from None
    return list(enumerate(rows))


def lookup(record: dict, column: str) -> Any:
    """`record[column]`, or a walk through nested dicts for a dotted name; else _MISSING."""
    if column in record:
        return record[column]
    node: Any = record
    for part in column.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def is_verl(record: Any, prompt_column: str, answer_column: str) -> bool:
    """A verl row: message-list prompt, no answer column, a `reward_model` object."""
    return (isinstance(record, dict) and isinstance(record.get(prompt_column), list)
            and lookup(record, answer_column) is _MISSING and "reward_model" in record)


# ---------------------------------------------------------------- one row -> Example

def message_text(content: Any) -> str | None:
    """A message's text: a string, or a list of parts whose `text` fields are joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict)]
        if parts and all(isinstance(p, str) for p in parts):
            return "".join(parts)
    return None


def parse_prompt(value: Any) -> tuple[str, list[dict] | None] | str:
    """(prompt text, messages or None), or a problem description."""
    if isinstance(value, str):
        return (value, None) if value.strip() else "empty prompt"
    if not isinstance(value, list):
        return f"prompt must be a string or a list of chat messages, not {type(value).__name__}"
    messages = []
    for i, m in enumerate(value):
        text = message_text(m.get("content")) if isinstance(m, dict) else None
        if text is None or not isinstance(m.get("role"), str):
            return f"prompt message {i} needs a string 'role' and text 'content'"
        messages.append({"role": m["role"], "content": text})
    users = [m["content"] for m in messages if m["role"] == "user"]
    if not users or not users[-1].strip():
        return "prompt has no user message with text"
    return users[-1], messages


def parse_answer(value: Any) -> str | None:
    """The answer as text (numbers converted), or None when empty or of another type."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, str) and value.strip():
        return value
    return None


def to_example(record: Any, source: str, prompt_column: str, answer_column: str) -> Example | str:
    """An Example, or a one-line description of what is wrong with the row."""
    if not isinstance(record, dict):
        return f"expected a JSON object, got {type(record).__name__}"
    prompt_value = lookup(record, prompt_column)
    if prompt_value is _MISSING:
        return f"missing column '{prompt_column}'"
    answer_value = lookup(record, answer_column)
    if answer_value is _MISSING:
        return f"missing column '{answer_column}'"
    prompt = parse_prompt(prompt_value)
    if isinstance(prompt, str):
        return prompt
    answer = parse_answer(answer_value)
    if answer is None:
        empty = answer_value is None or (isinstance(answer_value, str) and not answer_value.strip())
        shown = "empty" if empty else ("a non-finite number" if isinstance(answer_value, float)
                                       else type(answer_value).__name__)
        return f"answer '{answer_column}' must be a non-empty string or number, got {shown}"
    meta: dict = {"source": source}
    if prompt[1] is not None:
        meta["messages"] = prompt[1]
    if isinstance(record.get("data_source"), str):
        meta["data_source"] = record["data_source"]
    return Example(prompt=prompt[0], answer=answer, meta=meta)


# ---------------------------------------------------------------- whole files

def malformed_error(path: str, unit: str, errors: list[tuple[int, str]]) -> DataError:
    """One line: the first bad row as file:line, then how many more and which."""
    errors = sorted(errors)
    first_no, first_msg = errors[0]
    where = f"{path}:{first_no}" if unit == "line" else f"{path}:row {first_no}"
    rest = [str(n) for n, _ in errors[1:]]
    if rest:
        shown = ", ".join(rest[:_LISTED]) + (", ..." if len(rest) > _LISTED else "")
        plural = "s" if len(rest) > 1 else ""
        first_msg += f"; {len(rest)} more malformed row{plural} ({unit}{plural} {shown})"
    return DataError(first_msg, where=where)


def _not_a_file(path: str) -> str:
    """Why `path` is not a readable file: a symlink loop and a dangling link are named."""
    return "not a file" if os.path.exists(path) else missing(path)


def load_rows(path: str, fmt: str = "auto", prompt_column: str = "prompt",
              answer_column: str = "answer") -> LoadedRows:
    """Read and validate every row of `path`; a DataError for a missing file or bad rows."""
    if not Path(path).is_file():
        raise DataError(_not_a_file(path), where=path)
    container = container_of(path, fmt)
    if container == "jsonl":
        records, errors = read_jsonl(path)
        unit = "line"
    else:
        records, errors, unit = read_parquet(path), [], "row"
    first = next((r for _, r in records if isinstance(r, dict)), None)
    verl = fmt == "verl" or is_verl(first, prompt_column, answer_column)
    if verl and answer_column == "answer":
        answer_column = VERL_ANSWER
    if container == "parquet" and first is not None:
        missing = [c for c in (prompt_column, answer_column) if lookup(first, c) is _MISSING
                   and c.split(".")[0] not in first]
        if missing:
            raise DataError(f"no column '{missing[0]}' (columns: {', '.join(first)})", where=path)
    examples = []
    for no, record in records:
        source = f"{path}:{no}" if unit == "line" else f"{path}:row {no}"
        item = to_example(record, source, prompt_column, answer_column)
        if isinstance(item, str):
            errors.append((no, item))
        else:
            examples.append(item)
    if errors:
        raise malformed_error(path, unit, errors)
    if not examples:
        raise DataError("no rows", where=path)
    return LoadedRows(path, container, "verl" if verl else "columns", examples)


def split_held_out(examples: list[Example], seed: int = EVAL_SEED_OFFSET
                   ) -> tuple[list[Example], list[Example]]:
    """(train, held-out): the last min(1024, max(1, n // 10)) of a seeded permutation."""
    n = len(examples)
    k = min(MAX_HELD_OUT, max(1, n // 10))
    order = list(range(n))
    random.Random(seed).shuffle(order)
    held = [examples[i] for i in order[n - k:]]
    train_idx = sorted(order[: n - k])
    return [examples[i] for i in train_idx], held


# ---------------------------------------------------------------- the task

class DatasetTask:
    """Task over file rows: a seeded infinite shuffled stream, a fixed held-out set, a reward."""

    name = "dataset"
    overlap_removed = 0  # training rows dropped because their prompt is held out

    def __init__(self, train: list[Example], held_out: list[Example], reward_fn: RewardFn):
        if not train:
            raise DataError("no training rows left after removing the held-out prompts")
        self.train = list(train)
        self.held_out = list(held_out)
        self.reward_fn = reward_fn

    @classmethod
    def from_config(cls, cfg: TaskConfig) -> DatasetTask:
        """Resolve the reward, load `cfg.path` (and `cfg.eval_path`), split, drop overlap."""
        if not cfg.path:
            raise DataError("task.path is required when task.name is 'dataset'")
        reward_fn = make_reward(cfg.reward, cfg.tolerance)
        cols = {"fmt": cfg.format, "prompt_column": cfg.prompt_column,
                "answer_column": cfg.answer_column}
        rows = load_rows(cfg.path, **cols).examples
        if cfg.eval_path:
            train, held = rows, load_rows(cfg.eval_path, **cols).examples
        else:
            if len(rows) < 2:
                raise DataError("need at least 2 rows to hold some out; or set task.eval_path",
                                where=cfg.path)
            train, held = split_held_out(rows)
        held_prompts = {e.prompt for e in held}
        kept = [e for e in train if e.prompt not in held_prompts]
        if not kept:
            raise DataError("every training prompt is also in the held-out set", where=cfg.path)
        task = cls(kept, held, reward_fn)
        task.overlap_removed = len(train) - len(kept)
        return task

    def train_stream(self, seed: int) -> Iterator[Example]:
        rng = random.Random(seed)
        order = list(range(len(self.train)))
        while True:
            rng.shuffle(order)
            for i in order:
                yield self.train[i]

    def eval_set(self, n: int) -> list[Example]:
        return self.held_out[:n]

    def reward(self, prompt: str, completion: str, example: Example) -> float | None:
        return self.reward_fn(prompt, completion, example)

    def vocabulary(self) -> str:
        """Every character in prompts and answers (for a character-level tokenizer)."""
        chars: set[str] = set()
        for e in self.train + self.held_out:
            chars.update(e.prompt)
            chars.update(e.answer)
        return "".join(sorted(chars))


def check_eval_prompts(task, prompts: int, where: str | None = None) -> None:
    """`eval.prompts` beyond a dataset's held-out set is an error naming both numbers (it
    would silently evaluate on fewer prompts than configured); built-in tasks draw any
    number of held-out prompts."""
    held = getattr(task, "held_out", None)
    if held is not None and prompts > len(held):
        raise ConfigError(
            f"eval.prompts = {prompts} is more than the {len(held)} held-out prompts of "
            f"{where or 'the dataset'}: set eval.prompts to at most {len(held)}, or give a "
            "larger held-out set with task.eval_path")


def build_task(cfg: TaskConfig):
    """The task `cfg` names: a built-in AdditionTask/ReverseTask or a DatasetTask."""
    if cfg.name == "dataset":
        return DatasetTask.from_config(cfg)
    task = BUILTIN_TASKS[cfg.name](digits=cfg.digits)
    if cfg.reward != "exact":
        task.reward = make_reward(cfg.reward, cfg.tolerance)
    return task


def check_dataset(path: str, fmt: str = "auto", prompt_column: str = "prompt",
                  answer_column: str = "answer", reward: str = "exact",
                  tolerance: float = 1e-6, reward_cfg: RewardConfig | None = None,
                  model: str | None = None, max_new_tokens: int = 5) -> dict:
    """Load `path` and score each reference answer with the reward (`rlbatch data check`).

    With `model` (a local checkpoint folder), every prompt plus `max_new_tokens` must fit the
    model's context, as `rlbatch train` requires (`prompt_lengths.check_prompt_lengths`).

    A row whose reference answer does not score 1.0 cannot be learned as configured (e.g.
    `numeric` with a non-numeric answer is unscorable); such rows are counted, not rejected.
    The calls go through the reward runner (`reward_cfg`, default `RewardConfig()`: a
    `module:function` runs in worker processes with a timeout); a call that raises, times out
    or returns a non-finite or non-numeric value is a DataError naming the function, the first
    such row as file:line and how many rows faulted.
    """
    reward_fn = make_reward(reward, tolerance)
    rows = load_rows(path, fmt, prompt_column, answer_column)
    if model is not None:
        from rlbatch.rollout.models import resolve_model_path
        from rlbatch.rollout.prompt_lengths import check_prompt_lengths

        check_prompt_lengths(DatasetTask(rows.examples, [], reward_fn),
                             resolve_model_path(model, "dataset", 0), max_new_tokens)
    runner = RewardRunner(SimpleNamespace(reward=reward_fn), reward, tolerance,
                          reward_cfg or RewardConfig())
    try:
        scored = runner.score([Call(ex.prompt, reference_completion(reward, ex.answer), ex, i)
                               for i, ex in enumerate(rows.examples)])
    finally:
        runner.close()
    if scored.n_faults:
        i = next(i for i, f in enumerate(scored.faults) if f is not None)
        what = {"error": "failed", "timeout": "timed out",
                "nonfinite": "returned a non-finite value"}[scored.faults[i]]
        raise DataError(f"task.reward: {reward} {what} on the reference answer "
                        f"({scored.messages[i]}; {scored.n_faults} of {len(rows.examples)} "
                        "rows faulted)", where=rows.examples[i].meta["source"])
    counts = {"correct": 0, "wrong": 0, "unscorable": 0}
    first_bad = None
    for ex, score in zip(rows.examples, scored.values):
        kind = "unscorable" if score is None else "correct" if score == 1.0 else "wrong"
        counts[kind] += 1
        if kind != "correct" and first_bad is None:
            first_bad = ex.meta["source"]
    sample = rows.examples[0]
    return {
        "path": path, "format": rows.container, "layout": rows.layout,
        "rows": len(rows.examples),
        "sample": {"source": sample.meta["source"], "prompt": sample.prompt,
                   "answer": sample.answer, "messages": sample.meta.get("messages")},
        "reward": {"spec": reward, **counts, "first_not_correct": first_bad},
    }
