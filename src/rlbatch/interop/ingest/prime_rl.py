"""prime-rl: metrics.jsonl -> run log; prime-rl TOML -> `FrameworkConfig`.

Reads the `{"step", "time", **metrics}` lines of prime-rl's `FileMonitor` (prime-rl 559b447),
merging every metrics.jsonl under a directory by step with the orchestrator's file (the one
holding `progress/total_rollouts`) as the primary one, and the combined or separate
trainer/orchestrator TOML files. samples and prompts are step x B and step x P where B
(`orchestrator.batch_size`) is known, the orchestrator's progress counters otherwise; tokens
come from those counters, the reward from `train/agg/all/<agent>/reward/mean`, train_s from the
trainer's line of each step, per attempt (`_Clock`); no phase timers are mapped. The file's
lines are not in step order (the trainer, the orchestrator and evaluations write
asynchronously) and a resumed attempt appends to it (`_read`, under the ordering rule of
`logs.ordered`); an evaluation is dated by the policy it ran on (`_dated_evals`).
Deviation: prime-rl is asynchronous, so a step's wall clock holds generation of later steps
(train_s is still the true elapsed time), and its evaluations share inference with training.
Keys, conversion and config fields: docs/design.md, "Module notes".
"""

from __future__ import annotations

import math
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
from rlbatch.interop.ingest.logs import (
    extras,
    going_back,
    is_number,
    map_metrics,
    num,
    past_budget,
    read_records,
    stray_line,
)
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


def _source(obj: dict) -> str:
    """Which writer logged a metrics.jsonl line: an evaluation of one env (`eval:<env>`), the
    orchestrator (its `progress/*` counters) or the trainer (everything else)."""
    env = next((k.split("/")[1] for k in obj if k.startswith("eval/") and k.count("/") >= 2),
               None)
    if env is not None:
        return f"eval:{env}"
    return "orchestrator" if any(k.startswith("progress/") for k in obj) else "trainer"


def _step_of(obj: dict, source: str) -> int | None:
    """The line's step: an integer; an evaluation line's may be an integral float
    (orchestrator.py:937 writes `float(batch.step)`)."""
    step = obj.get("step")
    if source.startswith("eval:") and isinstance(step, float) and step.is_integer():
        step = int(step)
    return step if is_step(step) else None


def _read(path: Path, max_step: int | None = None) -> tuple[list, list, list, bool]:
    """(steps, evaluations, warnings, truncated) of one metrics.jsonl.

    prime-rl's trainer and orchestrator append to one file asynchronously, so lines are not
    in step order: the orchestrator logs step s when it ships batch s, before the trainer
    logs step s - 1 (orchestrator.py 662-747, train.py 575-693), and each (env, step)
    evaluation is logged whenever its episodes finish (orchestrator/eval_sink.py 24-35,
    86-93), in any order. So only the two strictly ordered writers can signal a restart (a
    resumed attempt appends to the same file, monitors/file.py:30), each by the ordering
    rule (`logs.ordered`) on its own lines: the orchestrator logs one line per step, the
    trainer several. At a restart the rows from its step on are replaced and a new segment
    begins (`_SEG`: its own clock, `convert`). Each step's trainer line time and checkpoint
    time are kept apart (`_TRAINER`, `_SAVE`): the trainer logs step s once policy s
    exists, after saving its checkpoint (train.py 602-613, 650-693)."""
    records, warnings, truncated = read_records(path)
    # in a file the orchestrator writes to, only its lines date a step (see the module text)
    shared = any("progress/total_rollouts" in obj for _, obj in records)
    recs = []
    for line, obj in records:
        src = _source(obj)
        step = _step_of(obj, src)
        if step is None:
            raise DataError(f"record has no integer 'step' in 0..{MAX_STEP} (prime-rl "
                            f"metrics.jsonl)", where=f"{path}:{line}")
        recs.append((line, step, src, finite_values(obj)))
    kept: list[tuple[int, str, dict, int, str]] = []
    last: dict[str, int] = {}
    segment = 0
    for i, (line, step, src, obj) in enumerate(recs):
        where = f"{path}:{line}"
        if not src.startswith("eval:"):
            again = src in last and (step < last[src] or (step == last[src]
                                                          and src != "trainer"))
            if not again and step > last.get(src, -1):
                past_budget(step, max_step, where)
            if again:
                following = next((r[1] for r in recs[i + 1:] if r[2] == src
                                  and not (src == "trainer" and r[1] == step)), None)
                verdict = going_back(step, last[src], following)
                if verdict is None:
                    warnings.append(f"{where}: the {src} logged step {step} after step "
                                    f"{last[src]}, with nothing after it yet: not read until "
                                    "the log goes on")
                    break
                if verdict == "stray":
                    raise stray_line(step, last[src], following, where)
                dropped = sum(1 for r in kept if r[0] >= step)
                kept = [r for r in kept if r[0] < step]
                last, segment = {}, segment + 1
                warnings.append(f"{where}: step {step} logged again (restart); {dropped} "
                                f"earlier line(s) from step {step} on replaced")
            last[src] = step
        kept.append((step, src, obj, segment, where))
    evals = [(s, o, w) for s, src, o, _, w in kept if src.startswith("eval:")]
    return _by_step(kept, shared), evals, warnings, truncated


_TRAINER, _SAVE, _SEG = "__trainer_time", "__trainer_save_s", "__segment"


def _by_step(kept: list, shared: bool) -> list[tuple[int, dict]]:
    """The kept lines of the step writers merged per step (see `_read`)."""
    steps: dict[int, dict] = {}
    for step, src, obj, segment, _ in kept:
        if src.startswith("eval:"):
            continue
        row = steps.setdefault(step, {})
        row[_SEG] = segment
        if src == "trainer" and "time" in obj:
            row[_TRAINER] = obj["time"]
        if src == "trainer" and num(obj.get("time/save_ckpt")) is not None:
            row[_SAVE] = obj["time/save_ckpt"]
        if shared and src != "orchestrator":
            obj = {k: v for k, v in obj.items() if k not in DATING}
        elif "time" in row:
            obj = {k: v for k, v in obj.items() if k != "time"}  # a step's first line dates it
        row.update(obj)
    return sorted(steps.items())


def _combined(files: list[Path], max_step: int | None) -> tuple[list, list, Path, list, bool]:
    """Steps of the primary file, with the other files' keys added where absent, and the
    evaluation lines of every file."""
    parsed = {f: _read(f, max_step) for f in files}
    primary = next((f for f, (m, _, _, _) in parsed.items()
                    if any("progress/total_rollouts" in d for _, d in m)), files[0])
    merged, evals, warnings, truncated = parsed[primary]
    evals, warnings, by_step = list(evals), list(warnings), dict(merged)
    for f, (m, e, w, t) in parsed.items():
        if f == primary:
            continue
        evals, warnings, truncated = evals + e, warnings + w, truncated or t
        for s, d in m:
            for k, v in d.items() if s in by_step else ():
                by_step[s].setdefault(k, v)
    return merged, evals, primary, warnings, truncated


def _dated_evals(evals: list[tuple[int, dict, str]], rows: dict[int, dict],
                 non_numbers: dict[str, str]) -> list[dict]:
    """Evaluation rows dated by the policy they ran on: `eval/<env>/policy_version` v is the
    policy after v optimizer steps (orchestrator.py 920-936: the lowest version among the
    epoch's episodes), so the row takes step v's samples and train_s (v = 0: the base model,
    at 0). prime-rl logs it at the later step that triggered it (the base model's at step
    1), 1-3 steps after that policy existed. Without a policy version, or before step v's
    row is logged, the logged step dates it. Envs evaluated on one policy share a row."""
    out: dict[tuple, dict] = {}
    for step, obj, where in evals:
        ev = {k: num(v) for k, v in obj.items() if k.startswith("eval/")
              and (v is None or is_number(v))}
        for k, v in obj.items():
            if k.startswith("eval/") and k not in ev:
                non_numbers.setdefault(k, f"{where}: '{k}' is {v!r}")
        version = next((ev[k] for k in ev if k.endswith("/policy_version")), None)
        v = int(version) if version is not None and float(version).is_integer() else None
        if v == 0:
            when = (0, 0, 0.0)
        elif v is not None and v in rows and "samples" in rows[v]:
            when = (v, rows[v]["samples"], rows[v].get("train_s"))
        else:
            when = (step, rows[step]["samples"], rows[step].get("train_s")) \
                if step in rows else None
        if when is None:
            continue
        row = out.setdefault(when, {"step": when[0], "samples": when[1], "train_s": when[2]})
        row.update(ev)
    return [out[k] for k in sorted(out, key=lambda k: (k[1], k[0]))]


class _Clock:
    """Training seconds of each step row: the time of the step's trainer line (policy s
    exists; `trained`), else of its first line, less the trainer's checkpoint saves so far,
    since the start of the segment's first step (its orchestrator line's time less its
    `time/step`), plus the seconds counted through the step before the segment: a resumed
    attempt's clock starts at its own first step, so the time the run was down, and the
    attempt's start-up, are not training (`_read` numbers the segments)."""

    def __init__(self, rows: list[tuple[int, dict]], trained: bool) -> None:
        self.trained = trained
        self.origin: dict[int, float | None] = {}
        for _, d in rows:
            seg = d.get(_SEG, 0)
            if seg not in self.origin:
                t = num(d.get("time"))
                start = None if t is None else t - (num(d.get("time/step")) or 0.0)
                self.origin[seg] = start
        self.seg, self.base, self.saves, self.last = None, 0.0, 0.0, None

    def train_s(self, step: int, d: dict) -> float | None:
        seg = d.get(_SEG, 0)
        if seg != self.seg:  # a new attempt: its clock continues the last row's
            self.seg, self.saves = seg, 0.0
            self.base = self.last if self.last is not None else 0.0
        self.saves += num(d.get(_SAVE)) or 0.0
        t = num(d.get(_TRAINER) if self.trained else d.get("time"))
        origin = self.origin.get(seg)
        if t is None or origin is None:
            return None
        self.last = self.base + t - origin - self.saves
        return self.last


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
    """The samples trained through this step: step x B where B (`orchestrator.batch_size`)
    is known. prime-rl cuts a step's batch once B admitted rollouts are pending
    (orchestrator/train_sink.py `_maybe_batch`, 559b447), while `progress/rollouts` counts
    the step's whole arrival window, rollouts it voided or did not admit included
    (orchestrator.py, "``all`` is the full arrival window"): that count is kept as
    `prime-rl/rollouts_arrived`, and is the samples only where B is not known."""
    if b is not None:
        return step * b
    total = _through(data, "progress/total_rollouts", "progress/rollouts")
    if total is None:
        raise ConfigError(f"step {step} has no progress/total_rollouts; pass --prompts-per-step "
                          f"and --samples-per-prompt", where=where)
    return total


def convert(path: Path, res) -> Converted:
    from rlbatch.interop.ingest import build_config, max_logged

    files = metric_files(path)
    b, g = res.sequences_per_step, res.samples_per_prompt
    max_samples = getattr(res.options, "max_samples", None)
    max_step = None if max_samples is None or not b else math.ceil(max_samples / b)
    merged, eval_lines, primary, warnings, truncated = _combined(files, max_step)
    trained = getattr(res.options, "live", False) or any(_TRAINER in d for _, d in merged)
    rows = [(s, d) for s, d in merged if (_TRAINER in d if trained else
                                          "time" in d or "progress/total_rollouts" in d)]
    if not rows:
        raise DataError("no step records with 'time' or 'progress/total_rollouts'"
                        + (" from the trainer" if trained else ""), where=str(primary))
    first = rows[0][1]
    clock = _Clock(rows, trained)
    metrics = dict(STEP_METRICS)
    metrics["reward/mean"] = (res.reward_key,) if res.reward_key else _reward_key(rows, str(primary))
    steps, tokens = [], 0
    for step, data in rows:
        used = {*COUNTER_KEYS, _TRAINER, _SAVE, _SEG}
        samples = _samples(step, data, b, str(primary))
        row = {"step": step, "samples": samples}
        tasks = _through(data, "progress/total_tasks", "progress/tasks")
        if b is not None and g:
            row["prompts"] = samples // g
        elif tasks is not None or g:
            row["prompts"] = tasks if tasks is not None else samples // g
        arrived = _through(data, "progress/total_rollouts", "progress/rollouts")
        if b is not None and arrived is not None:
            row["prime-rl/rollouts_arrived"] = arrived
        out_tokens = num(data.get("progress/output_tokens"))
        tokens = None if tokens is None or out_tokens is None else tokens + int(out_tokens)
        if tokens is not None:
            row["tokens"] = tokens
        train_s = clock.train_s(step, data)
        if train_s is not None:
            row["train_s"] = train_s
        row.update(map_metrics(data, metrics, used))
        row["time/critic_update"] = 0.0
        row.update(extras(data, used, "prime-rl"))
        steps.append(row)
    non_numbers: dict[str, str] = {}
    evals = _dated_evals(eval_lines, {r["step"]: r for r in steps}, non_numbers)
    if tokens is None:
        for r in steps:
            r.pop("tokens", None)
    config = build_config(res, res.algorithm or "grpo", max_logged(steps, "actor/lr"), warnings)
    if "sequences_per_step" not in config["derived"]:
        sizes = {num(d.get("progress/rollouts")) for _, d in rows}
        if len(sizes) == 1 and None not in sizes:
            config["derived"]["sequences_per_step"] = int(sizes.pop())
    extra = {"train_s_source": "metrics.jsonl: the trainer's 'time' of each step less its "
                               "checkpoint saves, since the first step began, per attempt"
             if trained else "metrics.jsonl 'time' since the first step began",
             "first_step_s": num(first.get("time/step")), "non_numbers": non_numbers}
    return Converted("prime-rl", files, steps, evals, config, res.seed, warnings, truncated,
                     extra)
