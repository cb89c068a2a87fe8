"""prime-rl: metrics.jsonl -> run log; prime-rl TOML -> `FrameworkConfig`.

Reads the `{"step", "time", **metrics}` lines of prime-rl's `FileMonitor` (prime-rl 559b447),
merging every metrics.jsonl under a directory by step with the orchestrator's file (the one
holding `progress/total_rollouts`) as the primary one, and the combined or separate
trainer/orchestrator TOML files. samples, prompts and tokens come from the orchestrator's
progress counters, the reward from `train/agg/all/<agent>/reward/mean`, train_s from the
orchestrator's clock; no phase timers are mapped. Deviation: prime-rl is asynchronous, so a
step's wall clock holds generation of later steps (train_s is still the true elapsed time).
Keys, conversion and config fields: docs/design.md, "Module notes".
"""

from __future__ import annotations

import re
from pathlib import Path

from rlbatch.core.errors import ConfigError, DataError
from rlbatch.interop.ingest.common import (
    FrameworkConfig,
    Settings,
    as_float,
    as_int,
    get_path,
    load_mapping,
)
from rlbatch.interop.ingest.logs import extras, map_metrics, merge_steps, num, read_records
from rlbatch.interop.ingest.writer import MAX_STEP, Converted, finite_values, is_step

BATCH = ("orchestrator.batch_size", "batch_size")
GROUP = ("orchestrator.group_size", "group_size", "orchestrator.rollouts_per_example",
         "rollouts_per_example")  # older prime-rl: rollouts_per_example
LR = ("trainer.optim.lr", "optim.lr")
WARMUP = ("trainer.scheduler.warmup_steps", "scheduler.warmup_steps")
SCHED = ("trainer.scheduler.type", "scheduler.type")
MAX_STEPS = ("max_steps", "trainer.max_steps", "orchestrator.max_steps")
SEED = ("orchestrator.seed", "seed")
# defaults of src/prime_rl/configs (orchestrator batch_size 128, group_size 1, optim lr 1e-6,
# constant scheduler)
DEFAULTS = {BATCH[0]: 128, GROUP[0]: 1, LR[0]: 1e-6}

OLD_REWARD_KEYS = ("reward/mean", "train/agg/reward/mean", "reward/all/mean")
AGENT_REWARD = re.compile(r"^train/agg/all/([^/]+)/reward/mean$")
STEP_METRICS = {
    "reward/mean": OLD_REWARD_KEYS,
    "actor/lr": ("optim/lr",),
    "actor/grad_norm": ("optim/grad_norm",),
    "actor/loss": ("loss/mean",),
    "actor/entropy": ("entropy/all/mean", "entropy/mean"),
}
COUNTER_KEYS = ("step", "time", "progress/total_rollouts", "progress/total_tasks",
                "progress/rollouts", "progress/tasks", "progress/output_tokens")
DATING = ("time", "time/step")


def read_config(path: Path) -> FrameworkConfig:
    data = load_mapping(path)
    if not isinstance(data, dict):
        raise ConfigError("expected a TOML table", where=str(path))
    values = {}
    for names in (BATCH, GROUP, LR, WARMUP, SCHED, MAX_STEPS, SEED):
        for name in names:
            if get_path(data, name) is not None:
                values[names[0]] = (get_path(data, name), f"{path} ({name})")
                break
    s = Settings(values, DEFAULTS, str(path))
    batch, g = s.get(BATCH[0], as_int), s.get(GROUP[0], as_int)
    if batch % g:
        raise ConfigError(f"batch_size {batch} is not a multiple of group_size {g}",
                          where=str(path))
    sched = s.get(SCHED[0]) or "constant"
    warmup = s.get(WARMUP[0], as_int)
    if warmup is None and sched in ("linear", "cosine"):
        warmup = 10  # LinearSchedulerConfig / CosineSchedulerConfig default
        s.notes.append("scheduler.warmup_steps not set; the framework default 10 assumed")
    max_steps = s.get(MAX_STEPS[0], as_int)
    return FrameworkConfig(
        framework="prime-rl", prompts_per_step=batch // g, samples_per_prompt=g,
        lr=s.get(LR[0], as_float), warmup_steps=warmup or None, total_steps=max_steps,
        algorithm="grpo", seed=s.get(SEED[0], as_int), extra={"scheduler": sched},
        settings=s.used, notes=tuple(s.notes), source=str(path))


# ---------------------------------------------------------------- log
def metric_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    files = sorted(p for p in path.rglob("metrics.jsonl") if p.is_file())
    if not files:
        raise DataError("no metrics.jsonl found", where=str(path))
    return files


def _read(path: Path) -> tuple[list, list, bool]:
    records, warnings, truncated = read_records(path)
    # in a file the orchestrator writes to, only its lines date a step (see the module text)
    shared = any("progress/total_rollouts" in obj for _, obj in records)
    items = []
    for line, obj in records:
        step = obj.get("step")
        if not is_step(step):
            raise DataError(f"record has no integer 'step' in 0..{MAX_STEP} (prime-rl "
                            f"metrics.jsonl)", where=f"{path}:{line}")
        if shared and "progress/total_rollouts" not in obj:
            obj = {k: v for k, v in obj.items() if k not in DATING}
        elif items and items[-1][0] == step and "time" in items[-1][1]:
            obj = {k: v for k, v in obj.items() if k != "time"}  # a step's first line dates it
        items.append((step, finite_values(obj)))
    merged, w = merge_steps(items, str(path))
    return merged, warnings + w, truncated


def _combined(files: list[Path]) -> tuple[list, Path, list, bool]:
    """Steps of the primary file, with the other files' keys added where absent."""
    parsed = {f: _read(f) for f in files}
    primary = next((f for f, (m, _, _) in parsed.items()
                    if any("progress/total_rollouts" in d for _, d in m)), files[0])
    merged, warnings, truncated = parsed[primary]
    warnings, by_step = list(warnings), dict(merged)
    for f, (m, w, t) in parsed.items():
        if f == primary:
            continue
        warnings, truncated = warnings + w, truncated or t
        for s, d in m:
            for k, v in d.items() if s in by_step else ():
                by_step[s].setdefault(k, v)
    return merged, primary, warnings, truncated


def _through(data: dict, total: str, this: str) -> int | None:
    """A counter through this step: the total before it plus this step's count."""
    before, now = num(data.get(total)), num(data.get(this))
    return None if before is None else int(before) + int(now or 0)


def _reward_key(rows: list, where: str) -> tuple[str, ...]:
    """The reward key of these logs: the one agent's `train/agg/all/<agent>/reward/mean`,
    else the older names."""
    agents = sorted({k for _, d in rows for k in d if AGENT_REWARD.match(k)})
    if len(agents) > 1:
        raise DataError(f"the logs hold the reward of several agents ({', '.join(agents)}); "
                        f"pass --reward-key with one of them", where=where)
    return tuple(agents) or OLD_REWARD_KEYS


def _samples(step: int, data: dict, b: int | None, where: str) -> int:
    total = _through(data, "progress/total_rollouts", "progress/rollouts")
    if total is not None:
        return total
    if b is None:
        raise ConfigError(f"step {step} has no progress/total_rollouts; pass --prompts-per-step "
                          f"and --samples-per-prompt", where=where)
    return step * b


def convert(path: Path, res) -> Converted:
    from rlbatch.interop.ingest import build_config, max_logged

    files = metric_files(path)
    merged, primary, warnings, truncated = _combined(files)
    b, g = res.sequences_per_step, res.samples_per_prompt
    rows = [(s, d) for s, d in merged if "time" in d or "progress/total_rollouts" in d]
    if not rows:
        raise DataError("no step records with 'time' or 'progress/total_rollouts'",
                        where=str(primary))
    first = rows[0][1]
    origin = num(first.get("time"))
    if origin is not None:
        origin -= num(first.get("time/step")) or 0.0
    metrics = dict(STEP_METRICS)
    metrics["reward/mean"] = (res.reward_key,) if res.reward_key else _reward_key(rows, str(primary))
    steps, evals, tokens = [], [], 0
    for step, data in rows:
        used = set(COUNTER_KEYS)
        samples = _samples(step, data, b, str(primary))
        row = {"step": step, "samples": samples}
        tasks = _through(data, "progress/total_tasks", "progress/tasks")
        if tasks is not None or g:
            row["prompts"] = tasks if tasks is not None else samples // g
        out_tokens = num(data.get("progress/output_tokens"))
        tokens = None if tokens is None or out_tokens is None else tokens + int(out_tokens)
        if tokens is not None:
            row["tokens"] = tokens
        t = num(data.get("time"))
        if t is not None and origin is not None:
            row["train_s"] = t - origin
        ev = {k: num(v) for k, v in data.items() if k.startswith("eval/")}
        used.update(ev)
        row.update(map_metrics(data, metrics, used))
        row["time/critic_update"] = 0.0
        row.update(extras(data, used, "prime-rl"))
        steps.append(row)
        if ev:
            evals.append({"step": step, "samples": samples, "train_s": row.get("train_s"), **ev})
    if tokens is None:
        for r in steps:
            r.pop("tokens", None)
    config = build_config(res, res.algorithm or "grpo", max_logged(steps, "actor/lr"), warnings)
    if "sequences_per_step" not in config["derived"]:
        sizes = {num(d.get("progress/rollouts")) for _, d in rows}
        if len(sizes) == 1 and None not in sizes:
            config["derived"]["sequences_per_step"] = int(sizes.pop())
    extra = {"train_s_source": "metrics.jsonl 'time' since the first step began",
             "first_step_s": num(first.get("time/step"))}
    return Converted("prime-rl", files, steps, evals, config, res.seed, warnings, truncated,
                     extra)
