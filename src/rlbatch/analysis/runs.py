"""Load run logs into tidy pandas frames and group runs into configurations.

A *configuration* is everything in a run's config.yaml except `seed` and `output_dir`; runs
that differ only in those are seeds of one configuration and share a stable config id
(readable prefix + hash). Runs without config.yaml (bare ingested logs) keep B and LR as
None and each form a configuration of their own, named after their directory.

Row hygiene, applied per run and per file when loading (docs/design.md "The run log"):
duplicated `step` rows keep the *last* one written (a resumed run re-logs steps); rows are
then sorted by `samples` (stable, ties by step); rows without a numeric `samples` are dropped
with a warning. A cut last line is skipped by the reader and its warning kept. Metric values
that are null (NaN/inf when logged) stay NaN here and are skipped by the metric's consumer.
A metric value that is not a number (a string such as "0.5x" or even "0.5", true/false, an
object, a list) is dropped too (NaN), since it would silently move N*: one warning per key
and file names the first such row as `file:line` (the line found by re-reading the file,
only then), the value and how many were dropped; `RunFrames.non_numeric` keeps the counts.

No torch import (docs/design.md, Layers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from rlbatch.core.errors import DataError
from rlbatch.core.runlog import Run, find_runs, identity, read_run, stable_hash

RUN_COLUMNS = ("run", "run_id", "config", "seed", "algorithm", "prompts_per_step",
               "samples_per_prompt", "sequences_per_step", "minibatch_sequences", "lr",
               "lr_scaling", "reference_sequences", "schedule", "staleness", "status",
               "stop_code")


@dataclass(frozen=True)
class RunFrames:
    """Tidy frames of a set of runs.

    runs:  one row per run (columns RUN_COLUMNS; `run` is the directory and the key).
    steps: one row per (run, step), every logged key as a column, cleaned as above.
    evals: one row per (run, evaluation), likewise.
    configs: config id -> the configuration (config.yaml without seed and output_dir).
    warnings: reader and cleaning warnings, one line each.
    non_numeric: metric key -> [(first `file:line`, its value, how many dropped)], one item
        per file where that key had values that are not numbers (dropped as NaN).
    """

    runs: pd.DataFrame
    steps: pd.DataFrame
    evals: pd.DataFrame
    configs: dict = field(default_factory=dict)
    warnings: tuple = ()
    non_numeric: dict = field(default_factory=dict)
    # per-run splits of `steps` and `evals`, filled on first use (the frames never change)
    _split: dict = field(default_factory=dict, repr=False, compare=False)

    def run_steps(self, run: str) -> pd.DataFrame:
        """The step rows of one run (an empty frame if it logged none)."""
        return self._by_run("steps").get(run, self.steps.iloc[0:0])

    def run_evals(self, run: str) -> pd.DataFrame:
        """The evaluation rows of one run (an empty frame if it logged none)."""
        return self._by_run("evals").get(run, self.evals.iloc[0:0])

    def _by_run(self, name: str) -> dict:
        if name not in self._split:
            df = getattr(self, name)
            self._split[name] = dict(tuple(df.groupby("run", sort=False))) if len(df) else {}
        return self._split[name]


def configuration(config: dict) -> dict:
    """The configuration of a run: its resolved config without `seed`, `output_dir` and
    `trackers` (where it writes and which sinks it feeds do not change the experiment), nor
    the reward pool size and default reward policy (`core.runlog.identity`)."""
    return {k: v for k, v in identity(config).items() if k != "seed"}


def config_id(config: dict) -> str:
    """Stable id of a configuration: `<algorithm>-B<B>-lr<lr>-<hash8>` (hash of the whole
    configuration, seed and output_dir excluded, so seeds of one configuration share it)."""
    body = configuration(config)
    b = _get(config, "derived", "sequences_per_step")
    lr = _lr(config)
    prefix = f"{config.get('algorithm', 'run')}-B{b if b is not None else '?'}"
    if lr is not None:
        prefix += f"-lr{lr:.3g}"
    return f"{prefix}-{stable_hash(body, 8)}"


def _get(d: dict, *keys):
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def _lr(config: dict) -> float | None:
    lr = _get(config, "derived", "actor_lr")
    if lr is None:
        lr = _get(config, "optimizer", "lr")
    return float(lr) if isinstance(lr, (int, float)) else None


def _sequences(config: dict) -> int | None:
    b = _get(config, "derived", "sequences_per_step")
    if b is None:
        p = _get(config, "batch", "prompts_per_step")
        g = _get(config, "batch", "samples_per_prompt")
        b = p * g if isinstance(p, int) and isinstance(g, int) else None
    return int(b) if isinstance(b, (int, float)) else None


def _minibatch_sequences(config: dict, sequences: int | None) -> int | float | None:
    """Sequences per optimizer update: `derived.minibatch_sequences`, else B divided by
    `batch.minibatches_per_step` (1 when absent, the config's default; ingested runs write
    it, possibly fractional); None when B is unknown."""
    mb = _get(config, "derived", "minibatch_sequences")
    if isinstance(mb, (int, float)) and not isinstance(mb, bool) and mb > 0:
        return mb
    k = _get(config, "batch", "minibatches_per_step")
    k = 1 if k is None else k
    if sequences is None or isinstance(k, bool) or not isinstance(k, (int, float)) or k <= 0:
        return None
    m = sequences / k
    return int(m) if float(m).is_integer() else float(m)


def schedule_text(config: dict) -> str | None:
    """A batch schedule in a few words (`steps 64,128@256,256@768`, `adaptive x2 to 1024`),
    or None for a run at one B. Its `sequences_per_step` is then the first B."""
    sch = _get(config, "batch", "schedule")
    if not isinstance(sch, dict):
        return None
    if sch.get("steps"):
        return "steps " + ",".join(f"{b}" if not a else f"{b}@{a}" for a, b in sch["steps"])
    a = sch.get("adaptive") or {}
    return f"adaptive x{a.get('factor')} to {a.get('max_sequences')}"


def run_row(run: Run) -> dict:
    """The `runs` frame row of one run (B and LR None when config.yaml is absent)."""
    cfg = run.config
    cid = config_id(cfg) if cfg else \
        f"unconfigured-{run.dir.name}-{stable_hash(str(run.dir.resolve()), 6)}"
    return {
        "run": str(run.dir), "run_id": run.run_id, "config": cid, "seed": run.seed,
        "algorithm": cfg.get("algorithm"),
        "prompts_per_step": _get(cfg, "batch", "prompts_per_step"),
        "samples_per_prompt": _get(cfg, "batch", "samples_per_prompt"),
        "sequences_per_step": _sequences(cfg),
        "minibatch_sequences": _minibatch_sequences(cfg, _sequences(cfg)), "lr": _lr(cfg),
        "lr_scaling": _get(cfg, "optimizer", "lr_scaling"),
        "reference_sequences": _get(cfg, "optimizer", "reference_sequences"),
        "schedule": schedule_text(cfg),
        "staleness": int(_get(cfg, "rollout", "max_staleness") or 0) if cfg else None,
        "status": (run.summary or {}).get("status"),
        "stop_code": (run.summary or {}).get("stop_code"),
    }


def is_metric_value(v) -> bool:
    """A loggable metric value: a number (not a bool) or null/NaN."""
    return v is None or (isinstance(v, (int, float, np.number)) and not isinstance(v, (bool, np.bool_)))


def row_lines(path: str, n: int) -> list[str]:
    """`path:line` of each of the first `n` rows of a JSONL file (blank lines are skipped as
    the reader skips them); `path: row i` when the file cannot be read again."""
    try:
        raw = Path(path).read_bytes().split(b"\n")
    except OSError:
        return [f"{path}: row {i + 1}" for i in range(n)]
    lines = [f"{path}:{i}" for i, b in enumerate(raw, start=1) if b.strip()]
    return (lines + [f"{path}: row {i + 1}" for i in range(len(lines), n)])[:n]


def drop_non_numeric(df: pd.DataFrame, where: str, skip: tuple = ()
                     ) -> tuple[pd.DataFrame, dict]:
    """Every column of `df` but `skip` with its non-numeric values set to NaN. Returns the
    frame and {key: (first `file:line`, that value, count)}; `df`'s index must still be the
    row's position in the file."""
    found: dict = {}
    lines: list[str] | None = None
    for col in df.columns:
        if col in skip or (df[col].dtype.kind in "iuf"):
            continue
        bad = ~df[col].map(is_metric_value).astype(bool)
        if not bad.any():
            continue
        first = int(bad.idxmax())
        if lines is None:
            lines = row_lines(where, int(df.index.max()) + 1)
        found[col] = (lines[first], df[col][first], int(bad.sum()))
        df[col] = df[col].where(~bad, np.nan)
    return df, found


def non_numeric_warning(key: str, place: str, value, count: int) -> str:
    """One line: where the first non-numeric value of `key` is, the value and the count."""
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
    return (f"{place}: '{key}' is {shown}, not a number; {count} such value(s) of '{key}' in "
            "this file dropped (treated as not logged)")


def clean_rows(rows: list[dict], where: str, found: dict | None = None
               ) -> tuple[pd.DataFrame, list[str]]:
    """Rows of one JSONL file -> frame: last of duplicated steps kept, sorted by samples,
    rows without numeric samples dropped (warned), non-numeric metric values dropped (warned
    once per key; added to `found` as in `RunFrames.non_numeric`). `where` names the file."""
    warnings: list[str] = []
    df = pd.DataFrame(rows)
    if df.empty:
        return df, warnings
    if "samples" not in df.columns:
        raise DataError("rows lack the required key 'samples'", where=where)
    for col in ("step", "samples", "train_s"):
        if col in df.columns:
            df[col] = numeric_column(df[col], f"{where} ({col})")
    if "step" in df.columns:
        n = len(df)
        df = df.drop_duplicates(subset="step", keep="last")
        if len(df) < n:
            warnings.append(f"{where}: {n - len(df)} duplicated step row(s); kept the last")
    bad = df["samples"].isna()
    if bad.any():
        warnings.append(f"{where}: {int(bad.sum())} row(s) without samples; skipped")
        df = df[~bad]
    df, dropped = drop_non_numeric(df.copy(), where, skip=("step", "samples", "train_s"))
    for key, (place, value, count) in dropped.items():
        warnings.append(non_numeric_warning(key, place, value, count))
        if found is not None:
            found.setdefault(key, []).append((place, value, count))
    keys = ["samples", "step"] if "step" in df.columns else ["samples"]
    return df.sort_values(keys, kind="stable").reset_index(drop=True), warnings


def numeric_column(col: pd.Series, where: str) -> pd.Series:
    """A column as float64 with null -> NaN; a non-numeric value is a DataError."""
    try:
        out = pd.to_numeric(col.astype(object).where(col.notna(), np.nan), errors="raise")
    except (ValueError, TypeError, OverflowError) as exc:
        raise DataError(f"non-numeric value ({exc})", where=where) from None
    return out.astype(np.float64)


def frames_from_runs(runs: list[Run]) -> RunFrames:
    """Pure: already-read runs -> RunFrames (no file access)."""
    rows, steps, evals, configs, warnings, found = [], [], [], {}, [], {}
    for run in runs:
        row = run_row(run)
        rows.append(row)
        if run.config:
            configs[row["config"]] = configuration(run.config)
        warnings.extend(run.warnings)
        for name, src, out in (("steps.jsonl", run.steps, steps), ("evals.jsonl", run.evals, evals)):
            df, w = clean_rows(src, str(run.dir / name), found)
            warnings.extend(w)
            if not df.empty:
                out.append(df.assign(run=row["run"]))
    # object dtype keeps ints as ints and None as None (no NaN-promotion of B or seed)
    runs_df = pd.DataFrame(rows, columns=list(RUN_COLUMNS), dtype=object)
    return RunFrames(
        runs=runs_df, steps=_concat(steps), evals=_concat(evals), configs=configs,
        warnings=tuple(warnings), non_numeric=found,
    )


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    if not frames:
        return pd.DataFrame({"run": pd.Series(dtype=object), "samples": pd.Series(dtype=float)})
    return pd.concat(frames, ignore_index=True, sort=False)


def load_runs(paths: list[str | Path]) -> RunFrames:
    """Read every run directory given, or found one or two levels below a sweep directory,
    into tidy frames. A missing path or a directory holding no run is a DataError."""
    if not paths:
        raise DataError("no run or sweep directories given")
    dirs: list[Path] = []
    seen: set[Path] = set()
    for p in paths:
        found = find_runs([p])
        if not found:
            raise DataError("no run directories (with steps.jsonl or evals.jsonl) found",
                            where=str(p))
        for d in found:
            key = d.resolve()
            if key not in seen:
                seen.add(key)
                dirs.append(d)
    return frames_from_runs([read_run(d) for d in dirs])
