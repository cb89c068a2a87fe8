"""TRL backend: Hugging Face TRL's `GRPOTrainer` driven by an rlbatch config, writing the run log.

The same run-log contract as the built-in trainer (docs/metrics.md): the same rows, the same
evaluation marks and the same statuses, with the built-in `RunState` for counters, stopping
rules and the summary; only the manifest says `backend: trl`. Split along what each part
does to TRL:
- `mapping`: what TRL is given (a `GRPOConfig`, the prompt dataset, the reward function);
- `hooks`: what is hooked into TRL (phase timing, and the callback that skips non-finite
  updates and hands each finished rollout step and checkpoint to the run);
- `run`: the driver (run directory, checkpoints, `TRLRun`, `train_trl`).
Deviations from the built-in trainer (advantage normalization, generation, non-finite
updates, weight decay, `reward.on_error: drop`, checkpoints): docs/design.md, "Module notes".
"""
