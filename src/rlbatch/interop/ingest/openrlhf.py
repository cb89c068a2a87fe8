"""OpenRLHF: TensorBoard events -> run log; a launch command in a .sh file -> `FrameworkConfig`.

Reads the `train/<key>` and `eval/<key>` scalars that OpenRLHF's PPO trainer writes once per
rollout step (openrlhf/trainer/ppo_trainer.py `save_logs_and_checkpoints`), and the flags of
its launch script (openrlhf/cli/train_ppo_ray.py) in both spellings: flat up to release
0.10.1, dotted from 0.10.2. samples = step x P x G. train_s is the cumulative sum of
OpenRLHF's own `timing/step_total` (generation, experience making, PPO update and weight
broadcast of each step: ppo_trainer.py `fit` and `train_step`, 3c3be62), which leaves out
start-up (the TensorBoard writer opens before the models load: train_ppo_ray.py `train`),
checkpoint saves and evaluations. Logs without it (before 2026-03) fall back to event wall
time less evaluation time, start-up and checkpoint time included. Keys, units and flags:
docs/design.md, "Module notes".
"""


from __future__ import annotations

from pathlib import Path

from rlbatch.interop.ingest.common import FrameworkConfig, Settings, as_float, as_int, shell_tokens
from rlbatch.interop.ingest.logs import extras, map_metrics, num, read_tensorboard, tb_step_records
from rlbatch.interop.ingest.writer import Converted, token_count

STEP_TOTAL = "timing/step_total"
TIMED = "the cumulative sum of OpenRLHF's timing/step_total"
UNTIMED = "event wall time since the writer opened, minus measured evaluation time"


def timed(train: list) -> bool:
    """Every step logs OpenRLHF's own step time (its logs since 2026-03)."""
    return bool(train) and all(num(d.get(STEP_TOTAL)) is not None for _, d, _ in train)


ROLLOUT, N, TRAIN = "--rollout_batch_size", "--n_samples_per_prompt", "--train_batch_size"
MICRO, LR, CRITIC_LR = "--micro_train_batch_size", "--actor_learning_rate", "--critic_learning_rate"
EPOCHS, WARMUP, ADV, SEED = "--max_epochs", "--lr_warmup_ratio", "--advantage_estimator", "--seed"
# argparse defaults of openrlhf/cli/train_ppo_ray.py (flat flags, up to 0.10.1)
DEFAULTS = {ROLLOUT: 1024, N: 1, TRAIN: 128, MICRO: 4, LR: 1e-6, CRITIC_LR: 9e-6, EPOCHS: 1,
            WARMUP: 0.03, ADV: "gae", SEED: 42}
# the same settings from 0.10.2 (dotted flags; read at 3c3be62, v0.11.0)
DOTTED = {ROLLOUT: "--rollout.batch_size", N: "--rollout.n_samples_per_prompt",
          TRAIN: "--train.batch_size", MICRO: "--train.micro_batch_size", LR: "--actor.adam.lr",
          CRITIC_LR: "--critic.adam.lr", EPOCHS: "--train.max_epochs",
          WARMUP: "--actor.lr_warmup_ratio", ADV: "--algo.advantage.estimator",
          SEED: "--train.seed"}
DOTTED_DEFAULTS = {**DEFAULTS, MICRO: 1}

STEP_METRICS = {
    "reward/mean": ("reward",),
    "actor/loss": ("policy_loss",),
    "actor/lr": ("actor_lr",),
    "actor/grad_norm": ("actor_grad_norm",),
    "critic/grad_norm": ("critic_grad_norm",),
    "actor/kl": ("kl",),
    "actor/clip_frac": ("ppo_clip_ratio",),
    "critic/loss": ("critic_loss",),
    "critic/lr": ("critic_lr",),
    "critic/value_mean": ("values",),
    "response/mean_length": ("response_length",),
}


def read_settings(path: Path) -> dict:
    """`--name value`, `--name=value` and bare `--flag` words of a launch script."""
    words = shell_tokens(path)
    out: dict = {}
    i = 0
    while i < len(words):
        word, line = words[i]
        i += 1
        if not word.startswith("--") or word == "--":
            continue
        name, eq, value = word.partition("=")
        if not eq:
            if i < len(words) and not words[i][0].startswith("--"):
                value = words[i][0]
                i += 1
            else:
                value = True
        out[name] = (value, f"{path}:{line}")
    return out


def flag_names(style: str) -> dict[str, str]:
    """The flag of each setting in a style: `flat` (up to 0.10.1) or `dotted` (0.10.2 on),
    keyed by the flat name."""
    return {k: (DOTTED[k] if style == "dotted" else k) for k in DEFAULTS}


def read_config(path: Path) -> FrameworkConfig:
    raw = read_settings(path)
    style = "dotted" if any("." in k for k in raw) else "flat"
    f = flag_names(style)
    defaults = DOTTED_DEFAULTS if style == "dotted" else DEFAULTS
    s = Settings(raw, {f[k]: v for k, v in defaults.items()}, str(path))
    prompts, n = s.get(f[ROLLOUT], as_int), s.get(f[N], as_int)
    train = s.get(f[TRAIN], as_int)
    if train % n:
        s.notes.append(f"{f[TRAIN]}={train} is not a multiple of {f[N]}={n}; mini-batch rounded")
    mini = max(1, round(train / n))
    if mini > prompts:
        s.notes.append(f"{f[TRAIN]}={train} exceeds the rollout batch ({prompts * n} samples): "
                       f"optimizer updates span rollout steps")
    if style == "dotted" and str(raw.get("--actor.optim", ("adam",))[0]) == "muon":
        s.notes.append("--actor.optim muon: the 2-D weights use --actor.muon.lr; the LR read "
                       "here is --actor.adam.lr, which Muon applies to the rest")
    adv = str(s.get(f[ADV]))
    algorithm = "ppo" if adv == "gae" else "grpo" if adv in ("group_norm", "dr_grpo") else adv
    return FrameworkConfig(
        framework="openrlhf", prompts_per_step=prompts, samples_per_prompt=n,
        lr=s.get(f[LR], as_float),
        critic_lr=s.get(f[CRITIC_LR], as_float) if adv == "gae" else None,
        mini_batch_prompts=min(mini, prompts), epochs_per_step=s.get(f[EPOCHS], as_int),
        warmup_ratio=s.get(f[WARMUP], as_float), algorithm=algorithm,
        seed=s.get(f[SEED], as_int),
        extra={"micro_train_batch_size": s.get(f[MICRO], as_int), "train_batch_size": train,
               "flag_style": style},
        settings=s.used, notes=tuple(s.notes), source=str(path))


def _step_rows(train: list, evals: dict, batch: tuple, origin: float, algorithm: str,
               reward_key: str | None, where: str, own: bool) -> tuple[list, float]:
    """Training rows and the total evaluation seconds subtracted from train_s (`own`: from
    OpenRLHF's own step times, `timed`)."""
    p, b = batch
    rows, eval_s, tokens = [], 0.0, 0
    total = 0.0
    metrics = dict(STEP_METRICS)
    if reward_key:
        metrics["reward/mean"] = (reward_key,)
    for step, data, wall in train:
        used: set = set()
        row = {"step": step, "samples": step * b, "prompts": step * p}
        mean_len = num(data.get("response_length"))
        tokens = None if tokens is None or mean_len is None else tokens + token_count(
            mean_len, b, "train/response_length", step, where)
        if tokens is not None:
            row["tokens"] = tokens
        total += num(data[STEP_TOTAL]) if own else 0.0
        row["train_s"] = total if own else wall - origin - eval_s
        row.update(map_metrics(data, metrics, used))
        if algorithm == "grpo":
            row["time/critic_update"] = 0.0
        row.update(extras(data, used, "openrlhf"))
        rows.append(row)
        if step in evals:
            eval_s += max(0.0, evals[step][1] - wall)
    if tokens is None:
        for r in rows:
            r.pop("tokens", None)
    return rows, eval_s


def convert(path: Path, res) -> Converted:
    from rlbatch.interop.ingest import build_config, max_logged

    p, g = res.require_batch("TensorBoard logs do not record the batch size "
                             "(samples = step x prompts x samples per prompt)")
    tb = read_tensorboard(path)
    train = tb_step_records(tb, {"train/": ""})
    evals = {s: (d, w) for s, d, w in tb_step_records(tb, {"eval/": "eval/"})}
    algorithm = res.algorithm or ("ppo" if any("critic_loss" in d for _, d, _ in train)
                                  else "grpo")
    own = timed(train)
    steps, eval_s = _step_rows(train, evals, (p, p * g), tb.origin, algorithm, res.reward_key,
                               str(path), own)
    train_s_at = {r["step"]: r["train_s"] for r in steps}
    eval_rows = []
    for step, (data, wall) in sorted(evals.items()):
        before = [s for s in train_s_at if s <= step]
        t = train_s_at[max(before)] if before else 0.0
        eval_rows.append({"step": step, "samples": step * p * g, "train_s": t,
                          **{k: num(v) for k, v in data.items()}})
    warnings = list(tb.warnings)
    config = build_config(res, algorithm, max_logged(steps, "actor/lr"), warnings)
    extra = {"eval_s": eval_s, "train_s_source": TIMED if own else UNTIMED}
    if steps:
        extra["first_step_s"] = steps[0]["train_s"]
    return Converted("openrlhf", list(tb.files), steps, eval_rows, config, res.seed, warnings,
                     tb.truncated, extra)
