"""TRL backend: Hugging Face TRL's `GRPOTrainer` driven by an rlbatch config, writing the run log.

The same run-log contract as the built-in trainer (docs/metrics.md): one `steps.jsonl` row per
rollout step, evaluations at the same cumulative-sample marks (multiples of
`eval.every_samples`, greedy held-out accuracy with the built-in decode engine over TRL's own
model object), `summary.json` with the same statuses. Counters, stopping rules and the summary
reuse the built-in `RunState`; only the manifest says `backend: trl`.

Split along what each part does to TRL:
- `mapping`: what TRL is given — the rlbatch config translated to a `GRPOConfig`, the prompt
  dataset, and the reward function over the rlbatch task reward.
- `hooks`: what is hooked into TRL — a `GRPOTrainer` subclass that times the phases, and the
  HF callback that skips non-finite updates and hands each finished rollout step (and each
  checkpoint) to the run.
- `run`: the driver — the run directory and checkpoints, `TRLRun` (steps.jsonl rows,
  evaluation, stopping) and `train_trl`.

Deviations from the built-in trainer (stated, not hidden):
- TRL normalizes group advantages by the Bessel-corrected std (eps 1e-4); the built-in uses
  the population std (eps 1e-6): TRL's advantages are sqrt((G-1)/G) times smaller, a constant
  factor that Adam's normalization nearly cancels.
- Generation is one `model.generate` over all B sequences (`rollout.generation_concurrency`
  and `rollout.engine` do not apply to TRL's rollout; evaluation uses `rollout.engine`, or `hf`
  when it is `vllm`). With one update per step the old log-probabilities of the ratio are
  the current policy's, detached (no extra forward, like the built-in trainer, which takes
  the engine's); with several, TRL recomputes them in one extra forward (in `time/other`).
- HF's `Trainer` never skips an update; here a callback drops the gradients of an update whose
  gradient norm is non-finite (counted in `actor/nonfinite_skipped`), and
  `nonfinite.max_consecutive` such steps in a row end the run as `diverged`.
- Weight decay follows HF (not applied to biases and norm weights).
- Rewards go through the same reward runner and policy as the built-in trainer (a worker
  pool with a timeout for `module:function` rewards, faults counted per step, the run failed
  past `reward.max_error_rate`), except `reward.on_error: drop`, which is refused: TRL's group
  statistics cannot leave a sample out, so a faulted sample gets `reward.error_value`.
- Any exception inside the run writes `status: failed` and `failure` before propagating, as
  the built-in trainer does; `--resume` continues a failed run from its newest checkpoint.
- Checkpoints are TRL/HF checkpoint folders under `<run>/trl/checkpoint-<optimizer step>`
  (plus rlbatch's `counters.json`), written at `checkpoint.every_samples` marks and at the end;
  `--resume` continues from the newest one (HF restores model, optimizer, scheduler, RNG and
  skips the consumed batches), or starts over when there is none.
"""
