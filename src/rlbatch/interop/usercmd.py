"""What the user's own training command and the files it names say, read before a trial
runs (`backend: command`, docs/integrations.md): the values of its flags, prime-rl's TOML,
verl's loggers, the prompts of OpenRLHF's data sets; and the settings a trial cannot run
with, refused in one line naming the flag or file and what to set instead.

Each rule cites the framework file it follows: OpenRLHF 3c3be62 (the openrlhf 0.11.2
wheel), prime-rl 559b447, verl 1dda039.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import sys
from pathlib import Path

import tomllib

from rlbatch.core.errors import ConfigError


def flag_values(argv: list[str], flag: str) -> list[str]:
    """Every value given to `flag`, as `flag VALUE` or `flag=VALUE`, in order."""
    return [b for a, b in itertools.pairwise(argv) if a == flag] + \
        [w.split("=", 1)[1] for w in argv if w.startswith(flag + "=")]


def hydra_value(argv: list[str], key: str) -> str | None:
    """The last Hydra override of `key` (`key=v`, `+key=v`, `++key=v`), or None."""
    found = [w.split("=", 1)[1] for w in argv
             if "=" in w and w.split("=", 1)[0].lstrip("+") == key]
    return found[-1] if found else None


# ---------------------------------------------------------------- prime-rl's TOML
def prime_rl_toml(argv: list[str], where: str) -> dict:
    """The tables of every `@ FILE` the command names (prime-rl's `rl @ rl.toml`,
    packages/prime-rl-configs/README.md 21), later files over earlier ones, key by key;
    a file that cannot be read here is left out (the command fails on it itself)."""
    files = [b for a, b in itertools.pairwise(argv) if a == "@"] + \
        [w[1:] for w in argv if w.startswith("@") and w.endswith(".toml")]
    merged: dict = {}
    for name in files:
        try:
            doc = tomllib.loads(Path(where, os.path.expanduser(name)).read_text())
        except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
            continue
        _merge(merged, doc)
    return merged


def _merge(into: dict, doc: dict) -> None:
    for k, v in doc.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


def prime_rl_flag(argv: list[str], name: str) -> str | None:
    """The last value of a prime-rl flag given on the command line (`--a.b-c`, `--a.b_c`,
    `=value` or the next word; a bare boolean flag reads "true"), or None."""
    spellings = {f"--{name}", f"--{name.replace('_', '-')}"}
    value = None
    for i, w in enumerate(argv):
        key, eq, v = w.partition("=")
        if key in spellings:
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            value = v if eq else (nxt if nxt is not None and not nxt.startswith("-")
                                  else "true")
    return value


def prime_rl_has_inference(argv: list[str], where: str) -> bool:
    """Whether the user's run starts its own inference server: an `[inference]` table in
    its TOML or an `--inference...` word. prime-rl's `RLConfig.inference` is None
    otherwise and `rl` starts no server (packages/prime-rl-configs/src/prime_rl/configs/
    rl.py 234-235): a server run apart is the user's."""
    return "inference" in prime_rl_toml(argv, where) or any(
        w.startswith("--inference") for w in argv)


def check_prime_rl(cfg, where: str) -> None:
    """A relative target needs prime-rl's base-model evaluation, which
    `orchestrator.eval.skip_first_step` turns off (orchestrator/eval_source.py 50;
    configs/orchestrator.py 313); and a source's own `interval` replaces the group's
    (`EvalConfig.resolve_env_defaults`, configs/orchestrator.py 259, 323-338), so the
    cadence rlbatch sets (`--orchestrator.eval.interval`) would not reach it."""
    argv = cfg.command.argv
    toml = prime_rl_toml(argv, where)
    ev = toml.get("orchestrator", {}).get("eval", {}) if isinstance(
        toml.get("orchestrator"), dict) else {}
    skip = prime_rl_flag(argv, "orchestrator.eval.skip_first_step")
    skipped = (skip.lower() == "true") if skip is not None else ev.get("skip_first_step") is True
    if skipped and cfg.target.gain is not None:
        raise ConfigError(
            "command.argv: orchestrator.eval.skip_first_step is true, so prime-rl never "
            "evaluates the base model that target.gain is measured from; remove it (or set "
            "target.value to an absolute score and target.gain: null)")
    for source in ev.get("source", []) if isinstance(ev.get("source"), list) else []:
        if isinstance(source, dict) and "interval" in source:
            raise ConfigError(
                f"command.argv: [[orchestrator.eval.source]] {source.get('name', '?')!r} sets "
                f"interval = {source['interval']}, which replaces the evaluation cadence "
                "rlbatch sets from eval.every_samples (--orchestrator.eval.interval); remove "
                "the source's interval")


# ---------------------------------------------------------------- verl's loggers
VERL_DEFAULT_LOGGERS = ["console", "wandb"]  # verl/trainer/config/ppo_trainer.yaml 152


def verl_loggers(argv: list[str], where: str) -> list[str]:
    """The loggers the user's verl run has: its `trainer.logger=` override, else the
    `trainer.logger` of the config file it names (`--config-path`/`--config-name`, Hydra's
    flags), else verl's default (trainer/config/ppo_trainer.yaml 152)."""
    value = hydra_value(argv, "trainer.logger")
    if value is not None:
        return [w.strip().strip("'\"") for w in value.strip().strip("[]").split(",")
                if w.strip().strip("'\"")]
    paths = flag_values(argv, "--config-path") + flag_values(argv, "-cp")
    names = flag_values(argv, "--config-name") + flag_values(argv, "-cn")
    if paths and names:
        import yaml

        name = names[-1] if names[-1].endswith((".yaml", ".yml")) else names[-1] + ".yaml"
        try:
            doc = yaml.safe_load(Path(where, paths[-1], name).read_text()) or {}
        except (OSError, yaml.YAMLError):
            doc = {}
        found = (doc.get("trainer") or {}).get("logger") if isinstance(doc, dict) else None
        if isinstance(found, str):
            return [found]
        if isinstance(found, list):
            return [str(x) for x in found]
    return list(VERL_DEFAULT_LOGGERS)


# ---------------------------------------------------------------- OpenRLHF's data sets
def count_prompts(value: str, where: str) -> int | None:
    """Prompts in an OpenRLHF data set flag (comma-separated parts, each `path[@dir]`,
    openrlhf/datasets/utils.py `blending_datasets`) when every part is a local .jsonl or
    .json file; None when any part cannot be counted here (a hub name, parquet, a folder)."""
    total = 0
    for part in value.split(","):
        file = Path(where, os.path.expanduser(part.split("@", 1)[0].strip()))
        if not file.is_file() or file.suffix not in (".jsonl", ".json"):
            return None
        text = file.read_text(errors="replace")
        if file.suffix == ".jsonl":
            total += sum(1 for line in text.splitlines() if line.strip())
        else:
            try:
                total += len(json.loads(text))
            except (ValueError, TypeError):
                return None
    return total


def check_openrlhf_train_set(cfg, where: str, prompts: set[int]) -> None:
    """OpenRLHF trains one pass over its prompts per episode and stops when the loader is
    exhausted (openrlhf/trainer/ppo_trainer.py 516-569, a short last batch included); it has
    no step limit, so rlbatch bounds the run with `--train.num_episodes 1` and
    `--data.max_samples` = steps x P. More episodes would not fit the budget: the LR
    schedule's length is num_episodes passes over the set (`prepare_datasets` 71-78), not
    the budget, and the run would train on past it. A train set (`--data.prompt_dataset`,
    summed when no `--data.prompt_probs` interleaves it) smaller than some trial's steps x P
    is refused with the budget that fits."""
    argv = cfg.command.argv
    values = flag_values(argv, "--data.prompt_dataset")
    if not values or flag_values(argv, "--data.prompt_probs"):
        return
    n = count_prompts(values[-1], where)
    if n is None:
        return
    g, budget = cfg.batch.samples_per_prompt, cfg.budget.max_samples
    for p in sorted(prompts):
        need = math.ceil(budget / (p * g)) * p
        if n < need:
            fits = min((n // q) * q * g for q in prompts)
            raise ConfigError(
                f"command.argv: --data.prompt_dataset {values[-1]}: {n:,} prompts, fewer than "
                f"the {need:,} the trial with P = {p} needs for budget.max_samples {budget:,} "
                "(OpenRLHF makes one pass over its train set, then stops): set "
                f"budget.max_samples to at most {fits:,}, or give a larger train set")


def warn_uncounted_eval_set(cfg, where: str, prompts: set[int]) -> None:
    """One line on stderr when the evaluation set cannot be counted here: OpenRLHF cuts it
    to `--data.max_samples` prompts (ppo_trainer.py `prepare_datasets` 59), which rlbatch
    sets per trial, so a set larger than the smallest cut would differ between trials."""
    values = flag_values(cfg.command.argv, "--eval.dataset")
    if not values or count_prompts(values[-1], where) is not None:
        return
    g, budget = cfg.batch.samples_per_prompt, cfg.budget.max_samples
    cut, p = min((math.ceil(budget / (q * g)) * q, q) for q in prompts)
    print(f"warning: command.argv: --eval.dataset {values[-1]} is not a local .jsonl or "
          f".json, so rlbatch cannot count it: OpenRLHF keeps only its first {cut:,} prompts "
          f"in the trial with P = {p} (--data.max_samples); use a local .jsonl of at most "
          f"{cut:,} prompts to have it checked", file=sys.stderr)
