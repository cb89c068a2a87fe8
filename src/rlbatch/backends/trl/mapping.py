"""What the TRL backend gives TRL: the rlbatch config as a `GRPOConfig`, the prompts as a
`Dataset`, and the rlbatch task reward as a TRL reward function (package docstring: the
backend as a whole).

Config -> `GRPOConfig` (one rollout step = one TRL generation batch of B = P x G completions):
`num_generations` = G, `generation_batch_size` = B, `per_device_train_batch_size` =
`micro_batch_sequences`, `gradient_accumulation_steps` = minibatch / micro,
`num_iterations` = `epochs_per_step`; optimizer steps per rollout step =
`minibatches_per_step x epochs_per_step` (= `updates_per_step`). `loss_type="dapo"` (token-mean
over the minibatch, the built-in aggregation), `scale_rewards="group"|"none"` from
`loss.advantage_norm`, `epsilon`/`epsilon_high` from the clip ratios, `beta` = `loss.kl_coef`,
AdamW with the scaled LR, betas and eps of `derived:`, the built-in LR schedule (warm-up in
samples, then constant; `hooks`) in place of HF's linear decay, fp32 (no bf16), no gradient
checkpointing, the prompts in stream order (`shuffle_dataset=False`), so TRL sees the same
prompts per step as the built-in trainer.
"""

from __future__ import annotations

import math
from pathlib import Path

from rlbatch.core.config import Config
from rlbatch.core.errors import ConfigError


def check_trl_config(cfg: Config) -> None:
    """One-line errors for configs the TRL backend cannot run as the built-in trainer would."""
    if cfg.algorithm != "grpo":
        raise ConfigError(f"algorithm: the trl backend runs GRPO only, not '{cfg.algorithm}'")
    if cfg.noise_scale.enabled:
        raise ConfigError("noise_scale.enabled: not measured by the trl backend; set it to false")
    if cfg.reward.on_error == "drop":
        raise ConfigError("reward.on_error: 'drop' is not supported by the trl backend (its "
                          "group statistics cannot leave a sample out); use 'value'")


def rollout_steps(cfg: Config) -> int:
    """Rollout steps to reach budget.max_samples (the last step may overshoot, as built-in)."""
    return math.ceil(cfg.budget.max_samples / cfg.sequences_per_step)


def grpo_args(cfg: Config, output_dir: Path, device: str):
    """The `GRPOConfig` an rlbatch config maps onto (module docstring)."""
    from trl import GRPOConfig

    b, loss, opt = cfg.batch, cfg.loss, cfg.optimizer
    micro = cfg.micro_batch_sequences
    adam = cfg.adam
    return GRPOConfig(
        output_dir=str(output_dir),
        num_generations=b.samples_per_prompt,
        generation_batch_size=cfg.sequences_per_step,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=cfg.minibatch_sequences // micro,
        num_iterations=b.epochs_per_step,
        max_steps=rollout_steps(cfg) * cfg.updates_per_step,
        max_completion_length=cfg.rollout.max_new_tokens,
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        top_k=0,
        learning_rate=cfg.actor_lr,
        lr_scheduler_type="constant",  # replaced by the built-in schedule (create_scheduler)
        optim="adamw_torch",
        adam_beta1=adam["betas"][0],
        adam_beta2=adam["betas"][1],
        adam_epsilon=adam["eps"],
        weight_decay=opt.weight_decay,
        max_grad_norm=opt.max_grad_norm or 0.0,
        beta=loss.kl_coef,
        epsilon=loss.clip_ratio_low,
        epsilon_high=loss.clip_ratio_high,
        loss_type="dapo",
        scale_rewards="group" if loss.advantage_norm == "std" else "none",
        mask_truncated_completions=False,
        shuffle_dataset=False,
        use_vllm=False,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        use_cpu=device == "cpu",
        seed=cfg.seed,
        data_seed=cfg.seed,
        report_to=[],
        logging_steps=1,
        logging_nan_inf_filter=False,
        save_strategy="no",  # checkpoints are requested by the run-log callback
        save_total_limit=2,  # the newest complete one survives a kill during the next save
        save_only_model=False,
        disable_tqdm=True,
        dataloader_num_workers=0,
        remove_unused_columns=False,
        log_completions=False,
    )


def build_dataset(task, tokenizer, cfg: Config):
    """The first `steps x P` prompts of the task's training stream, in order, as a Dataset.

    `idx` points back into the returned example list so the reward sees the whole Example.
    With a chat template the prompt is a message list (TRL applies the template, as
    `encode_prompt` does); otherwise plain text (the tiny tokenizer adds `<bos>`).
    """
    from datasets import Dataset

    stream = task.train_stream(cfg.seed)
    examples = [next(stream) for _ in range(rollout_steps(cfg) * cfg.batch.prompts_per_step)]
    chat = bool(getattr(tokenizer, "chat_template", None))
    prompts = [(e.meta.get("messages") or [{"role": "user", "content": e.prompt}]) if chat
               else e.prompt for e in examples]
    return Dataset.from_dict({"prompt": prompts, "idx": list(range(len(examples)))}), examples


class TaskReward:
    """TRL reward function over the rlbatch task reward (through the reward runner); also
    counts this step's tokens and reward faults.

    Unscorable completions (reward None) are counted and scored 0, as in the built-in trainer
    (TRL would drop them from the group baseline instead); a faulted call scores
    `reward.error_value`.
    """

    __name__ = "task_reward"

    def __init__(self, task, examples, runner=None, error_value: float = 0.0, on_faults=None):
        from rlbatch.core.config import RewardConfig
        from rlbatch.rollout.reward_runner import RewardRunner

        self.task, self.examples = task, examples
        self.runner = runner or RewardRunner(task, "exact", 1e-6, RewardConfig())
        self.error_value = error_value
        self.on_faults = on_faults or (lambda rows: None)
        self.reset()

    def reset(self) -> None:
        self.rewards: list[float] = []
        self.unscorable = 0
        self.tokens = 0
        self.lengths: list[int] = []
        self.faults = {"errors": 0, "timeouts": 0, "nonfinite": 0}

    def __call__(self, prompts, completions, completion_ids, idx, **_) -> list[float]:
        from rlbatch.rollout.reward_runner import Call

        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        calls = [Call(self.examples[i].prompt, text, self.examples[i], i)
                 for text, i in zip(texts, idx)]
        scored = self.runner.score(calls)
        self.on_faults(self.runner.log.new(self.runner.name, scored, calls))
        out = []
        for value, fault in zip(scored.values, scored.faults):
            if fault is not None:
                value = self.error_value
            elif value is None:
                self.unscorable += 1
                value = 0.0
            out.append(float(value))
        for key, n in scored.counts().items():
            self.faults[key] += n
        self.lengths.extend(len(ids) for ids in completion_ids)
        self.rewards.extend(out)
        self.tokens += sum(len(ids) for ids in completion_ids)
        return out
