"""TRL GRPO: trainer_state.json or TensorBoard events -> run log; a GRPOConfig -> `FrameworkConfig`.

One TRL generation batch holds P x G completions and spans K optimizer steps
(K = steps_per_generation x num_iterations / gradient_accumulation_steps), while TRL logs
per optimizer step (`global_step`). The conversion maps rollout step r = ceil(global_step / K)
and samples = r x P x G, keeping the last logged row of each rollout step. train_s is TRL's
train_runtime less evaluation time where rows carry it, else an estimate spread over steps
(warned); from TensorBoard events, wall time less evaluation time. Units, keys and the
train_s cases: docs/design.md, "Module notes".
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from rlbatch.core.errors import ConfigError, DataError
from rlbatch.interop.ingest.common import FrameworkConfig, Settings, as_float, as_int, load_mapping
from rlbatch.interop.ingest.logs import (
    extras,
    map_metrics,
    merge_steps,
    num,
    read_tensorboard,
    tb_step_records,
)
from rlbatch.interop.ingest.writer import (
    MAX_STEP,
    Converted,
    finite_values,
    is_step,
    token_count,
)

PER_DEVICE, ACCUM = "per_device_train_batch_size", "gradient_accumulation_steps"
GENS = "num_generations"
STEPS_PER_GEN, GEN_BATCH, ITERS = "steps_per_generation", "generation_batch_size", "num_iterations"
LR, WARMUP, WARMUP_RATIO, MAX_STEPS, SEED = ("learning_rate", "warmup_steps", "warmup_ratio",
                                             "max_steps", "seed")
# defaults: transformers TrainingArguments / trl GRPOConfig
DEFAULTS = {PER_DEVICE: 8, ACCUM: 1, GENS: 8, ITERS: 1, LR: 1e-6, SEED: 42}

STEP_METRICS = {
    "reward/mean": ("reward",),
    "actor/loss": ("loss",),
    "actor/lr": ("learning_rate",),
    "actor/grad_norm": ("grad_norm",),
    "actor/kl": ("kl",),
    "actor/entropy": ("entropy",),
    "actor/clip_frac": ("clip_ratio/region_mean",),
    "response/mean_length": ("completions/mean_length",),
    "adv/zero_std_groups": ("frac_reward_zero_std",),
}
CLOCK_KEYS = ("step", "epoch", "train_runtime", "train_tokens_per_second")


def read_config(path: Path, num_processes: int = 1) -> FrameworkConfig:
    data = load_mapping(path)
    if not isinstance(data, dict):
        raise ConfigError("expected a mapping of GRPOConfig fields", where=str(path))
    s = Settings({k: (v, str(path)) for k, v in data.items()}, DEFAULTS, str(path))
    pd, accum, g = s.get(PER_DEVICE, as_int), s.get(ACCUM, as_int), s.get(GENS, as_int)
    iters, per_step = s.get(ITERS, as_int), pd * num_processes
    spg, gen_batch = s.get(STEPS_PER_GEN, as_int), s.get(GEN_BATCH, as_int)
    if spg is None:
        spg = gen_batch // per_step if gen_batch is not None else accum
    b = per_step * spg
    if b % g:
        raise ConfigError(f"generation batch {b} completions ({PER_DEVICE} {pd} x {num_processes} "
                          f"processes x {STEPS_PER_GEN} {spg}) is not a multiple of {GENS} {g}",
                          where=str(path))
    warmup, ratio = s.get(WARMUP, as_float), s.get(WARMUP_RATIO, as_float)
    if warmup is not None and 0 < warmup < 1:
        warmup, ratio = None, warmup
    max_steps = s.get(MAX_STEPS, as_int)
    k = spg * iters / accum
    extra = {PER_DEVICE: pd, "num_processes": num_processes, ACCUM: accum, STEPS_PER_GEN: spg,
             ITERS: iters, "optimizer_steps_per_generation": int(k) if k == int(k) else k}
    return FrameworkConfig(
        framework="trl", prompts_per_step=b // g, samples_per_prompt=g, lr=s.get(LR, as_float),
        mini_batch_prompts=max(1, per_step * accum // g), epochs_per_step=iters,
        warmup_steps=int(warmup) if warmup else None, warmup_ratio=ratio,
        total_steps=max_steps if max_steps and max_steps > 0 else None, algorithm="grpo",
        seed=s.get(SEED, as_int), extra=extra, settings=s.used, notes=tuple(s.notes),
        source=str(path))


# ---------------------------------------------------------------- trainer_state.json
def _log_history(path: Path) -> list:
    try:
        state = json.loads(path.read_bytes())
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deeply
        line = getattr(exc, "lineno", None)
        raise DataError(f"invalid JSON ({exc.__class__.__name__})",
                        where=f"{path}:{line}" if line else str(path)) from None
    history = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(history, list):
        raise DataError("no log_history list (expected a transformers trainer_state.json)",
                        where=str(path))
    for i, entry in enumerate(history):
        if not is_step(entry.get("step") if isinstance(entry, dict) else None):
            raise DataError(f"log_history[{i}] has no integer 'step' in 0..{MAX_STEP}",
                            where=str(path))
    return [finite_values(e) for e in history]


def _json_clock(history: list, warnings: list, path: Path) -> dict:
    """global_step -> training seconds (evaluation excluded) for every training entry."""
    final = next((e for e in history if "train_loss" in e), None)
    eval_s, clock, per_row = 0.0, {}, True
    for e in history:
        if any(k.startswith("eval_") for k in e):
            eval_s += num(e.get("eval_runtime")) or 0.0
        elif "train_loss" not in e:
            rt = num(e.get("train_runtime"))
            per_row = per_row and rt is not None
            clock[e["step"]] = None if rt is None else rt - eval_s
    if per_row and clock:
        return clock
    runtime = None if final is None else num(final.get("train_runtime"))
    if runtime is None:
        warnings.append(f"{path}: no train_runtime anywhere; train_s left out")
        return {}
    last = max(e["step"] for e in history) or 1
    total = runtime - eval_s
    warnings.append(f"{path}: rows carry no clock (include_num_input_tokens_seen off); train_s "
                    f"spreads the final train_runtime uniformly over steps (an estimate)")
    return {s: total * s / last for s in clock}


def _from_json(path: Path, warnings: list) -> tuple[list, list]:
    """([(global_step, data, train_s)], [(global_step, eval data)])."""
    history = _log_history(path)
    clock = _json_clock(history, warnings, path)
    train, evals = [], []
    for e in history:
        if any(k.startswith("eval_") for k in e):
            evals.append((e["step"], {f"eval/{k[5:]}": v for k, v in e.items()
                                      if k.startswith("eval_")}))
        elif "train_loss" not in e:
            train.append((e["step"], e, clock.get(e["step"])))
    return train, evals


def _from_tensorboard(path: Path, tb) -> tuple[list, list]:
    evals = [(s, d) for s, d, _ in tb_step_records(tb, {"eval/": "eval/"})]
    eval_runtime = {s: num(d.get("eval/runtime")) or 0.0 for s, d in evals}
    train = []
    # transformers logs `train/epoch` beside each evaluation too: it dates no training step
    for step, data, wall in tb_step_records(tb, {"train/": ""}, undated=("train/epoch",)):
        if step == 0 or set(data) <= {"epoch"}:
            continue  # only that epoch, at an evaluation: no training step
        done = sum(v for s, v in eval_runtime.items() if s < step)
        train.append((step, data, wall - tb.origin - done))
    return train, evals


# ---------------------------------------------------------------- conversion
def _rows(train: list, batch: tuple, k: float, reward_key: str | None, warnings: list,
          where: str) -> list:
    """One row per rollout step (the last logged entry of each), in run-log form."""
    p, b = batch
    merged, w = merge_steps([(math.ceil(gs / k), {**d, "__global_step": gs, "__train_s": t})
                             for gs, d, t in train], where)
    warnings.extend(w)
    metrics = dict(STEP_METRICS)
    if reward_key:
        metrics["reward/mean"] = (reward_key,)
    rows, tokens, prev = [], 0, 0
    for r, data in merged:
        used = {"__global_step", "__train_s", *CLOCK_KEYS}
        row = {"step": r, "samples": r * b, "prompts": r * p}
        mean_len = num(data.get("completions/mean_length"))
        new = r * b - prev
        tokens = None if tokens is None or mean_len is None else tokens + token_count(
            mean_len, new, "completions/mean_length", r, where)
        prev = r * b
        if tokens is not None:
            row["tokens"] = tokens
        if data["__train_s"] is not None:
            row["train_s"] = data["__train_s"]
        row.update(map_metrics(data, metrics, used))
        row["time/critic_update"] = 0.0  # GRPO: no critic
        row["trl/global_step"] = data["__global_step"]
        row.update(extras(data, used, "trl"))
        rows.append(row)
    if tokens is None:
        for row in rows:
            row.pop("tokens", None)
    return rows


def convert(path: Path, res) -> Converted:
    from rlbatch.interop.ingest import build_config, max_logged

    p, g = res.require_batch("its logs count optimizer steps, not samples")
    k = res.updates_per_step or 1
    state = path / "trainer_state.json" if path.is_dir() else path
    warnings: list = []
    if state.suffix == ".json" and state.is_file():
        sources, truncated = [state], False
        train, evals = _from_json(state, warnings)
    else:
        tb = read_tensorboard(path)
        sources, truncated = list(tb.files), tb.truncated
        warnings.extend(tb.warnings)
        train, evals = _from_tensorboard(path, tb)
    steps = _rows(train, (p, p * g), k, res.reward_key, warnings, str(path))
    clock = [(r["trl/global_step"], r.get("train_s")) for r in steps]
    eval_rows = []
    for gs, data in evals:
        t = max((c for s, c in clock if s <= gs and c is not None), default=0.0)
        r = math.ceil(gs / k)
        eval_rows.append({"step": r, "samples": r * p * g, "train_s": t,
                          **{key: num(v) for key, v in data.items()}})
    config = build_config(res, res.algorithm or "grpo", max_logged(steps, "actor/lr"), warnings)
    extra = {"eval_s": sum(num(d.get("eval/runtime")) or 0.0 for _, d in evals),
             "optimizer_steps_per_rollout_step": k}
    return Converted("trl", sources, steps, eval_rows, config, res.seed, warnings, truncated,
                     extra)
