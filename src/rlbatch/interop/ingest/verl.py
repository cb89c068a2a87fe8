"""verl: the file logger's JSON lines -> run log; a verl config -> `FrameworkConfig`.

Log format (verl/utils/tracking.py `FileLogger.log`): one line per `Tracking.log` call,
`{"step": N, "data": {...}}`, written to `$VERL_FILE_LOGGER_PATH` (or
`$VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl`). The trainer logs one line per
training step (timing_s/*, critic/*, actor/*, response_length/* ... and, on test_freq steps,
the validation metrics val-core/*, val-aux/*; older versions val/*), plus one line at the
starting step holding only the validation before training (verl/trainer/ppo/v1/trainer_base.py 414-420).

There is no wall clock and no batch size in the log, so:
  samples = step x P x G, prompts = step x P (P = data.train_batch_size prompts,
  G = actor_rollout_ref.rollout.n), train_s = cumulative sum of timing_s/step,
  tokens = cumulative sum of response_length/mean x P x G (the mean is over the whole batch).
Deviation: in verl versions whose `step` timer encloses validation and checkpointing, train_s
includes them (rlbatch excludes them); a warning counts the rows where that looks likely.
Phases: time/rollout = timing_s/gen, time/reward = timing_s/reward, time/actor_update =
timing_s/update_actor, time/critic_update = timing_s/update_critic + timing_s/values,
time/reference = timing_s/ref, time/other = timing_s/step minus those.

Config (docs/examples/config.rst; verl/workers/fsdp_workers.py): data.train_batch_size is in
prompts; actor_rollout_ref.actor.ppo_mini_batch_size is in prompts and multiplied by
rollout.n inside the worker; the actor's LR scheduler steps once per `update_actor` call,
i.e. once per rollout step, so optim.lr_warmup_steps counts rollout steps.
"""

from __future__ import annotations

import math
import re
from array import array
from bisect import bisect_left
from pathlib import Path

from rlbatch.core.errors import ConfigError, DataError
from rlbatch.interop.ingest.common import (
    FrameworkConfig,
    Settings,
    as_float,
    as_int,
    load_mapping,
    shell_tokens,
)
from rlbatch.interop.ingest.logs import (
    RecordReader,
    extras,
    is_number,
    map_metrics,
    merged_lines,
    num,
    ordered,
)
from rlbatch.interop.ingest.writer import (
    MAX_STEP,
    Converted,
    RowSpool,
    finite_values,
    is_step,
    token_count,
)

TRAIN_BATCH = "data.train_batch_size"
ROLLOUT_N = "actor_rollout_ref.rollout.n"
MINI = "actor_rollout_ref.actor.ppo_mini_batch_size"
MICRO = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"
EPOCHS = "actor_rollout_ref.actor.ppo_epochs"
LR = "actor_rollout_ref.actor.optim.lr"
WARMUP = "actor_rollout_ref.actor.optim.lr_warmup_steps"
WARMUP_RATIO = "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio"
CRITIC_LR = "critic.optim.lr"
CRITIC_MINI = "critic.ppo_mini_batch_size"
TOTAL = "trainer.total_training_steps"
ADV = "algorithm.adv_estimator"
GPUS, NODES = "trainer.n_gpus_per_node", "trainer.nnodes"
# defaults of verl's ppo_trainer.yaml as documented in docs/examples/config.rst
DEFAULTS = {TRAIN_BATCH: 1024, ROLLOUT_N: 1, MINI: 256, EPOCHS: 1, LR: 1e-6, ADV: "gae"}

STEP_METRICS = {
    "reward/mean": ("critic/score/mean",),
    "actor/lr": ("actor/lr",),
    "actor/grad_norm": ("actor/grad_norm",),
    "actor/loss": ("actor/pg_loss",),
    "actor/clip_frac": ("actor/pg_clipfrac",),
    "actor/entropy": ("actor/entropy",),
    "critic/loss": ("critic/vf_loss",),
    "critic/lr": ("critic/lr",),
    "critic/grad_norm": ("critic/grad_norm",),
    "critic/value_mean": ("critic/values/mean",),
    "response/mean_length": ("response_length/mean",),
}
PHASES = {"time/rollout": ("timing_s/gen",), "time/reward": ("timing_s/reward",),
          "time/actor_update": ("timing_s/update_actor",), "time/reference": ("timing_s/ref",)}
CRITIC_PHASES = ("timing_s/update_critic", "timing_s/values")
EVAL_PREFIXES = (("val-core/", "eval/"), ("val-aux/", "eval/aux/"), ("val/", "eval/"))
_REF = re.compile(r"^\$\{([A-Za-z_][\w.]*)\}$")


# ---------------------------------------------------------------- config
def read_settings(path: Path) -> dict:
    """dotted name -> (value, where) from a YAML/JSON config (nested or a Hydra overrides
    list such as .hydra/overrides.yaml) or from `key=value` words of a launch script."""
    if path.suffix.lower() in (".yaml", ".yml", ".json"):
        data = load_mapping(path)
        if isinstance(data, list):
            return _overrides([(str(x), str(path)) for x in data])
        if not isinstance(data, dict):
            raise ConfigError("expected a mapping or a list of overrides", where=str(path))
        flat: dict = {}
        _flatten(data, "", flat, str(path))
        return flat
    return _overrides([(w, f"{path}:{line}") for w, line in shell_tokens(path)])


def _overrides(items: list) -> dict:
    out = {}
    for word, where in items:
        key, eq, value = word.partition("=")
        key = key.lstrip("+~")
        if eq and "." in key and re.match(r"^[A-Za-z_][\w.]*$", key):
            out[key] = (value, where)
    return out


def _flatten(d: dict, prefix: str, out: dict, where: str) -> None:
    for k, v in d.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            _flatten(v, f"{name}.", out, where)
        else:
            out[name] = (v, where)


def _deref(values: dict) -> dict:
    """Resolve one level of `${other.key}` interpolation between settings."""
    out = dict(values)
    for name, (value, where) in values.items():
        m = _REF.match(value) if isinstance(value, str) else None
        if m and m.group(1) in values:
            out[name] = (values[m.group(1)][0], where)
    return out


def read_config(path: Path) -> FrameworkConfig:
    s = Settings(_deref(read_settings(path)), DEFAULTS, str(path))
    prompts, n = s.get(TRAIN_BATCH, as_int), s.get(ROLLOUT_N, as_int)
    mini, epochs, lr = s.get(MINI, as_int), s.get(EPOCHS, as_int), s.get(LR, as_float)
    if mini > prompts:
        s.notes.append(f"{MINI}={mini} exceeds {TRAIN_BATCH}={prompts}: one update per step")
        mini = prompts
    adv = str(s.get(ADV))
    algorithm = "ppo" if adv == "gae" else "grpo" if adv == "grpo" else adv
    warmup = s.get(WARMUP, as_int)
    gpus, nodes = s.get(GPUS, as_int), s.get(NODES, as_int)
    extra = {"ppo_micro_batch_size_per_gpu": s.get(MICRO, as_int),
             "n_gpus": gpus * nodes if gpus and nodes else None}
    critic_lr = s.get(CRITIC_LR, as_float) if algorithm == "ppo" else None
    critic_mini = s.get(CRITIC_MINI, as_int) if algorithm == "ppo" else None
    total = s.get(TOTAL, as_int)
    return FrameworkConfig(
        framework="verl", prompts_per_step=prompts, samples_per_prompt=n, lr=lr,
        critic_lr=critic_lr, mini_batch_prompts=mini, critic_mini_batch_prompts=critic_mini,
        epochs_per_step=epochs,
        warmup_steps=warmup if warmup is not None and warmup >= 0 else None,
        warmup_ratio=s.get(WARMUP_RATIO, as_float),
        total_steps=total if total is not None and total > 0 else None,
        algorithm=algorithm, extra=extra, settings=s.used, notes=tuple(s.notes),
        source=str(path))


# ---------------------------------------------------------------- log
def _items(reader: RecordReader):
    """(line, step, data) per logged line, checked and with non-finite values as null."""
    for line, obj in reader:
        step, data = obj.get("step"), obj.get("data")
        if not is_step(step) or not isinstance(data, dict):
            raise DataError(f'expected {{"step": <int 0..{MAX_STEP}>, "data": {{...}}}} (verl '
                            f'file logger)', where=f"{reader.path}:{line}")
        yield line, step, finite_values(data)


def _eval_only(data: dict) -> bool:
    """A line with no training step in it (`timing_s/step`): the validation before training,
    or an evaluation a logger flushed late."""
    return "timing_s/step" not in data


def _eval_metrics(data: dict, where: str = "") -> tuple[dict, dict]:
    """(evaluation metrics, those logged but not numbers: rlbatch key -> 'where: the source
    key and its value')."""
    out, text = {}, {}
    for k, v in data.items():
        for prefix, repl in EVAL_PREFIXES:
            if k.startswith(prefix):
                if v is None or is_number(v):
                    out[repl + k[len(prefix):]] = num(v)
                else:
                    text[repl + k[len(prefix):]] = f"{where}: '{k}' is {v!r}"
                break
    return out, text


def _step_row(step: int, data: dict, batch: tuple, algorithm: str, state: dict,
              reward_key: str | None, where: str) -> dict:
    p, b = batch
    dt = num(data["timing_s/step"])
    if dt is None:
        raise DataError(f"step {step}: timing_s/step is not a finite number", where=where)
    # verl saves a checkpoint inside its `step` timer (verl-project/verl 1dda039,
    # V1 trainer verl/trainer/ppo/v1/trainer_base.py 449 and 460-461; validation, 470, is
    # outside it):
    # that I/O is not training, and it falls only on save steps, so it is taken out
    save = num(data.get("timing_s/save_checkpoint")) or 0.0
    dt = dt - save if 0.0 < save <= dt else dt
    state["train_s"] += dt
    row = {"step": step, "samples": step * b, "prompts": step * p}
    used = {"timing_s/step", *CRITIC_PHASES}
    used.update(k for k in data if k.startswith(("val-core/", "val-aux/", "val/")))
    mean_len = num(data.get("response_length/mean"))
    new_tokens = None if mean_len is None else token_count(
        mean_len, b, "response_length/mean", step, where)
    if state["tokens"] is not None and new_tokens is not None:
        state["tokens"] += new_tokens
        row["tokens"] = state["tokens"]
    else:
        state["tokens"] = None
    row["train_s"] = state["train_s"]
    row.update(map_metrics(data, PHASES, used))
    critic = [num(data[k]) or 0.0 for k in CRITIC_PHASES if k in data]
    if critic or algorithm == "grpo":
        row["time/critic_update"] = float(sum(critic))
    named = sum(row.get(k) or 0.0 for k in (*PHASES, "time/critic_update"))
    row["time/other"] = dt - named
    metrics = dict(STEP_METRICS)
    if reward_key:
        metrics["reward/mean"] = (reward_key,)
    row.update(map_metrics(data, metrics, used))
    if "tokens" in row and row.get("time/rollout"):
        row["rollout/tokens_per_s"] = new_tokens / row["time/rollout"]
    row.update(extras(data, used, "verl"))
    return row


class VerlRows:
    """The run-log rows of a verl log, built one merged step at a time (`feed`), so that a
    log of any length converts in flat memory and a log still being written can be
    followed. Which lines are a restart is the ordering rule's (`logs.ordered`): at a
    restart (`rewind`) the rows from its step on are dropped and the cumulative counters go
    back to where they stood (warned); an evaluation logged late for an earlier step
    (`late_eval`) adds or replaces that step's evaluation. `non_numbers` holds the
    evaluation metrics logged as something other than a number (rlbatch key -> where)."""

    _STATE = ("train_s", "tokens", "eval_s", "ckpt_s", "enclosed")

    def __init__(self, batch: tuple[int, int], algorithm: str, reward_key: str | None,
                 where: str) -> None:
        self.batch, self.algorithm, self.reward_key, self.where = batch, algorithm, reward_key, where
        self.steps, self.evals = RowSpool(), RowSpool()
        self.warnings: list[str] = []
        self.state = self._initial()
        self.first_step_s: float | None = None
        self._fed = array("q")
        self._history = {k: array("d") for k in self._STATE}
        self.non_numbers: dict[str, str] = {}

    @staticmethod
    def _initial() -> dict:
        return {"train_s": 0.0, "tokens": 0, "eval_s": 0.0, "ckpt_s": 0.0, "enclosed": 0}

    def feed(self, step: int, data: dict, line: int | None = None) -> None:
        p, b = self.batch
        st = self.state
        if "timing_s/step" in data:
            row = _step_row(step, data, (p, b), self.algorithm, st, self.reward_key, self.where)
            if not self.steps:
                self.first_step_s = num(data["timing_s/step"])
            self.steps.append(row)
            test = num(data.get("timing_s/testing")) or 0.0
            st["eval_s"] += test
            st["ckpt_s"] += num(data.get("timing_s/save_checkpoint")) or 0.0
            untimed = row["time/other"] - sum(num(data.get(f"timing_s/{k}")) or 0.0
                                              for k in ("old_log_prob", "adv"))
            if test and untimed >= test:
                st["enclosed"] += 1
        ev = self._eval_metrics(data, line)
        if ev:
            self.evals.append({"step": step, "samples": step * b, "train_s": st["train_s"], **ev})
        self._fed.append(step)
        for k in self._STATE:
            self._history[k].append(math.nan if st[k] is None else st[k])

    def _eval_metrics(self, data: dict, line: int | None) -> dict:
        ev, text = _eval_metrics(data, f"{self.where}:{line}")
        for key, where in text.items():
            self.non_numbers.setdefault(key, where)
        return ev

    def late_eval(self, step: int, data: dict, line: int | None = None) -> None:
        """An evaluation-only line for a step already passed: its metrics join (or replace)
        that step's evaluation row, dated by that step's samples and training seconds."""
        ev = self._eval_metrics(data, line)
        if not ev:
            return
        i = bisect_left(self._fed, step)
        at_step = i < len(self._fed) and self._fed[i] == step
        train_s = self._history["train_s"][i] if at_step else (
            self._history["train_s"][i - 1] if i else 0.0)
        rows = [r for r in self.evals]
        old = next((r for r in rows if r["step"] == step), None)
        if old is not None:
            old.update(ev)
        else:
            rows.append({"step": step, "samples": step * self.batch[1], "train_s": train_s,
                         **ev})
            rows.sort(key=lambda r: r["step"])
        self.evals = RowSpool()
        for r in rows:
            self.evals.append(r)

    def rewind(self, step: int) -> None:
        i = bisect_left(self._fed, step)
        dropped = len(self._fed) - i
        del self._fed[i:]
        for k in self._STATE:
            del self._history[k][i:]
        self.steps.rewind(step)
        self.evals.rewind(step)
        if not self.steps:
            self.first_step_s = None
        if i:
            back = {k: self._history[k][i - 1] for k in self._STATE}
            back["tokens"] = None if math.isnan(back["tokens"]) else int(back["tokens"])
            back["enclosed"] = int(back["enclosed"])
            self.state = back
        else:
            self.state = self._initial()
        self.warnings.append(f"{self.where}: step {step} logged again (restart); {dropped} "
                             f"earlier row(s) from step {step} on replaced")

    def finish(self) -> list[str]:
        """Warnings about the whole log; rows lose `tokens` where some step lacked it."""
        out = []
        if self.state["tokens"] is None:
            self.steps.rewrite(lambda r: {k: v for k, v in r.items() if k != "tokens"})
            out.append(f"{self.where}: response_length/mean missing on some steps; tokens "
                       f"left out")
        if self.state["enclosed"]:
            out.append(f"{self.where}: on {self.state['enclosed']} step(s) timing_s/step looks "
                       f"like it includes timing_s/testing (validation inside the step timer); "
                       f"train_s includes that evaluation time")
        return out


def mentions(path: Path, key: str) -> bool:
    """Whether any line of the file holds `"key"` (a byte scan, no parsing)."""
    needle = f'"{key}"'.encode()
    with open(path, "rb") as fh:
        return any(needle in line for line in fh)


def convert(path: Path, res) -> Converted:
    from rlbatch.interop.ingest import build_config, max_logged

    p, g = res.require_batch("the file logger records neither batch size nor wall clock "
                             "(samples = step x prompts x samples per prompt)")
    reader = RecordReader(path)
    algorithm = res.algorithm or ("ppo" if mentions(path, "critic/vf_loss") else "grpo")
    rows = VerlRows((p, p * g), algorithm, res.reward_key, str(path))
    max_samples = getattr(res.options, "max_samples", None)
    max_step = None if max_samples is None else math.ceil(max_samples / (p * g))
    for kind, (line, step, data) in ordered(merged_lines(_items(reader)), str(path),
                                            _eval_only, max_step):
        if kind == "eval":
            rows.late_eval(step, data, line)
            continue
        if kind == "held":
            rows.warnings.append(f"{path}:{line}: a line for step {step} goes back, with "
                                 "nothing after it yet: not read until the log goes on")
            break
        if kind == "restart":
            rows.rewind(step)
        rows.feed(step, data, line)
    warnings = reader.warnings + rows.warnings + rows.finish()
    config = build_config(res, algorithm, max_logged(rows.steps, "actor/lr"), warnings)
    extra = {"eval_s": rows.state["eval_s"], "checkpoint_s": rows.state["ckpt_s"],
             "train_s_source": "cumulative sum of timing_s/step",
             "non_numbers": rows.non_numbers}
    if rows.steps:
        extra["first_step_s"] = rows.first_step_s
    return Converted("verl", [path], rows.steps, rows.evals, config, res.seed, warnings,
                     reader.truncated, extra)
