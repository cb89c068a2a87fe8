"""A trial's staleness (`rollout.max_staleness` = k) as the framework's own setting
(`backend: command`; docs/integrations.md, "Staleness"): what interop/launch.py appends, and
the one-line refusals where a framework, or the user's command, cannot run at k."""

from __future__ import annotations

import itertools

from rlbatch.core.errors import ConfigError

OPENRLHF_ASYNC = "--train.async_enable"
# verl's staleness is its entry point (verl 0.9.1, the wheel `make setup` installs):
# `verl.trainer.main_ppo` decodes each batch with the weights it then trains;
# `verl.experimental.one_step_off_policy.main_ppo` awaits the batch decoded during the
# previous step, syncs the weights, starts decoding the next batch and then trains
# (one_step_off_policy/ray_trainer.py `_fit_generate` 385-407): the lag is 1 from step 2
# on, as rlbatch's own at rollout.max_staleness 1 (backends/builtin/ahead.py)
VERL_ENTRIES = {"verl.trainer.main_ppo": 0, "verl.experimental.one_step_off_policy.main_ppo": 1}


def verl_entry(argv: list[str]) -> str | None:
    """The module the user's verl command runs: the word after `-m`, or a script path as a
    dotted name (`.../verl/trainer/main_ppo.py`)."""
    for a, b in itertools.pairwise(argv):
        if a == "-m":
            return b
    for w in argv:
        if w.endswith(".py") and "verl/" in w.replace("\\", "/"):
            return "verl." + w.replace("\\", "/").rsplit("verl/", 1)[1][:-3].replace("/", ".")
    return None


def stale_settings(spec, base: list[str]) -> dict:
    """The framework's own setting for the trial's staleness k (`rollout.max_staleness`;
    docs/integrations.md, "Staleness"), or a one-line ConfigError where the framework, or
    the user's command, cannot run at k:

    - rlbatch: `rollout.max_staleness` itself;
    - OpenRLHF (the 0.11.2 wheel): k > 0 is `--train.async_enable
      --train.async_queue_size k`: the generator takes one of k slot tokens before each
      batch and the trainer returns one as it takes a batch, before training on it
      (trainer/ppo_trainer_async.py 109-136, 227-237, 287-296), so at most k batches are
      decoded ahead of the update; its loss clips against log-probabilities the trainer
      recomputes (the behaviour policy enters only through its optional IS correction);
      `--vllm.enable_sleep` under `--train.colocate_all` is refused with it
      (cli/train_ppo_ray.py 707-715);
    - prime-rl (559b447): k > 0 is `orchestrator.max_off_policy_steps` (configs/
      orchestrator.py 532: episodes older than k steps are dropped); prime-rl always decodes
      one step ahead (docs/algorithms.md 180), so at 0 the command runs as it is;
    - verl: its entry point (VERL_ENTRIES), checked: k must be the entry's;
    - TRL (f2cd577): `trl grpo` runs GRPOTrainer, which decodes each batch with the policy
      it trains (trainer/grpo_trainer.py); its AsyncGRPOTrainer is experimental and has no
      command: k > 0 is refused."""
    k, f = spec.staleness, spec.framework
    if f == "rlbatch":
        return {"rollout.max_staleness": k} if k else {}
    if f == "openrlhf":
        if OPENRLHF_ASYNC in base or "--async_train" in base:
            raise ConfigError(f"command.argv: {OPENRLHF_ASYNC} is rlbatch's to set, from "
                              "rollout.max_staleness (0: synchronous; k: --train.async_enable "
                              "--train.async_queue_size k): remove it from the command")
        if k and "--vllm.enable_sleep" in base and "--train.colocate_all" in base:
            # cli/train_ppo_ray.py 707-715 (0.11.2): without colocate_all it is turned off
            raise ConfigError(f"rollout.max_staleness {k}: OpenRLHF's asynchronous trainer "
                              "refuses --vllm.enable_sleep with --train.colocate_all: remove "
                              "it from command.argv")
        return {OPENRLHF_ASYNC: True, "--train.async_queue_size": k} if k else {}
    if f == "prime-rl":
        return {"orchestrator.max_off_policy_steps": k} if k else {}
    if f == "verl":
        entry = verl_entry(base)
        fixed = VERL_ENTRIES.get(entry or "verl.trainer.main_ppo")
        if fixed is None and k:
            raise ConfigError(f"rollout.max_staleness {k}: verl's staleness is its entry "
                              f"point, and {entry} is neither verl.trainer.main_ppo (0) nor "
                              "verl.experimental.one_step_off_policy.main_ppo (1)")
        if fixed is not None and k != fixed:
            raise ConfigError(f"rollout.max_staleness {k}: verl's staleness is its entry "
                              f"point, and {entry or 'verl.trainer.main_ppo'} runs at {fixed} "
                              "(verl.trainer.main_ppo: 0; verl.experimental.one_step_off_policy"
                              f".main_ppo: 1); set rollout.max_staleness: {fixed} and "
                              f"profile.max_staleness: [{fixed}]")
        return {}
    if k:
        raise ConfigError(f"rollout.max_staleness {k}: `trl grpo` (TRL's GRPOTrainer) decodes "
                          "each batch with the policy it trains, and TRL's asynchronous "
                          "trainer has no command rlbatch can run; set 0")
    return {}
