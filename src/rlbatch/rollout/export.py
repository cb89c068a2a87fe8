"""The built-in tasks as files another framework can train on (`rlbatch data export`), and
their reward in TRL's calling convention, so that `trl grpo` (and the other frameworks'
scripts, given a reward adapter of their own) can run the same workload rlbatch does.

- `export_task`: `train.jsonl` (the task's training stream for a seed, in order) and
  `test.jsonl` (its held-out set, which the stream never draws from), one object per line
  with the columns `prompt`, `answer`, `task` and `digits`: the folder `trl grpo
  --dataset_name DIR` loads as its train and test splits.
- `task_reward(completions, prompts, answer, task, digits, **_)`: TRL's reward signature
  (`--reward_funcs rlbatch.rollout.export.task_reward`); the columns come in as keyword
  arguments, and each completion is scored by the built-in task's own reward (exact match;
  the final answer only for `runsum`), unscorable completions as 0.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from rlbatch.core.config import TaskConfig
from rlbatch.core.errors import writing
from rlbatch.core.runlog import atomic_write_text
from rlbatch.rollout.tasks import Example


@cache
def _task(name: str, digits: int):
    from rlbatch.rollout.datasets import build_task

    return build_task(TaskConfig(name=name, digits=digits))


def export_task(name: str, digits: int | None, out: str | Path, train: int, test: int,
                seed: int = 0) -> dict:
    """Write `train` training and `test` held-out examples of a built-in task under `out`."""
    cfg = TaskConfig(name=name, digits=digits)
    task = _task(cfg.name, cfg.digits)
    stream = task.train_stream(seed)
    out = Path(out)
    with writing(out):
        out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for split, examples in (("train", (next(stream) for _ in range(train))),
                            ("test", task.eval_set(test))):
        rows = [json.dumps({"prompt": e.prompt, "answer": e.answer, "task": cfg.name,
                            "digits": cfg.digits}) for e in examples]
        atomic_write_text(out / f"{split}.jsonl", "".join(r + "\n" for r in rows))
        counts[split] = len(rows)
    return {"task": cfg.name, "digits": cfg.digits, "seed": seed, "out": str(out), **counts}


def task_reward(completions, prompts, answer, task, digits, **_) -> list[float]:
    """TRL's reward convention over the built-in tasks' rewards (module docstring)."""
    out = []
    for completion, prompt, ans, name, d in zip(completions, prompts, answer, task, digits):
        t = _task(name, int(d))
        value = t.reward(prompt, completion, Example(prompt, ans))
        out.append(0.0 if value is None else float(value))
    return out
