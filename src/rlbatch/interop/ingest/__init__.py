"""`rlbatch ingest`: convert another framework's training log into an rlbatch run directory.

One module per framework (`verl`, `openrlhf`, `trl`, `prime_rl`), each with
`read_config(path) -> FrameworkConfig` (the framework's own config file) and
`convert(path, Resolved) -> Converted` (its log); `writer.write_run` writes the result
atomically. What each module reads, and which names it could not confirm in the framework's
source, is documented in docs/integrations.md.

Batch sizes and the LR come from, in order: the command-line flags, the framework's config
file (`--config`), and for the LR only, the largest logged LR (warned). A log that needs a
batch size it cannot find (verl, OpenRLHF and TRL do not log it) is a one-line error naming
the flag to pass.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from pathlib import Path

from rlbatch.core.config import LR_EXPONENTS
from rlbatch.core.errors import ConfigError, missing
from rlbatch.interop.ingest.common import FrameworkConfig, StepBatch
from rlbatch.interop.ingest.writer import Converted, write_run

FRAMEWORKS = {"verl": "verl", "openrlhf": "openrlhf", "trl": "trl", "prime-rl": "prime_rl"}


@dataclass(frozen=True)
class IngestOptions:
    """What the user told us on the command line (None: not given)."""

    prompts_per_step: int | None = None
    samples_per_prompt: int | None = None
    lr: float | None = None
    seed: int | None = None
    config: str | None = None
    num_processes: int = 1
    updates_per_step: int | None = None
    reward_key: str | None = None
    algorithm: str | None = None
    lr_scaling: str | None = None
    reference_sequences: int | None = None
    reference_lr: float | None = None
    # the run's budget, where known (a trial's): a step past it is a line the run never wrote
    max_samples: int | None = None
    # a log still being written (a trial followed): rows wait for what ends a step (prime-rl:
    # its trainer's line)
    live: bool = False


@dataclass(frozen=True)
class Resolved(StepBatch):
    """Options merged with the framework config file: what a converter works with."""

    framework: str
    prompts_per_step: int | None
    samples_per_prompt: int | None
    lr: float | None
    critic_lr: float | None
    seed: int | None
    algorithm: str | None
    minibatches_per_step: float
    epochs_per_step: int
    updates_per_step: int | None
    reward_key: str | None
    options: IngestOptions
    framework_config: FrameworkConfig | None

    def require_batch(self, why: str) -> tuple[int, int]:
        """(P, G), or a one-line error naming the flags that supply them."""
        if self.prompts_per_step is None or self.samples_per_prompt is None:
            missing = [flag for flag, v in (("--prompts-per-step", self.prompts_per_step),
                                            ("--samples-per-prompt", self.samples_per_prompt))
                       if v is None]
            raise ConfigError(f"{self.framework}: {why}; pass {' and '.join(missing)} "
                              f"(or --config with the run's {self.framework} config file)")
        return self.prompts_per_step, self.samples_per_prompt


def framework_module(framework: str):
    if framework not in FRAMEWORKS:
        raise ConfigError(f"unknown framework '{framework}'; use one of {', '.join(FRAMEWORKS)}")
    return importlib.import_module(f"rlbatch.interop.ingest.{FRAMEWORKS[framework]}")


def read_framework_config(framework: str, path: str | Path,
                          num_processes: int = 1) -> FrameworkConfig:
    """The batch sizing of a framework config file (verl YAML or Hydra overrides, OpenRLHF
    command line in a .sh file, TRL GRPOConfig YAML/JSON, prime-rl TOML)."""
    module = framework_module(framework)
    if framework == "trl":
        return module.read_config(Path(path), num_processes=num_processes)
    return module.read_config(Path(path))


def resolve(framework: str, opts: IngestOptions) -> Resolved:
    """Flags first, then the config file."""
    if opts.lr_scaling is not None and opts.lr_scaling not in LR_EXPONENTS:
        raise ConfigError(f"--lr-scaling: unknown rule '{opts.lr_scaling}'; use sqrt, linear "
                          f"or none")
    fc = read_framework_config(framework, opts.config, opts.num_processes) if opts.config else None

    def pick(flag, attr):
        return flag if flag is not None else (getattr(fc, attr) if fc is not None else None)

    updates = opts.updates_per_step
    if updates is None and fc is not None and "optimizer_steps_per_generation" in fc.extra:
        updates = fc.extra["optimizer_steps_per_generation"]
    return Resolved(
        framework=framework,
        prompts_per_step=pick(opts.prompts_per_step, "prompts_per_step"),
        samples_per_prompt=pick(opts.samples_per_prompt, "samples_per_prompt"),
        lr=pick(opts.lr, "lr"), critic_lr=fc.critic_lr if fc else None,
        seed=pick(opts.seed, "seed"), algorithm=pick(opts.algorithm, "algorithm"),
        minibatches_per_step=fc.minibatches_per_step if fc else 1,
        epochs_per_step=fc.epochs_per_step if fc else 1,
        updates_per_step=updates, reward_key=opts.reward_key, options=opts,
        framework_config=fc,
    )


def build_config(res: Resolved, algorithm: str, logged_lr: float | None,
                 warnings: list) -> dict:
    """config.yaml of an ingested run: what `rlbatch analyze` groups configurations by."""
    lr = res.lr
    if lr is None and logged_lr is not None:
        lr = logged_lr
        warnings.append(f"no --lr or --config: derived.actor_lr taken as the largest logged LR "
                        f"({logged_lr:.6g}); pass --lr to state it")
    batch = {k: v for k, v in (("prompts_per_step", res.prompts_per_step),
                               ("samples_per_prompt", res.samples_per_prompt)) if v is not None}
    k = res.minibatches_per_step
    batch.update(minibatches_per_step=k, epochs_per_step=res.epochs_per_step)
    optimizer = {"lr": lr} if lr is not None else {}
    o = res.options
    for key, value in (("lr_scaling", o.lr_scaling), ("reference_sequences", o.reference_sequences),
                       ("reference_lr", o.reference_lr)):
        if value is not None:
            optimizer[key] = value
    derived = {}
    if res.sequences_per_step is not None:
        derived["sequences_per_step"] = res.sequences_per_step
    derived["updates_per_step"] = k * res.epochs_per_step
    if lr is not None:
        derived["actor_lr"] = lr
    if res.critic_lr is not None and algorithm == "ppo":
        derived["critic_lr"] = res.critic_lr
    return {"algorithm": algorithm, "batch": batch, "optimizer": optimizer, "seed": res.seed,
            "ingest": {"framework": res.framework}, "derived": derived}


def max_logged(rows, key: str) -> float | None:
    """The largest finite value of `key` over the rows (any iterable: a list, a RowSpool)."""
    return max((r[key] for r in rows if isinstance(r.get(key), (int, float))
                and math.isfinite(r[key])), default=None)


def convert(framework: str, path: str | Path, opts: IngestOptions) -> Converted:
    """The framework's log in run-log form (nothing written)."""
    module = framework_module(framework)
    res = resolve(framework, opts)
    if not Path(path).exists():
        raise ConfigError(missing(path, "log path"), where=str(path))
    conv = module.convert(Path(path), res)
    if res.framework_config is not None:
        conv.warnings.extend(f"{res.framework_config.source}: {n}"
                             for n in res.framework_config.notes)
    return conv


def ingest(framework: str, path: str | Path, out_dir: str | Path, opts: IngestOptions,
           force: bool = False) -> dict:
    """Convert `path` and write it to `out_dir` atomically; return the summary."""
    conv = convert(framework, path, opts)
    return write_run(out_dir, conv, force=force)


__all__ = ["FRAMEWORKS", "Converted", "FrameworkConfig", "IngestOptions", "Resolved",
           "build_config", "convert", "ingest", "read_framework_config", "resolve"]
