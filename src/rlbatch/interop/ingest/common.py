"""Pieces shared by the framework modules of `rlbatch ingest` and by `rlbatch plan`: the
config side (each module's `read_config`). The log side (each module's `convert`: JSON lines,
TensorBoard events, row helpers) is `ingest.logs`.

- `FrameworkConfig`: the batch, group-size, mini-batch and LR values of one run of another
  framework, in rlbatch's units (prompts, samples per prompt), plus the framework's own
  names and values they were read from (`settings`). `StepBatch` gives it and the
  ingest's `Resolved` their `sequences_per_step`.
- Readers of config sources: shell scripts holding a training command (`shell_tokens`),
  TOML/YAML/JSON config files (`load_mapping`), dotted lookups (`get_path`), and `Settings`,
  which converts values (`as_int`, `as_float`) and notes each framework default it assumed.
  A file that is not UTF-8 text (`read_config_text`) is one line naming it and the byte.
- A `FrameworkConfig` read from a file checks its values on construction: P, G, mini
  batches and epochs >= 1, LRs finite and > 0; otherwise one line naming the file and the
  framework setting that gave the value (a config with `data.train_batch_size=-5` would
  otherwise become a run with a negative B).

No torch import: ingest runs where the framework's own stack is not installed.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rlbatch.core.errors import ConfigError, missing

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


class StepBatch:
    """`sequences_per_step` (B = P x G) of a dataclass with `prompts_per_step` (P) and
    `samples_per_prompt` (G) fields; None while either is unknown."""

    prompts_per_step: int | None
    samples_per_prompt: int | None

    @property
    def sequences_per_step(self) -> int | None:
        if self.prompts_per_step is None or self.samples_per_prompt is None:
            return None
        return self.prompts_per_step * self.samples_per_prompt


@dataclass(frozen=True)
class FrameworkConfig(StepBatch):
    """Batch sizing of one run of another framework, converted to rlbatch units.

    `mini_batch_prompts` is the prompts per optimizer update (None: the whole rollout batch);
    `warmup_steps` / `total_steps` count the framework's LR-scheduler steps; `settings` maps
    the framework's own names to the values read; `notes` says what was assumed.
    """

    framework: str
    prompts_per_step: int | None = None
    samples_per_prompt: int | None = None
    lr: float | None = None
    critic_lr: float | None = None
    mini_batch_prompts: int | None = None
    critic_mini_batch_prompts: int | None = None
    epochs_per_step: int = 1
    warmup_steps: int | None = None
    warmup_ratio: float | None = None
    total_steps: int | None = None
    algorithm: str | None = None
    seed: int | None = None
    extra: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)
    notes: tuple = ()
    source: str | None = None

    def __post_init__(self):
        if self.source is not None:  # read from a file: check what the file said
            check_values(self)

    @property
    def minibatches_per_step(self) -> float:
        """Optimizer updates per epoch over one rollout batch (k; 1 when not mini-batched)."""
        if self.mini_batch_prompts is None or self.prompts_per_step is None:
            return 1
        k = self.prompts_per_step / self.mini_batch_prompts
        return int(k) if k == int(k) else k


_AT_LEAST_ONE = {"prompts_per_step": "prompts per rollout step",
                 "samples_per_prompt": "samples per prompt",
                 "mini_batch_prompts": "prompts per optimizer update",
                 "critic_mini_batch_prompts": "prompts per critic update",
                 "epochs_per_step": "epochs per rollout step"}
_LRS = {"lr": "learning rate", "critic_lr": "critic learning rate"}


def check_values(fc: FrameworkConfig) -> None:
    """A ConfigError for the first value of `fc` out of range, naming `fc.source` and the
    framework setting(s) of that value (those in `fc.settings` holding it; a value computed
    from several settings names them all)."""
    def fail(attr: str, what: str, rule: str) -> None:
        value = getattr(fc, attr)
        names = [k for k, v in fc.settings.items()
                 if not isinstance(v, bool) and isinstance(v, (int, float))
                 and (v == value or (math.isnan(v) and math.isnan(value)))]
        shown = names or [f"{k}={v!r}" for k, v in fc.settings.items()]
        origin = f" (from {', '.join(shown)})" if shown else ""
        raise ConfigError(f"{what} = {value!r}{origin} must be {rule}", where=fc.source)

    for attr, what in _AT_LEAST_ONE.items():
        value = getattr(fc, attr)
        if value is not None and value < 1:
            fail(attr, what, ">= 1")
    for attr, what in _LRS.items():
        value = getattr(fc, attr)
        if value is not None and not (math.isfinite(value) and value > 0):
            fail(attr, what, "a finite number > 0")


# ---------------------------------------------------------------- values and mappings
def as_int(value: Any, name: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"{name}: expected an integer, got {value!r}", where=where)
    try:
        f = float(value)
    except ValueError:
        raise ConfigError(f"{name}: expected an integer, got {value!r}", where=where) from None
    if not math.isfinite(f) or f != int(f):
        raise ConfigError(f"{name}: expected an integer, got {value!r}", where=where)
    return int(f)


def as_float(value: Any, name: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"{name}: expected a number, got {value!r}", where=where)
    try:
        return float(value)
    except ValueError:
        raise ConfigError(f"{name}: expected a number, got {value!r}", where=where) from None


def get_path(d: Any, dotted: str) -> Any:
    """`d['a']['b']` for 'a.b' (None when any part is missing)."""
    for part in dotted.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


def read_config_text(path: Path) -> str:
    """The text of a framework config file; a ConfigError naming the file when it is not
    UTF-8 (a binary file passed as `--config` or `--base`)."""
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"not a UTF-8 text file (byte 0x{data[exc.start]:02x} at offset "
                          f"{exc.start}); expected a framework config file",
                          where=f"{path}:{line}") from None


def load_mapping(path: Path) -> dict:
    """A TOML, YAML or JSON file as a dict; a syntax error names the file (and line)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(missing(path, "config file"), where=str(path))
    text = read_config_text(path)
    suffix = path.suffix.lower()
    try:
        if suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        elif suffix == ".json":
            data = json.loads(text)
        else:
            data = yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        mark = getattr(exc, "problem_mark", None)
        line = getattr(exc, "lineno", None) or (mark.line + 1 if mark is not None else None)
        where = f"{path}:{line}" if line else str(path)
        msg = str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__
        raise ConfigError(f"cannot parse ({msg})", where=where) from None
    return data if data is not None else {}


def shell_tokens(path: Path) -> list[tuple[str, int]]:
    """Words of a shell script with the line each logical line starts on.

    Backslash-newline continuations are joined, comments dropped, quotes removed, and `$VAR`,
    `${VAR}`, `${VAR:-default}` expanded from simple `VAR=value` assignments made earlier in
    the script (also `export VAR=value`). Unknown variables stay as written.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(missing(path), where=str(path))
    variables: dict[str, str] = {}
    out: list[tuple[str, int]] = []
    lines = read_config_text(path).splitlines()
    i = 0
    while i < len(lines):
        start, text = i + 1, lines[i]
        while text.rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            text = text.rstrip()[:-1] + " " + lines[i]
        i += 1
        try:
            words = shlex.split(text, comments=True)
        except ValueError as exc:
            raise ConfigError(f"cannot split shell line ({exc})", where=f"{path}:{start}") from None
        for word in words:
            word = _expand(word, variables)
            name, eq, value = word.partition("=")
            if eq and _IDENT.match(name):
                variables[name] = value
            out.append((word, start))
    return out


def _expand(word: str, variables: dict[str, str]) -> str:
    def sub(m: re.Match) -> str:
        name = m.group(1) or m.group(3)
        if name in variables:
            return variables[name]
        if m.group(2) is not None:
            return m.group(2)
        return m.group(0)

    return _VAR.sub(sub, word)


class Settings:
    """A framework's settings as read: name -> (value, where). `get` converts a value and
    falls back to the framework's documented default, noting the assumption."""

    def __init__(self, values: dict[str, tuple[Any, str]], defaults: dict, source: str):
        self.values, self.defaults, self.source = values, defaults, source
        self.notes: list[str] = []
        self.used: dict[str, Any] = {}

    def get(self, name: str, kind=None) -> Any:
        if name in self.values:
            value, where = self.values[name]
            value = kind(value, name, where) if kind else value
        elif name in self.defaults:
            value = self.defaults[name]
            self.notes.append(f"{name} not set; the framework default {value!r} assumed")
        else:
            return None
        self.used[name] = value
        return value
