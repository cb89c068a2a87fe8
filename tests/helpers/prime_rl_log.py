"""prime-rl's metrics.jsonl as prime-rl writes it: the trainer, the orchestrator and the
evaluations appending to one file out of step order, and a resumed attempt appending to the
same file.

Follows PrimeIntellect-ai/prime-rl at 559b44772e471d1538537b8805cc77f3824a5e64:
- one line per `monitors.log` call, `{"step", "time", **metrics}`, opened in append mode
  (src/prime_rl/monitors/file.py:30,40-41); the `rl` entrypoint points the trainer and
  the orchestrator at one run folder (src/prime_rl/entrypoints/rl.py:397-404);
- the orchestrator ships batch s once the policy version is at least s - 2 (TARGET_LAG = 1,
  src/prime_rl/orchestrator/orchestrator.py:101-104,662-680) and logs one line for step s
  right after shipping it (689-747), with `progress/total_rollouts` counted before the step
  (747, 753-755);
- the trainer trains step k on batch k, broadcasts policy v{k}, then logs five lines for step
  k (src/prime_rl/trainer/rl/train.py:575-593, 650-693);
- an evaluation fires when `progress.step % interval == 0`, right after batch N - 1 ships,
  on the policy of that moment, and its line is logged when its episodes finish, with a
  float `step` N and `eval/<env>/policy_version` (orchestrator.py:910-938,
  orchestrator/eval_source.py:44-66); the base model's (policy v0) fires at start-up and is
  logged at step 1 (orchestrator.py:477-479), and not again on resume (eval_source.py:40-42);
- a resumed attempt continues at checkpoint step c + 1 (train.py:229-231,
  orchestrator.py:318-321), appending to the same file.

The learning is a known curve: reward and accuracy rise with the policy version, so that a
reader that dates an evaluation by the line's `step` instead of the policy it ran on reads a
different N*.
"""

from __future__ import annotations

import json
from pathlib import Path

ENV = "gsm8k"
ACC = f"eval/{ENV}/all/agent/avg@1"


def accuracy(version: int) -> float:
    return round(0.20 + 0.01 * version, 6)


def _orchestrator(step: int, t: float, batch: int, group: int, voided: int = 0) -> dict:
    arrived = batch + voided  # the arrival window: the shipped batch and the voided groups
    return {"step": step, "time": t, "progress/rollouts": arrived,
            "progress/tasks": arrived // group, "progress/total_rollouts": arrived * (step - 1),
            "progress/total_tasks": arrived // group * (step - 1),
            "progress/output_tokens": 50 * batch, "time/step": 2.0, "time/pack": 0.01,
            "time/save_ckpt": 0.0, "train/agg/all/agent/reward/mean": round(0.1 + 0.01 * step, 6)}


def _trainer(step: int, t: float) -> list[dict]:
    return [
        {"step": step, "time": t, "perf/throughput": 1000.0, "perf/mfu": 0.3},
        {"step": step, "time": t, "optim/lr": 1e-6, "optim/grad_norm": 0.1},
        {"step": step, "time": t, "loss/mean": 0.01, "entropy/all/mean": 0.5},
        {"step": step, "time": t, "time/step": 2.0, "time/wait_for_batch": 0.1,
         "time/save_ckpt": 0.0, "time/forward_backward": 1.5},
        {"step": step, "time": t, "system/ckpt_disk_free_gib": 100.0},
    ]


def _eval(trigger: int, version: int, t: float) -> dict:
    return {"step": float(trigger), "time": t, ACC: accuracy(version),
            f"eval/{ENV}/policy_version": float(version)}


def attempt_lines(steps: int, batch: int = 16, group: int = 4, interval: int = 4,
                  start: int = 0, t0: float = 1000.0, eval_lag: int = 3,
                  stop_after: int | None = None, voided: int = 0) -> list[dict]:
    """The lines one attempt writes, resuming after checkpoint step `start` (0: a fresh
    run), in the order they reach the file; `stop_after` cuts the attempt after that many
    lines (a kill). An evaluation's line is logged `eval_lag` lines after it fires. `voided`
    rollouts a step (whole groups) arrive besides the `batch` it ships: stale or errored
    groups, which prime-rl counts in `progress/rollouts` (the step's arrival window) but does
    not train on (orchestrator/train_sink.py `process_group`, `_maybe_batch`)."""
    lines: list[dict] = []
    pending: list[tuple[int, dict]] = []  # (due at this many lines, line)
    shipped = trained = start
    t = t0

    def emit(*rows: dict) -> None:
        lines.extend(rows)
        for due, row in [p for p in pending if p[0] <= len(lines)]:
            pending.remove((due, row))
            lines.append(row)

    if start == 0:  # the base model's evaluation, logged at the first step
        pending.append((eval_lag, _eval(1, 0, t)))
    while trained < steps:
        t += 1.0
        if shipped < steps and trained >= shipped + 1 - 2:
            shipped += 1
            emit(_orchestrator(shipped, t, batch, group, voided))
            trigger = shipped + 1
            if trigger % interval == 0 and trigger <= steps:
                pending.append((len(lines) + eval_lag, _eval(trigger, trained, t)))
        else:
            trained += 1
            emit(*_trainer(trained, t))
    lines.extend(row for _, row in pending)
    return lines if stop_after is None else lines[:stop_after]


def write(path: Path, *attempts: list[dict]) -> Path:
    """metrics.jsonl holding the attempts' lines one after the other (append mode)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for lines in attempts:
            f.writelines(json.dumps(row) + "\n" for row in lines)
    return path
